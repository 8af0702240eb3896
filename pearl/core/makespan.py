"""A batch's makespan over time: several allocations in a row, the weight sync, a grown pool.

The fresh-batch models are ``colocated.colocated_makespan`` and
``disaggregated.disaggregated_makespan`` (the prefill pool's queue: ``queueing``; the turn groups
both read: ``stages``). This module holds what the runtime composes from them.

**A sequence of allocations** (``compose_makespan``, ``batch_progress``): a batch progresses at
``1 / M_i`` while allocation ``i`` (fresh-batch or placed makespan ``M_i``) is in force.

**The weight sync** (``sync_stall_s``): a sync after a training step pauses dispatch, aborts every
request in flight and loads the new weights, which flushes the prefix caches; each trajectory
alive then pays one extra prefill.

**In-flight batch after a pool change** (``sticky_pool``). Every fresh-batch formula assumes a
batch admitted balanced over the pool. A shrink resumes the removed workers' trajectories on the
survivors by least load, so the batch is balanced again over the smaller pool. A *growth* is not
balanced: the router keeps a trajectory on the worker that holds its prefix cache unless that
worker's load exceeds the least loaded one's by more than the affinity slack ``s``
(``pipeline.Router``), so the new workers fill only up to within ``s`` of the old ones. With ``A``
trajectories alive on ``n_p`` placed workers and the pool grown to ``N > n_p``, the balance point
``m_old - m_new = s``, ``n_p m_old + (N - n_p) m_new = A`` gives::

    m_old = min( A / n_p,  A / N + s (N - n_p) / N )      trajectories per old worker
    n_eff = A / m_old                                     (n_p <= n_eff <= N)

and the batch's slowest trajectory sits on an old worker (the most loaded), so the rest of the
batch runs like a colocated pool of ``n_eff`` workers, at ``1 / M_coloc(n_eff)``; a shrink gives
``n_eff = N``. Modelling choices: ``s`` counts trajectories although the router counts requests in
flight (a trajectory in an environment step holds none), ``A`` is the trajectories alive at the
change, and a mode switch (a P:D split's decode pool is chosen by least load) and the next batch
reset the placement.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

from pearl.core.hardware import HardwareProfile
from pearl.core.stages import stages
from pearl.core.telemetry import Mode
from pearl.core.workload import WorkloadProfile


def compose_makespan(schedule: Sequence[tuple[float, float]]) -> float:
    """Makespan of a batch served by a sequence of allocations: ``schedule`` = ``(t_i, M_i)``,
    the offset from the batch's start at which the allocation with (fresh-batch or placed)
    makespan ``M_i`` takes over (``t_0 = 0``, increasing); the last one holds until the end. The
    batch progresses at ``1 / M_i`` while allocation i is in force::

        M_hat = t_j + (1 - sum_{i<j} (t_{i+1} - t_i) / M_i) M_j    (j: where progress reaches 1)

    Modelling choice: progress is linear in time within an allocation (a batch's tail is slower
    per trajectory, so this is an approximation). For the runtime: at a batch's start the borrow /
    return schedule is known (the overlap GPUs return when the trainer starts, come back after
    its step), so a batch-start prediction can compose it with ``sticky_pool`` for the return."""
    if not schedule:
        raise ValueError("compose_makespan: empty schedule; give at least (0, M_0)")
    prog = 0.0
    for (t, m), (t_next, _m) in itertools.pairwise(schedule):
        if m <= 0 or t_next < t:
            raise ValueError(f"compose_makespan: bad segment (t={t}, M={m}, next t={t_next}): "
                             "need M > 0 and increasing offsets")
        if prog + (t_next - t) / m >= 1.0:
            return t + (1.0 - prog) * m
        prog += (t_next - t) / m
    t, m = schedule[-1]
    if m <= 0:
        raise ValueError(f"compose_makespan: bad segment (t={t}, M={m}): need M > 0")
    return t + (1.0 - prog) * m


def batch_progress(schedule: Sequence[tuple[float, float]], t: float) -> float:
    """Share of a batch done by offset ``t`` under ``schedule`` (``(t_i, M_i)`` as in
    ``compose_makespan``, the last allocation holding on), at ``1 / M_i`` within each::

        p(t) = sum_i max(min(t_{i+1}, t) - t_i, 0) / M_i

    Not capped at 1 (an overrun reads > 1). An allocation whose ``M_i`` is not a positive finite
    number (no decision) adds nothing. The runtime's borrow gate reads its remaining time from it
    (``pearl.core.outlook.remaining_s``), and the batch-start prediction its replay of that gate."""
    prog = 0.0
    for (t0, m0), (t1, _m1) in itertools.pairwise([*schedule, (math.inf, 0.0)]):
        if math.isfinite(m0) and m0 > 0:
            prog += max(min(t1, t) - t0, 0.0) / m0
    return prog


def sync_stall_s(hw: HardwareProfile, wl: WorkloadProfile, batch: int, progress: float, per_worker_div: float,
                 pause_s: float, disaggregated: bool = False) -> float:
    """Delay a weight sync adds to the slowest trajectory of a batch it lands in (module docstring).

    One trajectory caught decoding (share ``f`` of a turn) resumes with its whole context
    re-prefilled; one in its prefill or environment step finds its cache empty at its next turn.
    At the turn group ``s`` the sync lands in (``progress`` of the batch, read on the mean
    trajectory's turns: the first group whose cumulative ``sum_{k in s} S(k)`` share reaches it),
    in the mode's view of ``wl`` (colocated, or the prefill pool's with ``disaggregated``), with
    ``m`` trajectories per worker::

        E_s   = f P(L_s, 0) + (1 - f) max(P(x_s + c_s, 0) - P(x_s, c_s), 0)   extra prefill per trajectory
        f     = o_s tau(m, L_s) / (P(x_s, c_s) + o_s tau(m, L_s) + e_s)        share of a turn decoding
        Delta = pause + m E_s             colocated: prefill runs ahead of decode, so the slowest
                                          trajectory waits out its worker's burst
        Delta = pause + (m + 1) / 2 E_s   disaggregated: its re-prefill queues in the middle of its
                                          prefill worker's burst

    ``m = max(B_s / per_worker_div, 1)`` (``per_worker_div``: the colocated pool, or the prefill
    pool), ``L_s = x_s + c_s + o_s / 2``, ``pause`` the measured pause (clipped at 0). ``P`` is
    taken at the group's mean tokens ``(x_s, c_s)`` in both modes: the colocated view's mixture term
    ``q_s`` (``Stages.q``) is not used here. Modelling choices: the burst is charged whole to the
    slowest trajectory (colocated), the stage is read by turns, not time, and the stall is not
    stretched by the tail factor."""
    st = stages(wl, Mode.DISAGGREGATED if disaggregated else Mode.COLOCATED)
    w = st.mean_path()[0]
    if w.size == 0 or float(w.sum()) <= 0:
        return max(pause_s, 0.0)
    cum = np.cumsum(w) / float(w.sum())
    s = int(min(np.searchsorted(cum, min(max(progress, 0.0), 1.0)), w.size - 1))
    x, c, o, e = (float(a[0, s]) for a in (st.x, st.c, st.o, st.e))
    m = max(batch * float(st.alive[0, s]) / max(per_worker_div, 1e-9), 1.0)
    ctx = x + c + o / 2.0
    p = hw.prefill_s(x, c)
    dec = o * hw.decode_step_s(m, ctx)
    f = dec / max(p + dec + e, 1e-9)
    extra = f * hw.prefill_s(ctx, 0.0) + (1.0 - f) * max(hw.prefill_s(x + c, 0.0) - p, 0.0)
    share = (m + 1.0) / 2.0 if disaggregated else m
    return max(pause_s, 0.0) + share * extra


def sticky_pool(alive: float, n_placed: float, n_workers: float, slack: float) -> float:
    """Effective colocated pool ``n_eff`` of an in-flight batch whose ``alive`` trajectories sit
    balanced on ``n_placed`` workers when the pool becomes ``n_workers`` (module docstring,
    "In-flight batch after a pool change"): ``n_workers`` on a shrink, else ``alive / m_old`` with
    ``m_old = min(alive / n_placed, alive / N + slack (N - n_placed) / N)``."""
    if n_workers <= 0 or alive <= 0:
        return float(max(n_workers, 0))
    if n_placed <= 0 or n_workers <= n_placed:
        return float(n_workers)
    m_old = min(alive / n_placed, alive / n_workers + max(slack, 0.0) * (n_workers - n_placed) / n_workers)
    return float(min(max(alive / m_old, n_placed), n_workers))
