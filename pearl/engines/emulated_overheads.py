"""The engine's own time per iteration, beyond the kernels the cost tables price.

A serving engine's iteration is its kernels plus what runs around them on the host. The kernel
tables (``emulated_tables``: NVIDIA's measured kernels, summed) hold none of it. Symbols: ``n``
requests in a decode batch, ``m`` requests and ``X`` new tokens in an extend (prefill) batch,
``D`` / ``K`` the batch's kernel time from the tables, ``L`` the model's layers::

    decode step   t = max(D', f c_dec(n))         under the overlap scheduler (default)
                  t = D' + f c_dec(n)             without it
                  D' = D, or max(D, L l_launch) for n > cuda_graph_max_bs (eager)
    extend batch  t = max(K', f c_ext(m, T))      under the overlap scheduler
                  t = K' + f c_ext(m, T)          without it
                  K' = max(K, L l_launch)          (extend batches run eagerly)
    host copy     t = tokens x kv_bytes / host_gbs  (a PD decode worker's retraction / resume)

* ``c_dec(n) = a_dec + b_dec n`` and ``c_ext(m, T) = a_ext + b_ext m + c_ext T`` (``T``: the
  prompt tokens of the batch's requests up to its chunk, which the radix tree walks to match and
  insert them) are the scheduler's CPU seconds per iteration, measured from SGLang 0.5.23's own
  code (``benchmarks/bench_sglang_scheduler.py``, ``configs/emulator/sglang-scheduler.yaml``:
  result processing and finish checks per request, the radix cache's match and insert per prompt
  token) and scaled by ``f = EmulatorPhysics.host_cpu_factor`` (the GPU host's CPU relative to
  the one measured). SGLang's default overlap scheduler (``event_loop_overlap``) prepares batch
  i + 1 and processes batch i - 1's results on the CPU while the GPU runs batch i, so an
  iteration takes the longer of the two.
* Extend batches run without CUDA graphs (only decode batches up to ``cuda_graph_max_bs`` are
  captured), so each of the ``L`` layers' kernels is launched from Python: the GPU cannot finish
  before the last launch, ``L l_launch`` (``EmulatorPhysics.launch_per_layer_s``, bounded by
  public figures in its description).

Public names: ``Overheads``, ``FlooredSpan``, ``SchedulerTimes``, ``engine_overheads``,
``load_scheduler_times``.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import yaml

if TYPE_CHECKING:
    from pearl.config import EmulatorSpec, HardwareSpec, ModelSpec
    from pearl.engines.emulated_physics import EmulatorPhysics

log = logging.getLogger(__name__)


class Span(Protocol):
    """A decode span's cost: ``total(k)`` seconds for ``k`` iterations, ``within`` its inverse."""

    def total(self, k: int) -> float: ...

    def within(self, elapsed: float, k_max: int) -> int: ...


class FlooredSpan:
    """``sum_{j<k} (max(D_j, f) + e)`` over a base span of non-decreasing steps ``D_j``: the first
    ``j*`` steps (``D_j < f``) cost ``f``, the rest ``D_j``; ``e`` is added to every step."""

    __slots__ = ("_base", "_e", "_f", "_j", "_s_j")

    def __init__(self, base: Span, floor: float, extra: float, k_max: int) -> None:
        self._base, self._f, self._e = base, floor, extra
        # j*: the first step whose own cost reaches the floor (bisection on D_j = S(j + 1) - S(j))
        lo, hi = 0, k_max
        if floor <= 0.0 or base.total(1) >= floor:
            hi = 0
        while lo < hi:
            mid = (lo + hi) // 2
            if base.total(mid + 1) - base.total(mid) >= floor:
                hi = mid
            else:
                lo = mid + 1
        self._j = lo
        self._s_j = base.total(lo)

    def total(self, k: int) -> float:
        if k <= 0:
            return 0.0
        if k <= self._j:
            return k * (self._f + self._e)
        return self._j * self._f + self._base.total(k) - self._s_j + k * self._e

    def within(self, elapsed: float, k_max: int) -> int:
        """The largest k <= k_max with total(k) <= elapsed."""
        budget = elapsed * (1 + 1e-12) + 1e-12
        step0 = self._f + self._e
        if step0 > 0 and budget <= self._j * step0:
            return min(int(budget / step0), k_max)
        lo, hi = min(self._j, k_max), k_max
        while lo < hi:  # total is increasing in k
            mid = (lo + hi + 1) // 2
            if self.total(mid) <= budget:
                lo = mid
            else:
                hi = mid - 1
        return lo


@dataclass(frozen=True)
class SchedulerTimes:
    """Per-iteration scheduler CPU seconds (module docstring), at the measured CPU's speed."""

    a_dec: float = 0.0
    b_dec: float = 0.0
    a_ext: float = 0.0
    b_ext: float = 0.0
    c_ext: float = 0.0

    def decode(self, n: int) -> float:
        return self.a_dec + self.b_dec * n

    def extend(self, m: int, tokens: int) -> float:
        """``m`` requests whose prompts hold ``tokens`` tokens up to this chunk."""
        return self.a_ext + self.b_ext * m + self.c_ext * tokens


@dataclass(frozen=True)
class Overheads:
    """The engine's time around the kernels of one worker (module docstring)."""

    sched: SchedulerTimes = SchedulerTimes()
    cpu_factor: float = 1.0
    overlap: bool = True
    layers: int = 0
    launch_per_layer_s: float = 0.0
    cuda_graph_max_bs: int = 256
    kv_bytes: float = 0.0
    host_gbs: float = 50.0

    @property
    def active(self) -> bool:
        return self.cpu_factor > 0 and (self.sched != SchedulerTimes() or self.launch_per_layer_s > 0)

    def extend_s(self, m: int, tokens: int, kernels: float) -> float:
        """Seconds an extend batch of ``m`` requests (``tokens``: their prompts up to this chunk)
        takes beyond its ``kernels``."""
        gpu = max(kernels, self.layers * self.launch_per_layer_s)
        cpu = self.cpu_factor * self.sched.extend(m, tokens)
        return max((max(gpu, cpu) if self.overlap else gpu + cpu) - kernels, 0.0)

    def decode_span(self, base: Span, n: int, k_max: int) -> Span:
        """``base`` (kernels only) with the decode step's floor and extra (module docstring)."""
        if not self.active:
            return base
        cpu = self.cpu_factor * self.sched.decode(n)
        floor = self.layers * self.launch_per_layer_s if n > self.cuda_graph_max_bs else 0.0
        if self.overlap:
            floor, extra = max(floor, cpu), 0.0
        else:
            extra = cpu
        if floor <= 0.0 and extra <= 0.0:
            return base
        return FlooredSpan(base, floor, extra, k_max)

    def host_copy_s(self, tokens: int) -> float:
        """KV of ``tokens`` tokens between device and host memory."""
        return tokens * self.kv_bytes / (self.host_gbs * 1e9) if self.host_gbs > 0 else 0.0

    @staticmethod
    def none(kv_bytes: float = 0.0) -> Overheads:
        """No time beyond the kernels (the host copies still take theirs)."""
        return Overheads(kv_bytes=kv_bytes, cpu_factor=0.0)


#: the scheduler CPU times measured from SGLang's own code (``benchmarks/bench_sglang_scheduler.py``)
SCHEDULER_FILE = Path(__file__).resolve().parents[2] / "configs" / "emulator" / "sglang-scheduler.yaml"


@functools.cache
def load_scheduler_times(path: Path = SCHEDULER_FILE) -> SchedulerTimes:
    """The fitted coefficients of ``path`` (``fit: {decode: {a, b}, extend: {a, b, c}}``, seconds);
    a missing file is no scheduler time, said in a WARNING."""
    if not path.is_file():
        log.warning("no measured scheduler times at %s: the emulator charges none (run "
                    "benchmarks/bench_sglang_scheduler.py)", path)
        return SchedulerTimes()
    fit = (yaml.safe_load(path.read_text()) or {}).get("fit", {})
    try:
        d, e = fit["decode"], fit["extend"]
        return SchedulerTimes(a_dec=float(d["a"]), b_dec=float(d["b"]), a_ext=float(e["a"]), b_ext=float(e["b"]),
                              c_ext=float(e["c"]))
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{path}: 'fit' needs decode.a, decode.b, extend.a, extend.b, extend.c ({err})") from None


def engine_overheads(model: ModelSpec, hw: HardwareSpec, emu: EmulatorSpec, physics: EmulatorPhysics | None,
                     tp: int = 1) -> Overheads:
    """The overheads of ``model`` on ``hw`` under ``emu`` and the physics file: the measured
    scheduler times, the launch cost, the overlap and CUDA-graph settings. The datasheet cost
    model carries its own fixed step costs, so it gets only the host copies."""
    if emu.costs != "database":
        return Overheads.none(float(model.kv_bytes_per_token))
    from pearl.engines.emulated_physics import EmulatorPhysics

    ph = (physics or EmulatorPhysics()).resolved(hw, emu)
    return Overheads(sched=load_scheduler_times(), cpu_factor=ph.value("host_cpu_factor", 1.0),
                     overlap=emu.overlap_schedule, layers=model.n_layers,
                     launch_per_layer_s=ph.value("launch_per_layer_s", emu.launch_per_layer_s),
                     cuda_graph_max_bs=emu.cuda_graph_max_bs, kv_bytes=float(model.kv_bytes_per_token),
                     host_gbs=emu.host_link_gbs)
