"""The colocated makespan: ``N`` workers, each prefilling and decoding its own trajectories.

Routing keeps a trajectory on its worker (prefix-cache affinity) and admission starts balanced,
``m0 = B / N`` per worker. The survivors at turn group ``s`` (``B_s`` of ``B``) are a uniformly
random subset, so a surviving trajectory shares its worker with (size-biased, hypergeometric)::

    m = max(1 + (m0 - 1) (B_s - 1) / (B - 1), 1)      trajectories (= m0 while all are alive)

At most ``n_hi = min(m, m_cap)`` of them run at once, ``m_cap = max(H_max / K_seq, 1)``
(``stages.kv_slots``: a running request holds its KV until its turn ends; the others wait for
room): the decode concurrency ``n`` is capped at ``n_hi`` and the worker's busy time decodes its
``m`` trajectories in ``m / n_hi`` batches of ``n_hi``.

Per group, with ``P = P_s`` (``Stages.prefill``), ``L = x + c + o / 2`` and the unknowns ``n``
(the worker's decode concurrency) and ``C`` (the cycle), a fixed point (solved as below)::

    u     = min(m P / C, U_CAP_COLOCATED)            prefill share of the worker's time
    n_s   = 1 + (m - 1) n / m                        the decode batch a decoding trajectory sees
    D     = o tau(n_s, L) / (1 - u (m - 1) / m)      decode, stalled by the other m - 1 trajectories'
                                                     prefills (its own precedes it)
    W     = u P / (2 (1 - u))                        wait for other prefills (M/D/1)
    C_lat = W + P + D + e                            one trajectory's own turn
    C_cap = m P + (m / n_hi) o tau(n_hi, L)          the worker's busy time per turn of all m
    C     = max(C_lat, C_cap)
    n     = clip(m D / C, 1, n_hi)                   Little's law

``n_s`` and not ``n`` in the decode step: a decoding trajectory sees itself and each of the other
``m - 1``, decoding with probability ``n / m`` (the inspection paradox).

The iteration: each round evaluates the equations at ``(n, C)``, from ``n = n_hi`` and ``C = P + o
tau(n_hi, L) + e``, giving ``g = clip(m D / C', 1, n_hi)`` and ``C' = max(C_lat, C_cap)``, and steps::

    n <- clip(n + (g - n) / (1 - s), 1, n_hi) secant: s = (g - g_prev) / (n - n_prev) in [-50, 0.95]
                                             (s = 0 in the first round)
    C <- C + (C' - C) / (1 + lambda)         Newton: lambda = -dC_lat/dC = (u / C) (P / (2 (1 - u)^2)
                                             + D ((m - 1) / m) / (1 - u (m - 1) / m)) where u is below
                                             its cap and C_lat binds, else 0

until every step is within ``stages.TOLERANCE`` of its unknown, a group that is there held from
then on (``stages.ROUNDS`` rounds at most; ``ColocResult.converged`` says which pools got there;
checked against a bisection in ``tests/core/test_fixed_point.py``). The plain map (``n`` halfway
to ``g``, ``C <- C'``) can circle at the kink of ``max(C_lat, C_cap)`` on a few workers.

Batch start: the first turn waits for the prefills queued ahead of it on its worker::

    W_start = max(m0 - 1, 0) P_1 / 2

The makespan (``Stages.path`` for the weights ``w_s`` and the factor)::

    M = rho(m0) (sum_s w_s C_s + W_start)       (measured tail: w_s = sum_{k in s} S(k))
    M = sum_s w_s C_s + W_start                  (prior: w_s = sum_{k in s} R_k)

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
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pearl.core.hardware import HardwareProfile, decode_memory_bound, memory_fixed
from pearl.core.stages import F64, ROUNDS, TOLERANCE, distance, kv_slots, secant_step, stages
from pearl.core.telemetry import Mode
from pearl.core.workload import WorkloadProfile

U_CAP_COLOCATED = 0.95
#: ``colocated_makespan_idle_bound`` checks every whole pool up to this size (then a geometric grid)
IDLE_BOUND_EXACT = 64.0


@dataclass(frozen=True, slots=True)
class ColocResult:
    """Per pool (shape (M,)): the predicted makespan, and whether every group's fixed point is
    within ``stages.TOLERANCE`` (module docstring, "The iteration")."""

    makespan_s: F64
    converged: npt.NDArray[np.bool_]


def colocated_makespan(hw: HardwareProfile, wl: WorkloadProfile, batch: int, n_workers: F64) -> F64:
    """Predicted makespan (s) for colocation on each entry of ``n_workers`` (shape (M,)); applies
    the colocated view of ``wl`` (module docstring)."""
    return colocated_evaluation(hw, wl, batch, n_workers).makespan_s


def colocated_evaluation(hw: HardwareProfile, wl: WorkloadProfile, batch: int, n_workers: F64,
                         rounds: int = ROUNDS) -> ColocResult:
    """``colocated_makespan`` with each pool's convergence; ``rounds``: the fixed point's cap."""
    t = _terms(hw, wl, batch)
    nw = n_workers.reshape(-1, 1).astype(np.float64)
    m0 = np.maximum(batch / nw, 1.0)
    m = np.maximum(1.0 + (m0 - 1.0) * t.alive_less_one, 1.0)
    n_hi = np.minimum(m, t.m_cap)  # the concurrency the worker's KV memory holds
    shape = m.shape
    p, o, half_p, p_e = (np.broadcast_to(a, shape) for a in (t.p, t.o, t.half_p, t.p_e))
    both = np.empty((2, *shape))  # (n, 1 + (m - 1) n / m): n_s's buffer, n beside it
    n, n_s = both[0], both[1]
    n[...] = n_hi
    tau_m = t.tau(n)
    c_cyc = p + o * tau_m + t.e  # n = n_hi: every trajectory that fits decoding
    m_p = m * p
    c_cap = m_p + o * tau_m * (m / n_hi)
    others = (m - 1.0) / m  # the share of a worker's m trajectories that are not this one
    one = np.ones(shape)
    done = np.zeros(shape, dtype=bool)  # within TOLERANCE: held from then on
    n_prev: F64 | None = None
    g_prev: F64 | None = None
    for _ in range(rounds):
        u = np.minimum(m_p / c_cyc, U_CAP_COLOCATED)
        stall = one / (one - u * others)
        queue = one / (one - u)
        np.multiply(others, n, out=n_s)
        np.add(n_s, one, out=n_s)
        d = o * t.tau(n_s) * stall  # at the batch a decoding trajectory sees
        c_lat = u * half_p * queue + d + p_e
        c_new = np.maximum(c_lat, c_cap)
        g = np.minimum(np.maximum(m * d / c_new, one), n_hi)
        # Newton on C - max(C_lat(C), C_cap): dC_lat/dC = -(u / C) (P / (2 (1 - u)^2) + D (m - 1) / (m
        # (1 - u (m - 1) / m))) where u is below its cap and C_lat binds
        lean = (u / c_cyc) * (half_p * queue * queue + d * others * stall)
        np.putmask(lean, (u >= U_CAP_COLOCATED) | (c_lat <= c_cap), 0.0)
        step_c = (c_new - c_cyc) / (one + lean)
        step_n = secant_step(n, g, n_prev, g_prev)
        done |= distance(step_n, n, step_c, c_new) <= TOLERANCE
        if np.count_nonzero(done) == done.size:
            break
        np.putmask(step_c, done, 0.0)
        np.putmask(step_n, done, 0.0)
        c_cyc = c_cyc + step_c
        n_prev, g_prev = n.copy(), g
        n += step_n
        np.minimum(np.maximum(n, one, out=n), n_hi, out=n)
    rho = wl.tail_factor_at(batch / nw[:, 0]) if t.surv else None
    factor: F64 | float = np.maximum(rho, 1.0) if rho is not None else t.rho0
    start = np.maximum(m0[:, 0] - 1.0, 0.0) * t.half_first_prefill
    total: F64 = factor * ((t.weights * c_new).sum(axis=1) + start)
    converged = np.asarray(done.all(axis=1), dtype=np.bool_)
    return ColocResult(total, converged)


@dataclass(frozen=True, slots=True)
class _Terms:
    """What the colocated evaluation reads that does not depend on the pool, per group (shape (1,
    S)): ``(B_s - 1) / (B - 1)``, ``P``, ``o``, ``e``, ``P / 2``, ``P + e``, the decode step ``tau(.,
    L)``, the path weights and factor (``Stages.path``), ``P_1 / 2``, ``m_cap``."""

    alive_less_one: F64
    p: F64
    o: F64
    e: F64
    half_p: F64
    p_e: F64
    tau: Callable[[F64], F64]
    weights: F64
    rho0: float
    surv: bool
    half_first_prefill: float
    m_cap: float


@functools.lru_cache(maxsize=64)
def _terms(hw: HardwareProfile, wl: WorkloadProfile, batch: int) -> _Terms:
    """``_Terms`` of the colocated view (cached per profiles and batch: the decision evaluates the
    same pool many times between two refits)."""
    st = stages(wl, Mode.COLOCATED)
    p = st.prefill(hw)
    ctx = st.x + st.c + st.o / 2.0
    weights, rho0 = st.path(wl, batch)
    out = _Terms((batch * st.alive - 1.0) / max(batch - 1.0, 1.0), p, st.o, st.e, p / 2.0, p + st.e,
                 _decode_step(hw, hw.decode_slopes(ctx), ctx, _memory_bound(hw, wl, batch)), weights, rho0,
                 bool(st.surv), st.first_prefill(hw) / 2.0, kv_slots(hw, wl))
    for a in (out.alive_less_one, out.p, out.o, out.e, out.half_p, out.p_e, out.weights):
        a.setflags(write=False)
    return out


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
    return colocated_idle_bound_evaluation(hw, wl, batch, n_workers).makespan_s


def colocated_idle_bound_evaluation(hw: HardwareProfile, wl: WorkloadProfile, batch: int, n_workers: F64
                                    ) -> ColocResult:
    """``colocated_makespan_idle_bound`` with the convergence of each pool's own fixed point."""
    n = np.maximum(np.asarray(n_workers, dtype=np.float64).reshape(-1), 1.0)
    grid, best = _idle_bound_curve(hw, wl, batch, 1 << max(math.ceil(math.log2(float(n.max()))), 0))
    idx = np.searchsorted(grid, n, side="right") - 1  # grid[0] = 1 <= n
    own = colocated_evaluation(hw, wl, batch, n)
    return ColocResult(np.minimum(best[idx], own.makespan_s), own.converged)


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
