"""The emulator's free constants for one model on one accelerator, named, bounded and sourced.

The emulated engine's per-iteration costs come from measured kernel tables
(``emulated_tables.py``, ``emulator.costs: database``) and its scheduling from SGLang's own rules
(``emulated_server.py``: the radix cache, admission, retraction; prefix reuse and the KV a request
holds come out of them); what neither can say - how much memory the engine takes, how fast the
GPU host's CPU runs SGLang's scheduler, what an eager layer's launches cost, the workload's means -
are the constants here. The datasheet roofline
(``emulated_costs.WorkerCosts``, ``emulator.costs: datasheet`` only) also reads the efficiency and
fixed-cost constants (``weight_read_efficiency``, ``kv_read_efficiency``, ``decode_step_s``,
``prefill_forward_s``, ``prefill_mfu``, ``moe_floor``, ``moe_exponent``), which the tables cover:
the shipped files leave them out. Each field is ``None`` by default, meaning "the
value the run config already gives" (``HardwareSpec`` for the efficiencies and step costs,
``EmulatorSpec.launch_per_layer_s``, the measured CPU, a plain touched-expert count for MoE), so a
file with every field ``None`` emulates exactly what the run config alone does.

A file per model and accelerator lives in ``configs/emulator/<model>-<hardware>.yaml``
(``physics_file``); ``python -m pearl calibrate`` (``pearl/sim/calibrate.py``) writes the fitted
values there with the residual of every target. The bounds (``ge`` / ``le``) are the ranges the
public measurements cited in each description allow; the fit never leaves them.

The MoE small-batch curve: a fused-MoE kernel reading the routed experts of ``n`` tokens costs
``t(n) / t(n_max) = floor + (1 - floor) * (touched(n) / E) ** exponent`` with ``touched(n) = E (1 -
(1 - k/E)^n)``. ``fit_moe_curve`` fits ``floor`` and ``exponent`` by least squares to a kernel
table; ``MOE_KERNEL_TABLES`` holds the public tables it is fitted to (never the paper).

Public names: ``EmulatorPhysics``, ``WorkloadMeans``, ``PhysicsFile``, ``MOE_KERNEL_TABLES``,
``fit_moe_curve``, ``moe_curve``, ``min_memory_utilization``, ``physics_file``, ``load_physics``,
``PhysicsError``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

if TYPE_CHECKING:
    from pearl.config import EmulatorSpec, HardwareSpec

#: ``configs/emulator/`` of this checkout
PHYSICS_DIR = Path(__file__).resolve().parents[2] / "configs" / "emulator"


class PhysicsError(ValueError):
    """A physics file that is missing, malformed or out of its bounds."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EmulatorPhysics(_Strict):
    """Free constants of the emulated engine for one model on one accelerator (``None``: the run
    config's value). Bounds are the public ranges named in each description."""

    weight_read_efficiency: float | None = Field(
        default=None, ge=0.55, le=0.92, description="fraction of peak HBM bandwidth a decode step reaches "
        "reading the weights (an assumed range around HardwareSpec.decode_bw_efficiency 0.7; memory-bound "
        "GEMV kernels do not exceed ~90 % of the datasheet bandwidth)")
    kv_read_efficiency: float | None = Field(
        default=None, ge=0.55, le=1.8, description="effective fraction of peak HBM bandwidth of the "
        "attention KV read, per bf16 KV byte: up to ~0.9 for a bf16 cache (assumed, as the weights'), up to "
        "2 x 0.9 for an fp8 cache (SGLang --kv-cache-dtype fp8_e4m3 / fp8_e5m2 stores half the bytes)")
    decode_step_s: float | None = Field(
        default=None, ge=0.001, le=0.012, description="fixed cost of one decode iteration, s: kernel "
        "launches under CUDA graphs, sampling and scheduling (assumed range around HardwareSpec."
        "step_overhead_s 4 ms)")
    prefill_forward_s: float | None = Field(
        default=None, ge=0.001, le=0.03, description="fixed cost of one prefill forward (a chunk), s: "
        "no CUDA graph, per-layer launches and the scheduler (assumed range; the run config uses the decode "
        "step's 4 ms)")
    prefill_mfu: float | None = Field(
        default=None, ge=0.30, le=0.70, description="model FLOP utilisation of long-prompt chunked "
        "prefill, of the measured 790 TFLOP/s (assumed range around HardwareSpec.prefill_mfu 0.45)")
    memory_utilization: float | None = Field(
        default=None, ge=0.80, le=0.95, description="fraction of device memory the engine takes for "
        "weights + KV pool (SGLang --mem-fraction-static: 'fraction of the free GPU memory used for static "
        "memory like model weights and KV cache', docs/backend/server_arguments.md; vLLM "
        "--gpu-memory-utilization, default 0.9); the lower bound per model is min_memory_utilization: the "
        "paper runs 5P3D at batch 64, so 3 decode workers hold B K_seq tokens (0.92 for Qwen3-30B-A3B)")
    host_cpu_factor: float | None = Field(
        default=None, ge=0.5, le=2.0, description="the GPU host's scheduler CPU seconds per iteration over "
        "those measured from SGLang 0.5.23's own scheduling code (configs/emulator/sglang-scheduler.yaml, "
        "benchmarks/bench_sglang_scheduler.py): 1.0 is the measured CPU; GPU servers' host CPUs (Xeon "
        "8480+/EPYC 9654 class) run single-threaded Python within about 2x of it either way")
    launch_per_layer_s: float | None = Field(
        default=None, ge=2e-5, le=3e-4, description="host time to launch one layer's kernels of an extend "
        "(prefill) batch, which runs without CUDA graphs (SGLang captures decode batches only): the "
        "batch cannot end before n_layers x this. Bounds: 10-20 kernels a layer at 2-15 us a launch "
        "(PyTorch eager launch overhead)")
    moe_floor: float | None = Field(
        default=None, ge=0.0, le=0.3, description="MoE kernel curve: share of the full routed-expert "
        "read a single token already costs (fit_moe_curve on MOE_KERNEL_TABLES)")
    moe_exponent: float | None = Field(
        default=None, ge=0.3, le=1.0, description="MoE kernel curve: exponent on the touched-expert "
        "share (1.0 with floor 0: the plain touched-expert count)")

    def value(self, name: str, default: float) -> float:
        v = getattr(self, name)
        return default if v is None else float(v)

    def resolved(self, hw: HardwareSpec, emu: EmulatorSpec) -> EmulatorPhysics:
        """Every constant set: a field left ``None`` takes the run config's value (the one place
        those defaults are written)."""
        defaults = {
            "weight_read_efficiency": hw.decode_bw_efficiency, "kv_read_efficiency": hw.decode_bw_efficiency,
            "decode_step_s": hw.step_overhead_s, "prefill_forward_s": hw.step_overhead_s,
            "prefill_mfu": hw.prefill_mfu, "memory_utilization": hw.memory_utilization,
            "host_cpu_factor": 1.0, "launch_per_layer_s": emu.launch_per_layer_s,
            "moe_floor": hw.moe_kernel_floor, "moe_exponent": 1.0,
        }
        return self.model_copy(update={k: self.value(k, v) for k, v in defaults.items()})


class WorkloadMeans(_Strict):
    """Means of the ``paper`` workload's distributions (``None``: the preset's value).

    Bounds: assumed ranges around the preset's 1000-token turns, 400-token observations and 1 s
    tool calls (the paper gives no trajectory statistics); the fit never leaves them."""

    response_tokens: float | None = Field(default=None, ge=300, le=2000)
    observation_tokens: float | None = Field(default=None, ge=100, le=2000)
    env_step_s: float | None = Field(default=None, ge=0.3, le=10.0)


class PhysicsFile(_Strict):
    """``configs/emulator/<model>-<hardware>.yaml``: the constants and the fit's record."""

    model: str
    hardware: str
    engine: EmulatorPhysics = EmulatorPhysics()
    workload: WorkloadMeans = WorkloadMeans()
    fit: dict[str, Any] = Field(default_factory=dict, description="what calibrate ran and every target's residual")


# ------------------------------------------------------------------------- MoE kernel curve
#: Public fused-MoE Triton kernel timings, (batch, microseconds): the kernel reading the routed
#: experts of one layer. E = 128 experts, k = 8 per token in both.
MOE_KERNEL_TABLES: dict[str, dict[str, Any]] = {
    "sglang#6825": {
        "what": "Qwen3-30B-A3B (E=128, N=768), bf16, A100-PCIe-40GB, default config "
                "(github.com/sgl-project/sglang/pull/6825)",
        "experts": 128, "k": 8,
        "table": [(1, 109.21), (2, 159.81), (4, 268.89), (8, 403.13), (16, 611.19), (24, 730.19),
                  (32, 808.53), (48, 885.97), (64, 917.45), (96, 943.14)],
    },
    "sglang#11730": {
        "what": "Qwen3-235B-A22B (E=128), fp8, H200 TP8, default config "
                "(github.com/sgl-project/sglang/pull/11730)",
        "experts": 128, "k": 8,
        "table": [(1, 31.70), (2, 36.56), (4, 49.67), (8, 66.87), (16, 92.36), (24, 117.38), (32, 124.99)],
    },
}


#: the table the shipped curve is fitted to: the H200 one (the emulated accelerator); #6825 has the
#: Qwen3-30B-A3B expert shape on an A100 (its fit: floor 0.055, exponent 0.995)
DEFAULT_MOE_TABLE = "sglang#11730"


def _share(n: float, experts: int, k: int) -> float:
    untouched: float = (1.0 - k / experts) ** n  # base in [0, 1): a real float (typeshed: Any)
    return 1.0 - untouched


def moe_curve(n: float, experts: int, k: int, floor: float, exponent: float) -> float:
    """floor + (1 - floor) (touched(n) / E) ** exponent: the routed-expert read of n tokens as a share
    of reading every expert."""
    share: float = _share(max(n, 0.0), experts, k) ** exponent
    return floor + (1.0 - floor) * share


def fit_moe_curve(tables: list[str] | None = None) -> tuple[float, float, float]:
    """Least-squares (floor, exponent) of ``moe_curve`` to the kernel tables (each normalised by its
    own largest batch, so the curve's ratios are fitted, not the absolute times). Grid over floor
    [0, 0.3] x exponent [0.3, 1] in steps of 0.005; returns (floor, exponent, rms of the relative
    error). Deterministic."""
    names = tables or [DEFAULT_MOE_TABLE]
    pts: list[tuple[float, float, int, int, float]] = []  # (n, t / t_max, E, k, n_max)
    for nm in names:
        t = MOE_KERNEL_TABLES[nm]
        tab = t["table"]
        n_max, t_max = tab[-1]
        pts += [(n, us / t_max, t["experts"], t["k"], n_max) for n, us in tab]
    best = (math.inf, 0.0, 1.0)
    for i in range(61):
        f = 0.005 * i
        for j in range(141):
            g = 0.3 + 0.005 * j
            err = 0.0
            for n, y, e, k, n_max in pts:
                pred = moe_curve(n, e, k, f, g) / moe_curve(n_max, e, k, f, g)
                err += ((pred - y) / y) ** 2
            if err < best[0]:
                best = (err, f, g)
    return round(best[1], 3), round(best[2], 3), math.sqrt(best[0] / len(pts))


# ------------------------------------------------------------------------- memory bound
def min_memory_utilization(weight_bytes: float, kv_bytes_per_token: float, memory_gb: float,
                           batch: int, k_seq: int, n_decode: int, tp: int = 1) -> float:
    """The least memory utilisation u with ``B K_seq <= N_D H_max``, ``H_max = (tp memory u -
    W) / kv``: the paper's feasibility of a split (Sec. 4.2), e.g. 5P3D at batch 64 (Sec. 3.3)."""
    need = batch * k_seq / n_decode * kv_bytes_per_token + weight_bytes
    return need / (tp * memory_gb * 1e9)


# ------------------------------------------------------------------------- files
def physics_file(model: str, hardware: str, folder: Path | None = None) -> Path:
    return (folder or PHYSICS_DIR) / f"{model}-{hardware}.yaml"


def load_physics(model: str, hardware: str, folder: Path | None = None) -> PhysicsFile:
    """The physics file of ``model`` on ``hardware``; an absent file is every field ``None``."""
    p = physics_file(model, hardware, folder)
    if not p.is_file():
        return PhysicsFile(model=model, hardware=hardware)
    try:
        data = yaml.safe_load(p.read_text())
        pf = PhysicsFile.model_validate(data)
    except (yaml.YAMLError, ValidationError) as e:
        raise PhysicsError(f"{p}: {e}") from None
    if (pf.model, pf.hardware) != (model, hardware):
        raise PhysicsError(f"{p} names {pf.model}/{pf.hardware}, expected {model}/{hardware}")
    return pf
