"""The replays' workload: a named overlay on ``WorkloadSpec`` (dotted config overrides).

Every replay (``pearl simulate``, ``pearl experiments``, ``pearl calibrate``, the benchmarks) runs
the one ``paper`` workload, the one the emulator's constants in ``configs/emulator/`` were fitted
on (their files are per model and accelerator, not per workload). A run config's own ``workload``
section (the defaults in ``pearl/config.py``) is what ``pearl run`` and ``pearl serve`` use with
real engines and environments, and what a test that builds a config with ``load_config`` gets;
it is not a replay workload: next to constants fitted on another workload its replays measure
neither the paper nor the predictor (its predictor error was 8.3-12.3 % on replays of traces the
project does not ship), so the replay commands do not offer it.

``paper``   calibrated to the paper's *single-system* measurements for Qwen3-8B on SWE-bench (Sec.
            2.1 / 3.1), never to the systems' ranking: with an unlimited rollout pool a batch takes
            216.3 s (training 163.8 s), and more GPUs give diminishing returns. Qwen3 in thinking
            mode writes long turns (~1K tokens of reasoning + tool call), SWE-agent style prompts
            carry instructions, demonstrations and repository context (~12K tokens), tool calls
            (ls, grep, edit) return in ~1 s, and test runs are rarer (5 %, ~8 s). Measured in the
            emulator on fixed colocated pools (``pearl.sim.simulate.measure_makespan(cfg, n,
            "coloc", 2)``, Qwen3-8B on H200, no trainer): makespan 675 s on 4 GPUs, 307 s on 16,
            271 s on 24, 251 s on 32, 223 s on 64 (paper: ~216 s with an unlimited pool; 16 -> 24
            -> 32 GPUs: -10.3 %, -8.9 %; ours: -11.7 %, -7.5 %).

            Prefix reuse (``emulator.prefix_reuse`` 0.3), from the paper's Sec. 3.2
            token / time split of colocated rollout (Qwen3-30B-A3B): prefill processes 96.68 % of
            tokens in 26.48 % of the time. With an ideal per-conversation cache our workload would
            compute only 57.5 % of its tokens in prefill (and spend 3.7 % of the time there); the
            paper's split is only reachable with little reuse. Measured in the emulator
            (``EmulatedEngine.phase_split``, colocated Qwen3-30B-A3B, 8 workers, B = 64, one batch):
            reuse 0 -> 30.4 % of the time in prefill, 0.25 -> 27.4 %, 0.3 -> 26.6 %, 0.35 -> 25.7 %,
            0.5 -> 22.4 %, 1.0 -> 3.7 %; 0.3 is the value closest to 26.48 % (computed-token share
            94.1 %, hit ratio 28 %). The value stands for the cache misses of a real deployment
            that the emulator does not model one by one (LRU eviction of the conversation's leaf
            blocks while its trajectory waits on the environment next to 2 x B concurrent
            32K-token trajectories, chat-template re-rendering of earlier turns); routing stays
            conversation-sticky as in ROLL's ``EnvAffinityRouter``, and weight-update flushes are
            modelled explicitly on top. It was chosen from that single-system measurement only,
            before and independently of any comparison between systems; the predictor's prior
            (``workload.prefix_cache_hit``) is set to the same 0.3 and refit from telemetry.

            The means of the response, observation and tool-call lengths of ``paper`` can be set
            per model in ``configs/emulator/<model>-<hardware>.yaml`` (``workload``:
            ``WorkloadMeans``; ``python -m pearl calibrate`` fits them): ``load_preset_config``
            applies them over the preset, the distributions' other parameters unchanged.

Public names: ``PRESETS``, ``preset_overrides``, ``load_preset_config``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pearl.config import RunConfig, load_config
from pearl.engines.emulated_physics import WorkloadMeans, load_physics

PRESETS: dict[str, dict[str, Any]] = {
    "paper": {
        "workload.system_prompt_tokens": 12000,
        "workload.turns": {"mean": 30, "cv": 0.4, "min": 2, "max": 60},
        "workload.response_tokens": {"mean": 1000, "cv": 0.5, "min": 16, "max": 4096},
        "workload.observation_tokens": {"mean": 400, "cv": 1.0, "min": 20, "max": 6000},
        "workload.env_step_s": {"mean": 1.0, "cv": 1.0, "min": 0.1, "max": 60},
        "workload.test_run_prob": 0.05,
        "workload.test_run_s": {"mean": 8, "cv": 0.6, "min": 2, "max": 120},
        "workload.prefix_cache_hit": 0.85,
        "workload.shared_prompt_tokens": 2000,
        "workload.max_response_tokens": 32768,
    },
}


def preset_overrides(name: str) -> dict[str, Any]:
    try:
        return dict(PRESETS[name])
    except KeyError:
        raise ValueError(f"unknown workload preset {name!r}; known: {', '.join(PRESETS)}") from None


#: WorkloadMeans field -> the workload distribution it sets the mean of
_MEAN_FIELDS = {"response_tokens": "workload.response_tokens", "observation_tokens": "workload.observation_tokens",
                "env_step_s": "workload.env_step_s"}


def means_overrides(means: WorkloadMeans, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """Dotted overrides setting each given mean on the ``paper`` preset's distribution."""
    base = PRESETS["paper"] if base is None else base
    out: dict[str, Any] = {}
    for field, key in _MEAN_FIELDS.items():
        v = getattr(means, field)
        if v is not None:
            out[key] = {**base[key], "mean": float(v)}
    return out


def load_preset_config(config: str | Path, workload: str, overrides: dict[str, Any] | None = None,
                       means: WorkloadMeans | None = None) -> RunConfig:
    """``config`` under the workload preset, then the model's calibrated workload means (``paper``
    only; ``means`` replaces the file's), then ``overrides``."""
    ov = preset_overrides(workload)
    if workload == "paper":
        if means is None:
            plain = load_config(config)
            means = load_physics(plain.model.name, plain.hardware.name).workload
        ov.update(means_overrides(means))
    ov.update(overrides or {})
    return load_config(config, ov or None)
