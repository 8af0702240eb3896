"""Bubble-aware makespan models for a rollout batch (paper Sec. 4.2 and 4.3.1).

The batch makespan is the completion time of the *last* of the ``B`` trajectories. A trajectory
is a sequence of turns; turn ``k`` is prefill -> decode -> environment step. The tail of the batch
matters: as trajectories finish, fewer remain, decode batches shrink and GPUs idle (bubbles).
So the makespan is a sum over turns of a per-turn *cycle time* ``C_k`` computed at the number of
trajectories still alive at that turn::

    M = sum_k C_k( B_k ),     B_k = B * S(k)      (S: survival of the workload profile)

Turns are compressed into at most ``STAGES`` consecutive groups (per-group means) so that every
candidate allocation is evaluated at once with numpy (vectorised over candidates x stages).

Per-turn quantities (workload profile): x new prompt tokens, c cached tokens, o output tokens,
e environment seconds, L = x + c + o/2 mean decode context. Hardware (``HardwareProfile``):
P = P(x, c) prefill time, tau(n, L) decode iteration time at batch n, X = X(x + c) KV transfer
of the whole context (the decode worker needs every KV entry of the prompt), H_max KV tokens per
worker, K_seq KV footprint of one trajectory.

Colocation (N workers, m = max(B_k / N, 1) trajectories per worker; prefill and decode serialise
on the same GPUs). Unknowns: the decode concurrency n and the cycle C, found by fixed-point
iteration (damped, ``ITERATIONS`` rounds)::

    u     = min(m P / C, u_cap)                prefill share of the worker's time
    D     = o tau(n, L) / (1 - u)              decode of o tokens, stalled by prefill interference
    W     = u P / (2 (1 - u))                  wait for other trajectories' prefills (M/D/1)
    C_lat = W + P + D + e                      one trajectory's own turn (env included)
    C_cap = m P + (m o / n) tau(n, L)          the worker's busy time per turn of all m trajectories
    C     = max(C_lat, C_cap)
    n     = clip(m D / C, 1, m)                Little's law: env steps and prefill reduce the
                                               number of trajectories decoding at once

KV memory: at most m_cap = H_max / K_seq trajectories fit on a worker; if m > m_cap the rest wait
(the cycle is scaled by m / m_cap).

Disaggregation (N_P prefill workers shared by all trajectories, N_D decode workers with
m = max(B_k / N_D, 1) trajectories each)::

    u      = min(B_k P / (N_P C), u_max)       prefill pool utilisation
    W      = P u^(sqrt(2 (N_P + 1)) - 1) / (N_P (1 - u))     M/M/c queueing wait (Sakasegawa)
    D      = o tau(n, L)                       no interference: decode runs alone
    C_lat  = W + P + X + D + e                 prefill path (incl. KV transfer) + decode + env
    C_P    = B_k P / (N_P u_max)               prefill path throughput bound
    C_D    = (m o / n) tau(n, L)               decode path throughput bound
    C      = max(C_lat, C_P, C_D)              the longer path dominates, env time on top of the
                                               latency path (paper: "max of the prefill and
                                               decode paths plus environment time")
    n      = clip(m D / C, 1, m)

Feasibility of a disaggregated split (paper Sec. 4.2):

* enough prefill capacity: ``B_k P / (N_P max(C_lat, C_D)) <= u_max`` at every stage, i.e. the
  prefill pool keeps up with what the decode side can absorb;
* KV memory: ``B * K_seq <= N_D * H_max``.

Modelling choices the paper leaves open, made here: M/D/1 wait for colocated prefill (prefill
chunks are near-deterministic), Sakasegawa's M/M/c approximation for the prefill pool, full
context transfer per turn, u_cap = 0.95 for colocation, ``STAGES`` = 8 and ``ITERATIONS`` = 12
(at most; iteration stops once no cycle time moves by more than 1e-4 relative in a round).
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pearl.core.profile import HardwareProfile, WorkloadProfile

STAGES = 8
ITERATIONS = 12
U_CAP_COLOCATED = 0.95

F64 = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Stages:
    """Turn groups: ``turns[s]`` turns whose per-turn means are the other arrays (shape (1, S))."""

    turns: F64
    alive: F64
    x: F64
    c: F64
    o: F64
    e: F64

    @staticmethod
    def of(wl: WorkloadProfile, stages: int = STAGES) -> Stages:
        """Compress ``wl``'s turns into at most ``stages`` groups (cached per profile value)."""
        return _stages_cached(wl, stages)

    @staticmethod
    def _build(wl: WorkloadProfile, stages: int) -> Stages:
        k = wl.max_turns
        edges = np.linspace(0, k, min(stages, k) + 1).round().astype(int)
        cols: list[list[float]] = [[], [], [], [], [], []]
        surv = np.asarray(wl.survival)
        arrays = [np.asarray(a, dtype=np.float64) for a in (wl.new_tokens, wl.cached_tokens, wl.output_tokens, wl.env_s)]
        for lo, hi in itertools.pairwise(edges.tolist()):
            if hi <= lo:
                continue
            w = surv[lo:hi]
            wsum = float(w.sum())
            if wsum <= 0:
                continue
            # turns in this group, counted for the last trajectory: each turn is on its path
            cols[0].append(float(hi - lo))
            cols[1].append(wsum / (hi - lo))
            for j, a in enumerate(arrays):
                cols[2 + j].append(float((a[lo:hi] * w).sum() / wsum))
        t, alive, x, c, o, e = (np.asarray(col, dtype=np.float64).reshape(1, -1) for col in cols)
        return Stages(t, alive, x, c, o, e)


@functools.lru_cache(maxsize=64)
def _stages_cached(wl: WorkloadProfile, stages: int) -> Stages:
    return Stages._build(wl, stages)


def _tau(hw: HardwareProfile, n: F64, ctx: F64) -> F64:
    """tau(n, L) = b0 + b_e (1 - (1 - k/E)^n) + n (b1 + b2 L), with (1-k/E)^n = exp(n log(1-k/E))."""
    per_seq = n * (hw.b1 + hw.b2 * ctx)
    if hw.experts_frac > 0:
        return (hw.b0 + hw.b_e) - hw.b_e * np.exp(n * math.log1p(-hw.experts_frac)) + per_seq
    return hw.b0 + per_seq


def _prefill(hw: HardwareProfile, x: F64, c: F64) -> F64:
    return hw.a0 + hw.a1 * x + hw.a2 * x * (c + x / 2.0)


def _converged(prev: F64, cur: F64, rtol: float = 1e-4) -> bool:
    """Stop early once no cycle time moved by more than ``rtol`` (relative) in one round."""
    return bool(np.all(np.abs(cur - prev) <= rtol * cur))


def colocated_makespan(hw: HardwareProfile, st: Stages, wl: WorkloadProfile, batch: int, n_workers: F64) -> F64:
    """Predicted makespan (s) for colocation on each entry of ``n_workers`` (shape (M,))."""
    nw = n_workers.reshape(-1, 1).astype(np.float64)
    bk = batch * st.alive
    m = np.maximum(bk / nw, 1.0)
    m_cap = max(hw.kv_capacity_tokens / max(wl.k_seq, 1.0), 1.0)
    waves = np.maximum(m / m_cap, 1.0)
    m = np.minimum(m, m_cap)
    p = _prefill(hw, st.x, st.c)
    ctx = st.x + st.c + st.o / 2.0
    n = m.copy()
    c_cyc = p + st.o * _tau(hw, n, ctx) + st.e
    for _ in range(ITERATIONS):
        tau = _tau(hw, n, ctx)
        u = np.minimum(m * p / c_cyc, U_CAP_COLOCATED)
        d = st.o * tau / (1.0 - u)
        w = u * p / (2.0 * (1.0 - u))
        c_lat = w + p + d + st.e
        c_cap = m * p + (m * st.o / n) * tau
        prev, c_cyc = c_cyc, np.maximum(c_lat, c_cap)
        n = 0.5 * n + 0.5 * np.clip(m * d / c_cyc, 1.0, m)
        if _converged(prev, c_cyc):
            break
    total: F64 = (st.turns * c_cyc * waves).sum(axis=1)
    return total


@dataclass(frozen=True, slots=True)
class DisaggResult:
    makespan_s: F64
    prefill_ok: npt.NDArray[np.bool_]
    kv_ok: npt.NDArray[np.bool_]


def disaggregated_makespan(
    hw: HardwareProfile, st: Stages, wl: WorkloadProfile, batch: int, n_prefill: F64, n_decode: F64, u_max: float
) -> DisaggResult:
    """Predicted makespan (s) and feasibility for each (N_P, N_D) pair (shape (M,))."""
    npf = n_prefill.reshape(-1, 1).astype(np.float64)
    nd = n_decode.reshape(-1, 1).astype(np.float64)
    bk = batch * st.alive
    m = np.maximum(bk / nd, 1.0)
    p = _prefill(hw, st.x, st.c)
    xfer = hw.g0 + hw.g1 * (st.x + st.c)
    ctx = st.x + st.c + st.o / 2.0
    n = m.copy()
    c_cyc = p + xfer + st.o * _tau(hw, n, ctx) + st.e
    expo = np.sqrt(2.0 * (npf + 1.0)) - 1.0
    load = bk * p / npf  # B_k P / N_P
    c_p = load / u_max
    fixed = p + xfer + st.e
    m_o = m * st.o
    c_lat = c_cyc
    c_d = c_cyc
    for _ in range(ITERATIONS):
        tau = _tau(hw, n, ctx)
        u = np.minimum(load / c_cyc, u_max)
        w = p * np.exp(expo * np.log(np.maximum(u, 1e-300))) / (npf * (1.0 - u))
        d = st.o * tau
        c_lat = w + fixed + d
        c_d = m_o * tau / n
        prev, c_cyc = c_cyc, np.maximum(np.maximum(c_lat, c_d), c_p)
        n = 0.5 * n + 0.5 * np.clip(m * d / c_cyc, 1.0, m)
        if _converged(prev, c_cyc):
            break
    u_req = bk * p / (npf * np.maximum(c_lat, c_d))
    prefill_ok = (u_req <= u_max).all(axis=1)
    kv_ok = (batch * wl.k_seq <= nd[:, 0] * hw.kv_capacity_tokens)
    total: F64 = (st.turns * c_cyc).sum(axis=1)
    return DisaggResult(total, prefill_ok, kv_ok)
