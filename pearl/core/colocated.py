"""The colocated makespan: ``N`` workers, each prefilling and decoding its own trajectories.

Routing keeps a trajectory on its worker (prefix-cache affinity) and admission starts balanced,
``m0 = B / N`` per worker. The survivors at turn group ``s`` (``B_s`` of ``B``) are a uniformly
random subset, so a surviving trajectory shares its worker with (size-biased, hypergeometric)::

    m = max(1 + (m0 - 1) (B_s - 1) / (B - 1), 1)      trajectories (= m0 while all are alive)

At most ``m_cap = max(H_max / K_seq, 1)`` fit in a worker's KV memory; beyond it the rest wait:
``waves = max(m / m_cap, 1)`` scales the cycle and ``m`` is capped at ``m_cap``.

Per group, with ``P = P_s`` (``Stages.prefill``), ``L = x + c + o / 2`` and the unknowns ``n``
(the worker's decode concurrency) and ``C`` (the cycle), found by damped fixed-point iteration
(``stages.ITERATIONS`` rounds at most, ``n`` halfway to its new value each round)::

    u     = min(m P / C, U_CAP_COLOCATED)            prefill share of the worker's time
    n_s   = 1 + (m - 1) n / m                        the decode batch a decoding trajectory sees
    D     = o tau(n_s, L) / (1 - u (m - 1) / m)      decode, stalled by the other m - 1 trajectories'
                                                     prefills (its own precedes it)
    W     = u P / (2 (1 - u))                        wait for other prefills (M/D/1)
    C_lat = W + P + D + e                            one trajectory's own turn
    C_cap = m P + o tau(m, L)                        the worker's busy time per turn of all m
    C     = max(C_lat, C_cap)
    n     = clip(m D / C, 1, m)                      Little's law

``n_s`` and not ``n`` in the decode step: a decoding trajectory sees itself and each of the other
``m - 1``, decoding with probability ``n / m`` (the inspection paradox). Batch start: the first
turn waits for the prefills queued ahead of it on its worker::

    W_start = max(m0 - 1, 0) P_1 / 2

The makespan (``Stages.path`` for the weights ``w_s`` and the factor)::

    M = rho(m0) (sum_s w_s C_s waves_s + W_start)       (measured tail: w_s = sum_{k in s} S(k))
    M = sum_s w_s C_s waves_s + W_start                  (prior: w_s = sum_{k in s} R_k)

with ``rho(m0)`` the tail factor at the candidate pool's load (``WorkloadProfile.tail_factor_at``;
``W_start`` is inside the bracket, so it is scaled by ``rho`` too). Measure with ``make
predictor-check`` (``coloc predicted / measured``).

Modelling choices: M/D/1 for the colocated prefill wait (prefill chunks are near-deterministic),
``U_CAP_COLOCATED`` = 0.95.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np

from pearl.core.hardware import HardwareProfile, decode_memory_bound, memory_fixed
from pearl.core.stages import F64, ITERATIONS, converged, stages
from pearl.core.telemetry import Mode
from pearl.core.workload import WorkloadProfile

U_CAP_COLOCATED = 0.95
#: ``colocated_makespan_idle_bound`` checks every whole pool up to this size (then a geometric grid)
IDLE_BOUND_EXACT = 64.0


def colocated_makespan(hw: HardwareProfile, wl: WorkloadProfile, batch: int, n_workers: F64) -> F64:
    """Predicted makespan (s) for colocation on each entry of ``n_workers`` (shape (M,)); applies
    the colocated view of ``wl`` (module docstring)."""
    st = stages(wl, Mode.COLOCATED)
    nw = n_workers.reshape(-1, 1).astype(np.float64)
    bk = batch * st.alive
    m0 = np.maximum(batch / nw, 1.0)
    m = np.maximum(1.0 + (m0 - 1.0) * (bk - 1.0) / max(batch - 1.0, 1.0), 1.0)
    m_cap = max(hw.kv_capacity_tokens / max(wl.k_seq, 1.0), 1.0)
    waves = np.maximum(m / m_cap, 1.0)
    m = np.minimum(m, m_cap)
    p = st.prefill(hw)
    ctx = st.x + st.c + st.o / 2.0
    slopes = hw.decode_slopes(ctx)
    tau_at = _decode_step(hw, slopes, ctx, _memory_bound(hw, wl, batch))
    n = m.copy()
    c_cyc = p + st.o * tau_at(n) + st.e
    m_p = m * p
    c_cap = m_p + st.o * tau_at(m)
    others = (m - 1.0) / m  # the share of a worker's m trajectories that are not this one
    half_p, p_e = p / 2.0, p + st.e
    for rnd in range(ITERATIONS):
        tau = tau_at(1.0 + others * n)  # the batch a decoding trajectory sees
        u = np.minimum(m_p / c_cyc, U_CAP_COLOCATED)
        d = st.o * tau / (1.0 - u * others)
        w = u * half_p / (1.0 - u)
        c_lat = w + d + p_e
        prev, c_cyc = c_cyc, np.maximum(c_lat, c_cap)
        n = 0.5 * (n + np.minimum(np.maximum(m * d / c_cyc, 1.0), m))  # halfway to the clip to [1, m]
        if rnd > 0 and converged(prev, c_cyc):
            break
    weights, rho0 = st.path(wl, batch)
    rho = wl.tail_factor_at(batch / nw[:, 0]) if st.surv else None
    factor: F64 | float = np.maximum(rho, 1.0) if rho is not None else rho0
    start = np.maximum(m0[:, 0] - 1.0, 0.0) * st.first_prefill(hw) / 2.0
    total: F64 = factor * ((weights * c_cyc * waves).sum(axis=1) + start)
    return total


def _decode_step(hw: HardwareProfile, slopes: tuple[F64, F64], ctx: F64, memory: bool) -> Callable[[F64], F64]:
    """``tau(n, L)`` at the stages' contexts: on the memory branch ``b0 + b_e f_E(n) + b2 n L``
    where it holds for every batch the fixed point can reach (``memory``), else the roofline."""
    if not memory:
        def roofline(nn: F64) -> F64:
            out: F64 = hw.decode_step_s(nn, ctx, slopes)
            return out
        return roofline
    fixed, kv = memory_fixed(hw), slopes[0]

    def memory_branch(nn: F64) -> F64:
        out: F64 = fixed(nn) + nn * kv
        return out
    return memory_branch


@functools.lru_cache(maxsize=64)
def _memory_bound(hw: HardwareProfile, wl: WorkloadProfile, batch: int) -> bool:
    """Whether ``tau(n, L)`` is on the memory branch for every ``1 <= n <= B`` at every colocated
    stage's context (``decode_memory_bound``)."""
    st = stages(wl, Mode.COLOCATED)
    return decode_memory_bound(hw, (st.x + st.c + st.o / 2.0).reshape(-1), float(batch))


def colocated_makespan_idle_bound(hw: HardwareProfile, wl: WorkloadProfile, batch: int, n_workers: F64) -> F64:
    """``colocated_makespan`` bounded by every smaller pool's: a colocated pool may leave workers
    idle, so ``M*(N) = min_{1 <= n <= N} M(n)`` (over every whole pool up to ``IDLE_BOUND_EXACT``
    workers, 16 pools per octave above, and ``N`` itself: exact below 64 workers). With the tail
    factor read at each pool's load a bigger pool can have a larger ``rho``, and where the mean
    trajectory has flattened out ``rho(B/N) T_mean(N)`` could rise with ``N``. Needed only when
    ``wl.tail_varies_with_load`` (else the curve decreases by itself). The grid's running minimum
    is cached per profiles and pool size."""
    n = np.maximum(np.asarray(n_workers, dtype=np.float64).reshape(-1), 1.0)
    grid, best = _idle_bound_curve(hw, wl, batch, 1 << max(math.ceil(math.log2(float(n.max()))), 0))
    idx = np.searchsorted(grid, n, side="right") - 1  # grid[0] = 1 <= n
    out: F64 = np.minimum(best[idx], colocated_makespan(hw, wl, batch, n))
    return out


@functools.lru_cache(maxsize=32)
def _idle_bound_curve(hw: HardwareProfile, wl: WorkloadProfile, batch: int, top: int) -> tuple[F64, F64]:
    """(grid of pools 1..top, running minimum of the colocated makespan over it)."""
    ints = np.arange(1.0, min(float(top), IDLE_BOUND_EXACT) + 1.0)
    octaves = math.log2(max(top / IDLE_BOUND_EXACT, 1.0))
    geo = IDLE_BOUND_EXACT * 2.0 ** np.linspace(0.0, octaves, int(16 * octaves) + 1) if octaves > 0 else ints[:0]
    grid = np.unique(np.concatenate([ints, geo]))
    best = np.minimum.accumulate(colocated_makespan(hw, wl, batch, grid))
    grid.setflags(write=False)
    best.setflags(write=False)
    return grid, best
