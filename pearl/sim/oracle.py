"""The hindsight oracle: PEARL that knows the whole trace and measured makespans, planned per interval.

What the oracle knows that PEARL does not (and how it uses it, through the same runtime, so every
transition cost is still paid):

1. **Grant lifetimes** (``grant_lifetimes``): for every GpusGranted event, how long until those
   GPUs are reclaimed (or the segment ends). A grant is taken only if it pays back its expansion:
   ``lifetime - (c_prep + c_final) > 0`` with the paper's Table 3 costs (``EXPANSION_S``). This
   hindsight replaces PEARL's predictive gates, which are off for the oracle (``gate_enabled``
   False, ``pearl/sim/systems.py``): it takes every grant it keeps and borrows every idle
   training window (a borrowed budget's measured makespan is always below the base budget's).
2. **The measured makespan of every candidate allocation at every budget** the replay can reach
   (reserved + every preemptible level in the segment, with and without the borrowed training
   GPUs): colocation and the best predicted P:D splits, each measured by running one rollout
   batch on a fixed pool in the emulator (``pearl.sim.simulate.best_allocation_search``).
3. **The best allocation per trace interval, transition costs paid** (``plan_allocations``, a
   Viterbi dynamic programme over intervals x candidate allocations). The intervals are the
   stretches of constant worker budget ``n_i`` (``budget_intervals``: a taken grant adds its
   workers ``EXPANSION_S`` after the grant, a reclaim removes them at its deadline)::

       rate(n, a)  = B / max(M(n, a), T_train)      trajectories / s of allocation a on n workers
                     (M: measured batch makespan; the trainer consumes one batch per T_train, so a
                     faster rollout cannot raise the throughput above B / T_train)
       V_0(a)      = rate(n_0, a) d_0
       V_i(a)      = rate(n_i, a) d_i + max_a' [ V_{i-1}(a') - [proj(a', n_i) != a] T_sw(n_i) rate(n_i, a) ]
       T_sw(n)     = t_role + (B / n) P(K_seq / 2, 0)          pool seconds lost by a role change

   ``d_i`` the interval's duration, ``proj`` the runtime's projection of an allocation onto a new
   budget (``pearl.core.decision.project``: colocation stays colocation, a split keeps its prefill
   fraction, both at no cost), ``t_role`` the role-switch time and ``P(K_seq/2, 0)`` the
   uncached prefill of a mid-trajectory context: a role change aborts the in-flight requests of
   the re-roled workers and flushes their prefix caches, so each of their ~B/n trajectories
   re-prefills its context once (modelling choice, stated here). Borrowed budgets ``n + T``
   (training GPUs lent for a window of ~``T_train``) take, per base allocation ``a``, the label
   maximising ``rate(n + T, b) - [proj(a, n + T) != b] 2 T_sw rate / T_train`` (a mismatch costs
   a switch on borrow and another on return).

   The plan is enacted through the same runtime: ``schedule`` entries ``(t, overrides)`` replace
   the Elastic Scheduler's ``policy.allocation_overrides`` at the event that opens each interval
   (the old and the new budget both map to their planned labels during the transition); budgets
   the plan does not cover fall back to the decision engine.

It does not know the workload's random draws (same seed as every system) and does not skip
transition costs: it is an upper bound on *policy* quality, not on the hardware.

Public names: ``grant_lifetimes``, ``oracle_events``, ``reachable_budgets``, ``budget_intervals``,
``plan_allocations``, ``Interval``, ``OraclePlan``, ``EXPANSION_S``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pearl.config import ClusterSpec, PolicySpec
from pearl.core.decision import Allocation, project
from pearl.core.events import GpusGranted, ReclaimNotice
from pearl.sim.traces import GpuTimeline, TimedEvent

#: Expansion preparation + finalisation, paper Table 3 midpoints (61.5 s + 14.5 s).
EXPANSION_S = 76.0


def grant_lifetimes(events: Sequence[TimedEvent], end_s: float) -> dict[str, float]:
    """event_id of each grant -> seconds until the first of its GPUs is reclaimed (deadline), or the end."""
    out: dict[str, float] = {}
    for i, e in enumerate(events):
        if not isinstance(e.event, GpusGranted):
            continue
        ids = {g.gpu_id for g in e.event.gpus}
        until = end_s
        for later in events[i + 1 :]:
            ev = later.event
            if isinstance(ev, ReclaimNotice) and ids.intersection(ev.gpu_ids):
                until = ev.deadline
                break
        out[e.event.event_id] = until - e.at_s
    return out


def oracle_events(events: Sequence[TimedEvent], end_s: float, expansion_s: float = EXPANSION_S) -> list[TimedEvent]:
    """The trace's events minus grants that cannot pay back their expansion, and minus reclaims of
    GPUs that were never taken (a reclaim of only-declined GPUs is dropped; a mixed one keeps the
    taken GPUs)."""
    life = grant_lifetimes(events, end_s)
    declined: set[str] = set()
    out: list[TimedEvent] = []
    for e in events:
        ev = e.event
        if isinstance(ev, GpusGranted):
            if life[ev.event_id] <= expansion_s:
                declined |= {g.gpu_id for g in ev.gpus}
                continue
            declined -= {g.gpu_id for g in ev.gpus}
            out.append(e)
        else:
            keep = tuple(g for g in ev.gpu_ids if g not in declined)
            if keep:
                out.append(e if len(keep) == len(ev.gpu_ids) else TimedEvent(
                    e.at_s, ReclaimNotice(keep, ev.deadline, ev.notice_id, ev.event_id)))
    return out


def reachable_budgets(tl: GpuTimeline | None, cluster: ClusterSpec, borrow: bool = True) -> list[int]:
    """Worker budgets (tp_size = 1: GPUs) the replay can reach: reserved + each preemptible level,
    and the same + the training GPUs when borrowing."""
    levels = {0} if tl is None else set(tl.gpus)
    base = sorted({(cluster.reserved_gpus + p) // cluster.tp_size for p in levels})
    out = set(b for b in base if b >= 1)
    if borrow:
        out |= {b + cluster.training_gpus // cluster.tp_size for b in base}
    return sorted(out)


@dataclass(frozen=True, slots=True)
class Interval:
    """A stretch of constant worker budget: ``[start_s, end_s)`` with ``n_workers``; ``event_s`` is
    when the event that opens it arrives (a grant's arrival precedes its workers by the expansion)."""

    start_s: float
    end_s: float
    n_workers: int
    event_s: float

    @property
    def duration_s(self) -> float:
        return max(self.end_s - self.start_s, 0.0)


def budget_intervals(events: Sequence[TimedEvent], cluster: ClusterSpec, end_s: float,
                     expansion_s: float = EXPANSION_S) -> list[Interval]:
    """Worker budget over time from the (oracle-filtered) events: a grant's GPUs serve from
    ``at_s + expansion_s``, a reclaim's leave at its deadline; reserved GPUs always serve."""
    tp = cluster.tp_size
    changes: list[tuple[float, float, int]] = []  # (effective time, event time, delta GPUs)
    for e in events:
        ev = e.event
        if isinstance(ev, GpusGranted):
            changes.append((min(e.at_s + expansion_s, end_s), e.at_s, len(ev.gpus)))
        else:
            changes.append((min(ev.deadline, end_s), e.at_s, -len(ev.gpu_ids)))
    changes.sort()
    gpus = cluster.reserved_gpus
    out: list[Interval] = []
    start, ev_t = 0.0, 0.0
    for t, at, d in changes:
        if t > start:
            out.append(Interval(start, t, gpus // tp, ev_t))
            start, ev_t = t, at
        gpus += d
    if end_s > start:
        out.append(Interval(start, end_s, gpus // tp, ev_t))
    # merge neighbours with the same budget
    merged: list[Interval] = []
    for iv in out:
        if merged and merged[-1].n_workers == iv.n_workers:
            merged[-1] = Interval(merged[-1].start_s, iv.end_s, iv.n_workers, merged[-1].event_s)
        else:
            merged.append(iv)
    return merged


@dataclass(frozen=True)
class OraclePlan:
    """The plan: a label per interval, the override schedule that enacts it, and its value."""

    intervals: tuple[Interval, ...]
    labels: tuple[str, ...]
    schedule: tuple[tuple[float, dict[int, str]], ...]
    value: float  # planned trajectories over the segment (rates x durations - switch losses)
    switches: int


def _same(a: str, b: str, n_from: int, n_to: int, policy: PolicySpec) -> bool:
    """Does the runtime's projection of ``a`` (on ``n_from``) onto ``n_to`` give ``b``?"""
    return project(Allocation.parse(a, n_from), n_to, policy) == Allocation.parse(b, n_to)


def plan_allocations(intervals: Sequence[Interval], rates: Mapping[int, Mapping[str, float]],
                     switch_s: Mapping[int, float], policy: PolicySpec, borrow_workers: int = 0,
                     borrow_window_s: float = 0.0) -> OraclePlan:
    """Viterbi over intervals x candidate labels (module docstring); ties prefer colocation, then
    the label order of ``rates``. ``rates[n]`` must cover every interval's budget."""
    if not intervals:
        return OraclePlan((), (), (), 0.0, 0)
    for iv in intervals:
        if not rates.get(iv.n_workers):
            raise ValueError(f"oracle plan: no measured rate for a budget of {iv.n_workers} workers")
    labels = [sorted(rates[iv.n_workers], key=lambda a: a != "coloc") for iv in intervals]
    first = intervals[0]
    value = {a: rates[first.n_workers][a] * first.duration_s for a in labels[0]}
    back: list[dict[str, str]] = []
    for i in range(1, len(intervals)):
        prev, cur = intervals[i - 1], intervals[i]
        n = cur.n_workers
        nv: dict[str, float] = {}
        bp: dict[str, str] = {}
        for a in labels[i]:
            r = rates[n][a]
            best_v, best_p = float("-inf"), ""
            for p in labels[i - 1]:
                cost = 0.0 if _same(p, a, prev.n_workers, n, policy) else switch_s.get(n, 0.0) * r
                v = value[p] - cost
                if v > best_v:
                    best_v, best_p = v, p
            nv[a] = best_v + r * cur.duration_s
            bp[a] = best_p
        value = nv
        back.append(bp)
    last = max(labels[-1], key=lambda a: value[a])
    total = value[last]
    chosen = [last]
    for bp in reversed(back):
        chosen.append(bp[chosen[-1]])
    chosen.reverse()
    switches = sum(1 for i in range(1, len(chosen)) if not _same(
        chosen[i - 1], chosen[i], intervals[i - 1].n_workers, intervals[i].n_workers, policy))

    def borrowed(n: int, a: str) -> dict[int, str]:
        nb = n + borrow_workers
        if not borrow_workers or not rates.get(nb) or borrow_window_s <= 0:
            return {}
        sw = switch_s.get(nb, 0.0)
        cands = sorted(rates[nb], key=lambda b: b != "coloc")
        best = max(cands, key=lambda b: rates[nb][b] * (
            1.0 - (0.0 if _same(a, b, n, nb, policy) else 2.0 * sw / borrow_window_s)))
        return {nb: best}

    schedule: list[tuple[float, dict[int, str]]] = []
    prev_ov: dict[int, str] = {}
    for iv, a in zip(intervals, chosen, strict=True):
        ov = {iv.n_workers: a, **borrowed(iv.n_workers, a)}
        schedule.append((iv.event_s, {**prev_ov, **ov}))
        prev_ov = ov
    return OraclePlan(tuple(intervals), tuple(chosen), tuple(schedule), total, switches)
