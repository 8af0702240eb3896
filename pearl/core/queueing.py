"""The prefill pool's queue: one FCFS queue per prefill worker, fed by a closed population.

The router keeps a trajectory on the prefill worker that holds its prefix unless that worker's
load exceeds the least loaded one's by the affinity slack (``pipeline.Router``), so a P:D split's
prefill pool is ``N_P`` queues of about ``m_P = B_s / N_P`` trajectories each, and each queue is
fed by a *closed* population: a trajectory that waits submits nothing else, so a long queue slows
its own arrivals. The wait is exact mean value analysis of one FCFS queue (service ``p``, squared
coefficient of variation ``c_s^2``) with ``m`` customers whose think time is ``z`` (the rest of
their cycle), with the residual-service correction for non-exponential service::

    R(k) = p + p (Q(k-1) - U(k-1)) + U(k-1) p (1 + c_s^2) / 2,   X(k) = k / (R(k) + z),
    Q(k) = X(k) R(k),  U(k) = X(k) p,                             W = R(m) - p

for k = 1 .. m (``R(1) = p``: nothing queued). Exact for exponential service (c_s^2 = 1, the
machine-repairman model); with c_s^2 < 1 the correction lets the throughput X(m) exceed 1 / p
slightly near saturation, and the caller's throughput bound ``C_P`` bounds the cycle there.

``c_s^2`` is that of the turn mixture (``prefill_service_scv``): a prefill worker's queue holds
turns of every index at once (the trajectories desynchronise within a few turns), so the spread
that matters is the one between turns.

``W / p`` depends on ``m`` and ``z / p`` only, so the recursion runs once per (``k_max``,
``c_s^2``) on a log grid of ``z / p`` (``_closed_wait_table``, cached) and each call interpolates,
linearly in ``m`` between floor(m) and floor(m) + 1 (``m < 1`` waits 0) and linearly in
``log(z / p)``. The interpolation error is under 0.1 % of ``W``
(``tests/core/test_makespan_queue.py``); a table takes 8 (k_max + 1) G bytes, G = 1121, k_max the
power of two above max m (at least 16; B = 64: 128, 1.2 MB; at most 4 cached). A lookup reads the
cell's corners and slopes ``T[k, j], T[k, j + 1] - T[k, j], T[k + 1, j], T[k + 1, j + 1] - T[k + 1,
j]`` (four gathers from tables built once, four times the table's bytes).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from pearl.core.hardware import HardwareProfile
from pearl.core.stages import F64, pool_turns
from pearl.core.workload import WorkloadProfile


@functools.lru_cache(maxsize=64)
def prefill_service_scv(hw: HardwareProfile, wl: WorkloadProfile) -> float:
    """Squared coefficient of variation of one prefill's service time over the turn mixture, in
    the prefill pool's view of ``wl`` (``workload.prefill_pool_tokens``)::

        c_s^2 = sum_k w_k (P_k - P_bar)^2 / P_bar^2,   P_k = P(x_k, c_k),  w_k = S(k) / sum_j S(j),
        P_bar = sum_k w_k P_k

    (cached per profiles: the decision asks for it at every evaluation between two refits)
    """
    x, c, q, s = pool_turns(wl)
    if s.size == 0 or s.sum() <= 0:
        return 0.0
    pk = hw.prefill_s(x, c, q)
    wk = s / s.sum()
    mean = float((wk * pk).sum())
    return float((wk * (pk - mean) ** 2).sum() / mean**2) if mean > 0 else 0.0


#: think-to-service ratios z / p of the wait table (log grid, 160 points per decade); outside it
#: the ratio is clipped (below 1e-3 the queue is saturated, above 1e4 it is empty)
_RATIO_GRID = np.geomspace(1e-3, 1e4, 1121)
_LOG_RATIO = np.log(_RATIO_GRID)
_INV_LOG_STEP = 1.0 / (_LOG_RATIO[1] - _LOG_RATIO[0])


def _closed_wait_table(k_max: int, cs2: float) -> F64:
    """``T[k, j]`` = W / p with ``k`` customers and z / p = ``_RATIO_GRID[j]`` (k = 0 .. k_max):
    the recursion of the module docstring in units of p."""
    r = _RATIO_GRID
    h = (1.0 + cs2) / 2.0 - 1.0
    table = np.zeros((k_max + 1, r.size), dtype=np.float64)
    q = np.zeros_like(r)
    u = np.zeros_like(r)
    for k in range(1, k_max + 1):
        big_r = 1.0 + q + u * h
        x = k / (big_r + r)
        q, u = x * big_r, x
        table[k] = big_r - 1.0
    return table


@functools.lru_cache(maxsize=4)
def _closed_wait_corners(k_max: int, cs2: float) -> tuple[F64, F64, F64, F64]:
    """Per flat index ``i = k G + j`` (k < k_max, G = the grid's size): ``T[k, j]``, ``T[k, j + 1] -
    T[k, j]``, ``T[k + 1, j]``, ``T[k + 1, j + 1] - T[k + 1, j]``, each of shape (k_max G,): a
    cell's corners and slopes are four gathers at one index (j = G - 1 reads the next row's first
    entry, never used: the grid position stays below G - 1)."""
    flat = np.append(_closed_wait_table(k_max, cs2).reshape(-1), 0.0)  # + 1: the last cell's unused slope
    g = _RATIO_GRID.size
    n = k_max * g
    lo, hi = flat[:n], flat[g : n + g]
    out = (lo.copy(), flat[1 : n + 1] - lo, hi.copy(), flat[g + 1 : n + g + 1] - hi)
    for a in out:
        a.setflags(write=False)
    return out


@functools.lru_cache(maxsize=4)
def _closed_wait_cells(k_max: int, cs2: float) -> F64:
    """``_closed_wait_corners`` stacked as ``[[T[k, j], slope], [T[k + 1, j], slope]]``, shape (2, 2,
    k_max G): a cell's four numbers in one gather."""
    t0, s0, t1, s1 = _closed_wait_corners(k_max, cs2)
    out = np.stack([np.stack([t0, s0]), np.stack([t1, s1])])
    out.setflags(write=False)
    return out


def closed_queue_wait(m: F64, p: F64, z: F64, cs2: float) -> F64:
    """Mean wait W (s) in one FCFS queue with ``m`` customers, service ``p`` and think time ``z``
    (module docstring); the arrays broadcast together."""
    return ClosedWait(m, p, cs2)(np.asarray(z, dtype=np.float64))


class ClosedWait:
    """``closed_queue_wait`` with ``m``, ``p`` and c_s^2 fixed and ``z`` free: the disaggregated
    fixed point calls it with a new ``z`` every round, so the table lookup in ``m`` is done once
    (flat indices into the table)."""

    __slots__ = ("base", "cells", "corners", "logp", "w_hi", "w_lo", "w_pair", "width")

    def __init__(self, m: F64, p: F64, cs2: float) -> None:
        # m and p broadcast through the arithmetic below (the weights take their common shape)
        m, p = np.asarray(m, dtype=np.float64), np.asarray(p, dtype=np.float64)
        need = math.ceil(float(np.max(m))) + 1 if m.size else 2
        k_max = max(16, 1 << (need - 1).bit_length())  # a power of two: few distinct tables
        self.corners = _closed_wait_corners(k_max, round(float(cs2), 3))
        self.cells = _closed_wait_cells(k_max, round(float(cs2), 3))
        lo = np.minimum(np.maximum(np.floor(m), 1.0), k_max - 1.0).astype(np.intp)
        self.width = _RATIO_GRID.size - 1
        self.base = lo * _RATIO_GRID.size  # T[floor(m), 0] in the flat table
        fm = np.minimum(np.maximum(m - lo, 0.0), 1.0)
        scale = np.where(m < 1.0, 0.0, p)  # W = p x (W / p); m < 1 waits 0
        self.w_lo, self.w_hi = (1.0 - fm) * scale, fm * scale  # the weights of rows floor(m), floor(m) + 1
        # at the weights' shape: the fixed point's lookups then broadcast nothing
        self.logp = np.log(np.maximum(p, 1e-300)) + _LOG_RATIO[0] + np.zeros_like(self.w_lo)
        self.base = self.base + np.zeros_like(self.base, shape=self.w_lo.shape)
        self.w_pair: tuple[F64, F64] | None = None  # (w_lo, w_hi) at the (T, slope) pair's shape, made at the first lookup

    def __call__(self, z: F64) -> F64:
        """W for think times ``z`` (a zero think time reads as the grid's smallest ratio)."""
        pos = (np.log(np.maximum(z, 1e-300)) - self.logp) * _INV_LOG_STEP
        pos = np.minimum(np.maximum(pos, 0.0), self.width - 1e-6)
        j = pos.astype(np.intp)  # floor: pos >= 0
        fj = pos - j
        at = self.base + j
        t0, s0, t1, s1 = self.corners
        w: F64 = (t0[at] + fj * s0[at]) * self.w_lo + (t1[at] + fj * s1[at]) * self.w_hi
        return w  # >= 0: the table is, and the weights are

    def with_slope(self, z: F64) -> tuple[F64, F64]:
        """``(W, dW/dz)`` for think times ``z > 0``, the same ``W`` as a call: the lookup is linear in
        ``log z`` within a cell, so ``dW/dz`` is the cell's slope over ``z`` (0 outside the grid,
        where ``z`` is clipped; ``<= 0``: more think time, less queue). The disaggregated fixed
        point's Newton step reads it."""
        pos = np.log(z)
        pos -= self.logp
        pos *= _INV_LOG_STEP
        inside = np.minimum(np.maximum(pos, 0.0), self.width - 1e-6)
        j = inside.astype(np.intp)  # floor: inside >= 0
        clipped = pos != inside
        cell = self.cells.take(self.base + j, axis=2)  # (rows floor(m), floor(m) + 1) x (T, slope)
        if self.w_pair is None or self.w_pair[0].shape != cell.shape[1:]:
            self.w_pair = (np.broadcast_to(self.w_lo, cell.shape[1:]).copy(), np.broadcast_to(self.w_hi, cell.shape[1:]).copy())
        mixed = cell[0] * self.w_pair[0]
        mixed += cell[1] * self.w_pair[1]  # (T, dT / d(grid position)) at m
        slope = mixed[1]
        inside -= j
        w: F64 = mixed[0] + inside * slope
        dw: F64 = slope * _INV_LOG_STEP / z
        np.putmask(dw, clipped, 0.0)
        return w, dw
