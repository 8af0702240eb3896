"""Turn groups: a mode's view of the workload profile compressed for the makespan models.

``stages(wl, mode)`` applies the mode's view (``workload.colocated_tokens`` or
``workload.prefill_pool_tokens``) and compresses the ``K`` turns into at most ``STAGES``
consecutive groups, so that every candidate allocation is evaluated at once with numpy (arrays of
shape candidates x groups). Group ``s`` holds ``T_s`` turns; its per-turn values are the
survival-weighted means over its turns::

    B_s / B = sum_{k in s} S(k) / T_s,    y_s = sum_{k in s} S(k) y_k / sum_{k in s} S(k)
    (y = x, c, o, e, and q where the view carries it)

The makespan sums a per-group cycle ``C_s`` over the groups with one of two weightings
(``Stages.path``)::

    reach (prior, no tail factor yet):   M = sum_s (sum_{k in s} R_k) C_s,   R_k = 1 - (1 - S(k))^B
    mean path x rho (measured):          M = rho sum_s (sum_{k in s} S(k)) C_s

``sum_k R_k`` is the expected turn count of the batch's longest trajectory; ``sum_k S(k)`` that of
the mean one. Results are cached per (profile, mode, groups): the profile is frozen and hashes
once (``WorkloadProfile``).

Both modes' fixed points (``colocated``, ``disaggregated``) solve, per candidate and group, for the
decode concurrency ``n`` by the secant method on ``r(n) = g(n) - n`` (``g``: the model's ``clip(m D
/ C, 1, m)``; ``secant_step``) and for their second unknown by Newton's method, every candidate in
one array and all of them in the same round. They stop once every unknown's step, which estimates
its distance to the fixed point, is within ``TOLERANCE`` of it (relative; the prefill wait relative
to the cycle), after ``ROUNDS`` rounds at most; a group that is there is held from then on (its
answer does not depend on the candidates evaluated with it), and a candidate with a group still
farther at the end is reported not converged (``DisaggResult.converged``,
``ColocResult.converged``). Against the exact fixed points the states are within 2e-5
(``tests/core/test_fixed_point.py``).
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pearl.core.hardware import HardwareProfile
from pearl.core.telemetry import Mode
from pearl.core.workload import (
    TailArrays,
    TurnTokens,
    WorkloadProfile,
    colocated_tokens,
    prefill_pool_tokens,
    prefill_pool_windows,
    tail_arrays,
)

STAGES = 8
#: the fixed points' stopping rule: every unknown within this distance (relative) of its fixed point
TOLERANCE = 1e-5
#: rounds of the fixed points at most; past them a candidate not yet within ``TOLERANCE`` is flagged
ROUNDS = 40
#: the secant's slope of ``g`` is held in ``[SLOPE_MIN, SLOPE_MAX]``: one step is at most ``1 / (1 -
#: SLOPE_MAX)`` = 20 plain steps, and a steeply falling ``g`` is followed at ``1 / (1 - SLOPE_MIN)``
SLOPE_MIN, SLOPE_MAX = -50.0, 0.95

F64 = npt.NDArray[np.float64]


def secant_step(x: F64, g: F64, x_prev: F64 | None, g_prev: F64 | None) -> F64:
    """The secant method's step on ``r(x) = g(x) - x`` from the last two points::

        step = r(x) / (1 - s),   s = (g(x) - g(x_prev)) / (x - x_prev)  in [SLOPE_MIN, SLOPE_MAX]

    (``s`` estimates ``g'``); ``s = 0``, the plain fixed-point step ``g(x) - x``, on the first round
    and where ``x`` did not move."""
    r: F64 = g - x
    if x_prev is None or g_prev is None:
        return r
    dx = x - x_prev
    s = (g - g_prev) / np.where(dx != 0.0, dx, np.inf)
    out: F64 = r / (1.0 - np.minimum(np.maximum(s, SLOPE_MIN), SLOPE_MAX))
    return out


def distance(step_a: F64, scale_a: F64, step_b: F64, scale_b: F64) -> F64:
    """``max(|step_a| / scale_a, |step_b| / scale_b)``: the relative distance of a fixed point's two
    unknowns from it, estimated by their Newton or secant steps (NaN stays NaN: never within
    ``TOLERANCE``)."""
    out: F64 = np.maximum(np.abs(step_a) / scale_a, np.abs(step_b) / scale_b)
    return out


@dataclass(frozen=True, slots=True)
class Stages:
    """Turn groups of one mode's view: ``turns[s]`` turns whose per-turn means are the other
    arrays (shape (1, S)); ``surv[s]`` the survival S(k) of each turn of group s."""

    turns: F64
    alive: F64
    x: F64
    c: F64
    o: F64
    e: F64
    surv: tuple[tuple[float, ...], ...]
    #: the group's mean bilinear prefill term ``E[x (c + x / 2)]`` where the view carries one
    #: (``TurnTokens.quad``); None: from the group's mean tokens
    q: F64 | None
    #: turn 1's ``(x_1, c_1, q_1)`` in the view: ``P_1`` of the batch-start wait
    first: tuple[float, float, float | None]

    def path(self, wl: WorkloadProfile, batch: int) -> tuple[F64, float]:
        """(per-group turn weights, factor): the makespan is ``factor * sum(weights * C)``. With
        ``wl.tail_factor``: the mean path and ``rho`` (module docstring); without: the reach
        weights and 1."""
        if wl.tail_factor is None or not self.surv:
            return self.reach(batch), 1.0
        return self.mean_path(), max(wl.tail_factor, 1.0)

    def mean_path(self) -> F64:
        """Per group: ``sum_{k in s} S(k)``, the turns the mean trajectory runs in it; shape (1, S)."""
        if not self.surv:
            return self.turns
        return np.asarray([sum(g) for g in self.surv], dtype=np.float64).reshape(1, -1)

    def reach(self, batch: int) -> F64:
        """Per group: ``sum_{k in s} R_k``, ``R_k = 1 - (1 - S(k))^B`` (expected turns of the
        batch's longest trajectory in the group); shape (1, S)."""
        if not self.surv:
            return self.turns
        r = [sum(1.0 - (1.0 - min(max(sk, 0.0), 1.0)) ** batch for sk in group) for group in self.surv]
        return np.asarray(r, dtype=np.float64).reshape(1, -1)

    def prefill(self, hw: HardwareProfile) -> F64:
        """Per group ``P_s = P(x_s, c_s)``, or ``a0 + a1 x_s + a2 q_s`` where the view carries ``q``."""
        out: F64 = hw.prefill_s(self.x, self.c, self.q)
        return out

    def first_prefill(self, hw: HardwareProfile) -> float:
        """``P_1``: the first turn's prefill."""
        return float(hw.prefill_s(*self.first))


@functools.lru_cache(maxsize=128)
def stages(wl: WorkloadProfile, mode: Mode, n_groups: int = STAGES) -> Stages:
    """``wl`` in ``mode``'s view, compressed into at most ``n_groups`` turn groups (cached)."""
    tokens = colocated_tokens(wl) if mode is Mode.COLOCATED else prefill_pool_tokens(wl)
    return _compress(wl, tokens, n_groups)


def kv_slots(hw: HardwareProfile, wl: WorkloadProfile) -> float:
    """``m_cap = max(H_max / K_seq, 1)``: the trajectories one worker's KV memory holds at once,
    each at its final context ``K_seq`` (a colocated worker, a split's decode worker); past it the
    rest wait for room, and the models cap the worker's decode concurrency there."""
    return max(hw.kv_capacity_tokens / max(wl.k_seq, 1.0), 1.0)


@functools.lru_cache(maxsize=64)
def pool_tail(wl: WorkloadProfile) -> TailArrays | None:
    """The kept windows' slowest paths restated for the prefill pool, as arrays (cached); None
    without paths."""
    return tail_arrays(prefill_pool_windows(wl))


@functools.lru_cache(maxsize=64)
def pool_turns(wl: WorkloadProfile) -> tuple[F64, F64, F64, F64]:
    """Per turn in the prefill pool's view: ``(x_k, c_k, q_k = x_k (c_k + x_k / 2), S(k))`` as
    arrays (``queueing.prefill_service_scv``)."""
    t = prefill_pool_tokens(wl)
    x = np.asarray(t.new, dtype=np.float64)
    c = np.asarray(t.cached, dtype=np.float64)
    q = x * (c + x / 2.0)
    return x, c, q, np.asarray(wl.survival, dtype=np.float64)


def _compress(wl: WorkloadProfile, tokens: TurnTokens, n_groups: int) -> Stages:
    k = wl.max_turns
    edges = np.linspace(0, k, min(n_groups, k) + 1).round().astype(int)
    cols: list[list[float]] = [[], [], [], [], [], []]
    groups: list[tuple[float, ...]] = []
    surv = np.asarray(wl.survival)
    arrays = [np.asarray(a, dtype=np.float64) for a in (tokens.new, tokens.cached, wl.output_tokens, wl.env_s)]
    quad = np.asarray(tokens.quad, dtype=np.float64) if tokens.quad is not None else None
    qs: list[float] = []
    for lo, hi in itertools.pairwise(edges.tolist()):
        if hi <= lo:
            continue
        w = surv[lo:hi]
        wsum = float(w.sum())
        if wsum <= 0:
            continue
        cols[0].append(float(hi - lo))
        groups.append(tuple(float(v) for v in w))
        cols[1].append(wsum / (hi - lo))
        for j, a in enumerate(arrays):
            cols[2 + j].append(float((a[lo:hi] * w).sum() / wsum))
        if quad is not None:
            qs.append(float((quad[lo:hi] * w).sum() / wsum))
    t, alive, x, c, o, e = (np.asarray(col, dtype=np.float64).reshape(1, -1) for col in cols)
    q = np.asarray(qs, dtype=np.float64).reshape(1, -1) if quad is not None else None
    first = (tokens.new[0], tokens.cached[0], tokens.quad[0] if tokens.quad is not None else None)
    return Stages(t, alive, x, c, o, e, tuple(groups), q, first)
