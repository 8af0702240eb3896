"""Forecasts of the elastic rollout pool: pure functions over a frozen ``PoolOutlook``.

The Elastic Scheduler takes a ``PoolOutlook`` of what it knows now (the decision in force, the
lent training GPUs, the pending reclaim notices, the expansion groups in preparation, the
measured costs) and asks this module how long a batch will take, how much of the running one is
left, and how long the budget holds. Nothing here reads a clock or changes state.

Makespans (all seconds; each has one name in code and docstrings):

======================  ==============================================================================
name                    meaning
======================  ==============================================================================
fresh makespan M(n)     the decision engine's predicted makespan of a batch that starts on ``n``
                        workers and keeps them, chosen with no allocation in force
                        (``Decider.fresh_makespan``; the gates compare two of them)
decided makespan        ``Decision.predicted_makespan_s`` of an allocation decided against the
                        incumbent (hysteresis); ``M_cur`` for the decision at a batch's start
placed makespan M_i     the makespan at which an in-flight batch runs after its colocated pool grew
                        past ``n_low``: ``M_coloc(n_eff)``, ``n_eff = sticky_pool(B, n_low, n_i, s)``
composed makespan       ``M_hat = compose_makespan([(0, M_cur), (t_1, M_1), ...])``: the batch under
                        every known pool change (``pool_schedule``)
batch forecast          ``M_hat`` plus the weight-sync stall that lands inside the batch
                        (``batch_forecast``; the prediction recorded at each batch start)
remaining time R        the running batch's predicted remaining time (``remaining_s``)
======================  ==============================================================================

Known pool changes (``pool_changes``; offsets from now, in time order):

* lent overlap GPUs, when the trainer has a batch waiting (``trainer_waits``): the trainer starts
  now, so their ``N_o`` workers leave after ``d_ret`` and, the step done, come back ``d_act``
  after it (``-N_o`` at ``d_ret``, ``+N_o`` at ``d_ret + T + d_act``, the regrowth);
* overlap GPUs a running training step holds (``returning_workers`` = ``N_r``): they come back
  ``d_act`` after the step ends (``+N_r`` at ``max(t_0 + T - now, 0) + d_act``, ``t_0`` the step's
  start; a regrowth too);
* a pending reclaim notice: the serving workers on its GPUs leave when its shrink starts
  (``deadline - shrink_margin_s``);
* an expansion group in preparation: its members join at ``started_at + t_prep + t_final``
  (``ready_at + t_final`` once ready); a group on GPUs under a notice is left out (the shrink
  cancels it).

``d_ret``, ``d_act``, ``t_prep``, ``t_final`` are the measured EMAs of ``CostModel``
(``deactivation_s``, ``activation_s``, ``expansion_prep_s``, ``expansion_final_s``); ``T`` is
``TrainerView.step_s``, the EMA of observed training spans.

Public names: ``PoolOutlook``, ``TrainerView``, ``Reclaim``, ``Expansion``, ``PoolChange``, ``Segment``,
``lent_leaving``, ``pool_changes``, ``pool_schedule``, ``regrowth_admitted``, ``sync_stall``,
``batch_forecast``, ``batch_pieces``, ``speeds_since``, ``remaining_s``, ``hold_s``, ``SwitchHold``,
``hold_switch``, ``ScheduleHold``, ``hold_for_schedule``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

from pearl.core.decision import Allocation, Candidate, Decision, Mode, project, switch_threshold
from pearl.core.gate import CostModel, GateDecision, GateOutcome, borrow_gate, switch_gate
from pearl.core.makespan import batch_progress, compose_makespan, sticky_pool, sync_stall_s
from pearl.core.override import Decider


@dataclass(frozen=True, slots=True)
class TrainerView:
    """What the scheduler has observed of the trainer: ``step_s`` = ``T``, the expected training
    step (EMA of observed ``TrainingStarted`` -> ``TrainingFinished`` spans, from a prior);
    ``steps_seen`` (a run without a trainer never syncs); ``running`` a step since ``since``;
    ``idle_window_s``: the trainer's expected idle window at its last ``TrainingFinished`` that the
    borrow gate weighed (None: not given)."""

    step_s: float
    steps_seen: int = 0
    running: bool = False
    since: float | None = None
    idle_window_s: float | None = None

    def started(self, now: float) -> TrainerView:
        return replace(self, steps_seen=self.steps_seen + 1, running=True, since=now)

    def finished(self, now: float, alpha: float) -> TrainerView:
        """The step ended at ``now``: ``T += alpha (span - T)`` for a positive finite span."""
        step = self.step_s
        if self.since is not None:
            span = now - self.since
            if math.isfinite(span) and span > 0:
                step += alpha * (span - step)
        return replace(self, step_s=step, running=False, since=None)


@dataclass(frozen=True, slots=True)
class Reclaim:
    """A reclaim notice: its GPUs go at ``deadline``; ``serving`` = the ACTIVE workers on them now;
    ``started``: its shrink is under way (the workers are already leaving)."""

    deadline: float
    gpus: frozenset[str]
    serving: int
    started: bool = False


@dataclass(frozen=True, slots=True)
class Expansion:
    """An expansion group in preparation (or ready, not yet admitted): ``workers`` members on
    ``gpus``, started at ``started_at``, ready at ``ready_at`` (None while preparing)."""

    gpus: frozenset[str]
    workers: int
    started_at: float
    ready_at: float | None = None


class PoolChange(NamedTuple):
    """A known change of the pool: ``delta`` workers at ``offset_s`` from now; ``regrowth``: the
    lent workers coming back after the training step (subject to the borrow gate then)."""

    offset_s: float
    delta: int
    regrowth: bool


class Segment(NamedTuple):
    """An allocation in force within a batch: from ``offset_s`` after the batch's start, on
    ``workers`` workers, at (fresh or placed) makespan ``makespan_s``."""

    offset_s: float
    makespan_s: float
    workers: int


@dataclass(frozen=True, slots=True)
class PoolOutlook:
    """What the Elastic Scheduler knows about its pool at clock time ``now``.

    ``decider``: the decision with overrides on the current profiles; ``decision`` the one in
    force and ``allocation`` the incumbent (None before the first); ``lent_workers`` = ``N_o``, the
    workers lent overlap GPUs hold (0 when nothing is lent); ``returning_workers`` = ``N_r``, the
    workers the overlap GPUs hold that a running training step has taken back and may lend again
    when it ends (0 when no step runs or nothing is ever lent); ``trainer``: what was observed of the
    training steps (``TrainerView``); ``reclaims`` / ``expansions``: the pending notices and
    groups; ``shrink_margin_s``: a shrink starts this long before its deadline;
    ``placement_slack`` = ``s``, the load slack the router keeps (``Router.placement_slack``);
    ``batch_started_at``: the running batch's start; ``speeds``: ``(time, decided makespan)`` of
    every decision since the one in force at that start (``speeds_since``);
    ``remaining_trajectories``: the running batch's trajectories not yet done."""

    now: float
    decider: Decider
    costs: CostModel
    decision: Decision | None = None
    allocation: Allocation | None = None
    lent_workers: int = 0
    returning_workers: int = 0
    trainer: TrainerView = TrainerView(0.0)
    reclaims: tuple[Reclaim, ...] = ()
    expansions: tuple[Expansion, ...] = ()
    shrink_margin_s: float = 5.0
    placement_slack: float = 0.0
    batch_started_at: float = 0.0
    speeds: tuple[tuple[float, float], ...] = ()
    remaining_trajectories: int = 0

    @property
    def batch_size(self) -> int:
        return self.decider.batch_size


def _schedule(segments: tuple[Segment, ...] | list[Segment]) -> list[tuple[float, float]]:
    """``(offset, makespan)`` of ``segments`` (``compose_makespan``'s input)."""
    return [(t, m) for t, m, _n in segments]


def lent_leaving(o: PoolOutlook, n: int) -> int:
    """Workers on lent overlap GPUs that leave a pool of ``n`` when the trainer starts: ``N_o``,
    or 0 when nothing is lent or the whole pool is lent."""
    n_o = o.lent_workers
    return n_o if 0 < n_o < n else 0


def pool_changes(o: PoolOutlook, trainer_waits: bool, n: int) -> list[PoolChange]:
    """Every pool change known now for a pool of ``n`` workers, in time order (module docstring)."""
    out: list[PoolChange] = []
    n_o = lent_leaving(o, n)
    if trainer_waits and n_o:
        d_ret, d_act = o.costs.deactivation_s, o.costs.activation_s
        out += [PoolChange(d_ret, -n_o, False), PoolChange(d_ret + o.trainer.step_s + d_act, n_o, True)]
    if o.returning_workers > 0 and o.trainer.running and o.trainer.since is not None:
        left = max(o.trainer.since + o.trainer.step_s - o.now, 0.0)
        out.append(PoolChange(left + o.costs.activation_s, o.returning_workers, True))
    noticed: set[str] = set()
    for r in o.reclaims:
        noticed |= r.gpus
        if r.started:
            continue
        if r.serving:
            out.append(PoolChange(max(r.deadline - o.shrink_margin_s - o.now, 0.0), -r.serving, False))
    for x in o.expansions:
        if x.gpus & noticed:
            continue
        t_final = o.costs.expansion_final_s
        ready = x.ready_at if x.ready_at is not None else x.started_at + o.costs.expansion_prep_s
        out.append(PoolChange(max(ready + t_final - o.now, 0.0), x.workers, False))
    return sorted(out)


def regrowth_admitted(o: PoolOutlook, schedule: list[tuple[float, float]], t: float, n_now: int,
                      n_with: int) -> bool:
    """Whether the borrow gate, evaluated when the training step ends (``t - d_act`` into the
    batch), lends the overlap GPUs again: ``borrow_gate`` with the fresh makespans ``M(n_now)``,
    ``M(n_with)``, the batch's remaining time ``(1 - p) M(n_now)`` (``p`` its progress by then
    under ``schedule``, linear within each allocation) and the trainer's last idle window (the
    remaining time when none was given). True when the batch is done before the step ends."""
    prog = batch_progress(schedule, max(t - o.costs.activation_s, 0.0))
    if prog >= 1.0:
        return True
    m_now, m_with = o.decider.fresh_makespan(n_now), o.decider.fresh_makespan(n_with)
    remaining = (1.0 - prog) * m_now
    window = o.trainer.idle_window_s if o.trainer.idle_window_s is not None else remaining
    return borrow_gate(m_now if math.isfinite(m_now) else 1e12, m_with, window, remaining,
                       o.costs, o.decider.policy).admit


def pool_schedule(o: PoolOutlook, d: Decision, trainer_waits: bool) -> tuple[float, tuple[Segment, ...]]:
    """The composed makespan ``M_hat`` of a batch starting now under decision ``d`` and the
    segments in force, ``(0, M_cur, N)`` first (``M_cur`` = ``d``'s decided makespan, ``N`` its
    workers).

    The known changes are applied in time order to ``N``; the regrowth only if
    ``regrowth_admitted``. Segment ``i``'s makespan is the decided makespan on ``n_i`` against the
    allocation in force then (``d.target``, then each segment's decision: the runtime re-plans at
    each pool change with hysteresis), except for a colocated pool that grows past ``n_low`` (the
    fewest workers the batch has had so far, which hold its in-flight trajectories): there the
    placed makespan ``M_coloc(n_eff)``, ``n_eff = sticky_pool(B, n_low, n_i, s)``
    (rounded, within ``[1, n_i]``). Modelling choices: a P:D pool change is used evenly (decode
    workers are picked by least load); progress is linear in time within each allocation.
    ``math.inf`` when the pool empties mid-batch (nothing serves it until a grant); ``M_cur`` alone
    when a segment's makespan is not a positive number."""
    m_cur = d.predicted_makespan_s
    n = d.n_workers
    segments = [Segment(0.0, m_cur, n)]
    changes = pool_changes(o, trainer_waits, n)
    if not changes:
        return m_cur, tuple(segments)
    n_now, n_low, cur = n, n, d.target
    for t, delta, regrow in changes:
        if regrow and not regrowth_admitted(o, _schedule(segments), t, n_now, n_now + delta):
            continue
        n_now += delta
        if n_now < 1:
            return math.inf, tuple(segments)
        back = o.decider.decide(n_now, cur)  # the allocation in force keeps its hysteresis
        m = back.predicted_makespan_s
        if n_now > n_low and back.target.mode is Mode.COLOCATED and back.colocated_curve:
            n_eff = sticky_pool(float(d.batch), float(n_low), float(n_now), o.placement_slack)
            m = back.colocated_curve[max(min(round(n_eff), n_now), 1) - 1]
        cur = back.target
        n_low = min(n_low, n_now)
        if not (math.isfinite(m) and m > 0):
            return m_cur, tuple(segments[:1])
        segments.append(Segment(t, m, n_now))
    return compose_makespan(_schedule(segments)), tuple(segments)


def batch_pieces(ran: Allocation, changes: Sequence[tuple[float, Allocation | None]], start: float, end: float,
                 batch: float, slack: float) -> list[tuple[Allocation, float, float]] | None:
    """The allocations a batch that ran from ``start`` to ``end`` was under, as the closed loop
    takes them (``RuntimeTracker.observe_batch``): ``(allocation, seconds, workers)``, ``ran`` at
    its start then each of ``changes`` (``(time, allocation)``, oldest first) in turn. A colocated
    pool that grew past ``n_low``, the fewest workers the batch has had, serves its in-flight
    trajectories on ``n_eff = sticky_pool(B, n_low, N, s)`` workers, as ``pool_schedule``
    predicts it; every other piece on its own. None if the pool was emptied (no allocation)."""
    t, cur, n_low = start, ran, ran.n_workers
    out: list[tuple[Allocation, float, float]] = []

    def piece(a: Allocation, dt: float) -> tuple[Allocation, float, float]:
        grown = a.mode is Mode.COLOCATED and a.n_workers > n_low
        return a, dt, sticky_pool(batch, n_low, a.n_workers, slack) if grown else float(a.n_workers)

    for at, alloc in changes:
        if at > t:
            out.append(piece(cur, min(at, end) - t))
            t = min(at, end)
        if alloc is None:
            return None
        n_low = min(n_low, cur.n_workers)
        cur = alloc
    out.append(piece(cur, end - t))
    return [p for p in out if p[1] > 0]


def sync_stall(o: PoolOutlook, d: Decision, trainer_waits: bool, segments: tuple[Segment, ...],
               m_hat: float) -> float:
    """The weight sync that ends the training step started at this batch's start, when it lands
    inside the batch: at ``t_s = d_ret + T`` (``d_ret`` only when lent workers leave: the step
    waits for their return), on the pool of the segment in force then, at the batch's progress
    ``p = batch_progress(segments, t_s)``; ``makespan.sync_stall_s`` with the sync pause EMA
    (``CostModel.weight_sync_s``). A split divides the prefill work by ``max(N_P n_s / N, 1)``.
    0 when the trainer has no batch waiting, before any training step was seen, without the
    decision's profiles, or when ``t_s >= m_hat``."""
    if not (trainer_waits and o.trainer.steps_seen and d.hw is not None and d.wl is not None):
        return 0.0
    t_s = (o.costs.deactivation_s if lent_leaving(o, d.n_workers) else 0.0) + o.trainer.step_s
    if t_s >= m_hat:
        return 0.0
    n_s = next((n for t, _m, n in reversed(segments) if t <= t_s), d.n_workers)
    prog = batch_progress(_schedule(segments), t_s)
    if d.target.mode is Mode.DISAGGREGATED:
        div = max(d.target.n_prefill * n_s / max(d.n_workers, 1), 1.0)
        return sync_stall_s(d.hw, d.wl, d.batch, prog, div, o.costs.weight_sync_s,
                            disaggregated=True)
    return sync_stall_s(d.hw, d.wl, d.batch, prog, float(n_s), o.costs.weight_sync_s)


def batch_forecast(o: PoolOutlook, trainer_waits: bool) -> float:
    """The batch forecast of a rollout batch starting now: ``M_hat + stall``.

    ``M_cur`` is decided again at the start (``o.decider`` holds the profiles refit when the
    previous batch ended; the re-plan that acts on them is queued behind the start) on the
    decision's workers against the incumbent; ``M_hat = pool_schedule(...)``, ``stall =
    sync_stall(...)``. ``trainer_waits``: the trainer has the previous batch to train on (from
    the second batch of a run on). NaN without a decision in force; ``M_cur`` or ``M_hat`` as they
    are when not a positive number."""
    if o.decision is None:
        return math.nan
    d = o.decider.decide(o.decision.n_workers, o.allocation)
    m_cur = d.predicted_makespan_s
    if not math.isfinite(m_cur) or m_cur <= 0:
        return m_cur
    m_hat, segments = pool_schedule(o, d, trainer_waits)
    if not (math.isfinite(m_hat) and m_hat > 0):
        return m_hat
    return m_hat + sync_stall(o, d, trainer_waits, segments, m_hat)


def speeds_since(speeds: list[tuple[float, float]] | tuple[tuple[float, float], ...],
                 batch_started_at: float) -> tuple[tuple[float, float], ...]:
    """The ``(time, decided makespan)`` entries from the one in force at ``batch_started_at`` on
    (the last entry at or before it, and every later one)."""
    cut = 0
    for i, (t, _m) in enumerate(speeds):
        if t <= batch_started_at:
            cut = i
    return tuple(speeds[cut:])


def remaining_s(o: PoolOutlook) -> float:
    """The running batch's remaining time at the current speed (the borrow gate's ``remaining``).

    The batch has progressed under each decision in force since it started at ``1 / M_i`` (``M_i``
    that decision's decided makespan; the progress model of ``compose_makespan``)::

        p = sum_i (t_{i+1} - t_i) / M_i     over [batch start, now]
        R = (1 - p) * M_now                 while p < 1
        R = (running / B) * M_now           once it has overrun (a fraction of the batch is still
                                            running; assume it needs that fraction of a batch time)

    With one decision over the batch, ``R = M - elapsed``. 0 without a decision in force or when
    its makespan is not a positive number."""
    ms = o.decision.predicted_makespan_s if o.decision is not None else 0.0
    if not math.isfinite(ms) or ms <= 0:
        return 0.0
    t_b = o.batch_started_at
    pieces = [(max(t - t_b, 0.0), m) for t, m in speeds_since(o.speeds, t_b)] or [(0.0, ms)]
    prog = batch_progress(pieces, o.now - t_b)
    if prog < 1.0:
        return (1.0 - prog) * ms
    return o.remaining_trajectories / max(o.batch_size, 1) * ms


def hold_s(o: PoolOutlook, n: int, batch_boundary: bool, makespan_s: float) -> float:
    """Seconds a budget of ``n`` workers is known to hold (the switch gate's ``T_hold``).

    Lent training GPUs leave when the next training step starts: at a batch boundary (a rollout
    batch has just ended, the step starts now) after the return's ``d_ret``; mid-batch when the
    running batch ends, after its remaining work at this budget's speed, ``T = R * M / M_old``
    (``R = remaining_s``, at the speed of the decision in force ``M_old``; ``M`` = ``makespan_s``,
    the current allocation's decided makespan on this budget; ``M / M_old = 1`` when either is not
    a positive number). A reclaim notice takes its GPUs when its shrink starts. The earliest of
    these; ``math.inf`` when no shrink is known."""
    t = math.inf
    if lent_leaving(o, n) and not o.trainer.running:
        if batch_boundary:
            t = o.costs.deactivation_s
        else:
            m_old = o.decision.predicted_makespan_s if o.decision is not None else math.nan
            scale = makespan_s / m_old if math.isfinite(m_old) and m_old > 0 and math.isfinite(makespan_s) else 1.0
            t = remaining_s(o) * scale
    for off, delta, _regrow in pool_changes(o, False, n):
        if delta < 0:
            t = min(t, off)
    return t


@dataclass(frozen=True, slots=True)
class SwitchHold:
    """``hold_switch``'s answer: the ``decision`` to act on, the switch ``gate`` evaluated (None
    when none was) and the allocation in force projected onto the budget (None when unused)."""

    decision: Decision
    gate: GateDecision | None = None
    projected: Allocation | None = None

    @property
    def held(self) -> bool:
        """The gate declined the switch: ``decision`` keeps the projected allocation."""
        return self.gate is not None and not self.gate.admit


def hold_switch(o: PoolOutlook, d: Decision, batch_boundary: bool, stalled_fraction: float) -> SwitchHold:
    """Keep the allocation in force (projected onto ``d``'s budget) when a mode or ratio switch to
    ``d.target`` cannot pay back before the budget is known to shrink: ``gate.switch_gate`` with
    the projection's decided makespan ``M``, ``d``'s, ``T_hold = hold_s(o, N, batch_boundary, M)``
    and the ``stalled_fraction`` of the serving workers the switch re-roles.

    ``d`` unchanged, with no gate evaluated: a first decision, a decision that does not switch, a
    forced switch (the projection is infeasible), an ``allocation_overrides`` entry (an explicit
    schedule: the oracle's, a fixed-allocation measurement), a projection equal to the target or
    absent from the table, and an infinite ``T_hold``."""
    found = _kept(o, d)
    if found is None:
        return SwitchHold(d)
    kept, _c = found
    proj, m_cur = kept.target, kept.predicted_makespan_s
    hold = hold_s(o, d.n_workers, batch_boundary, m_cur)
    if math.isinf(hold):
        return SwitchHold(d)
    gate = switch_gate(m_cur, d.predicted_makespan_s, hold, o.costs, o.decider.policy,
                       stalled_fraction=stalled_fraction)
    if gate.admit:
        return SwitchHold(d, gate, proj)
    held = replace(kept, reason=f"hold {proj.label}: {d.target.label} declined by the switch gate ({gate.reason})")
    return SwitchHold(held, gate, proj)


def _kept(o: PoolOutlook, d: Decision) -> tuple[Decision, Candidate] | None:
    """``d`` with the allocation in force projected onto its budget as the target (its candidate's
    makespan, ``switched`` when the projection is not the allocation itself): what a hold keeps,
    with the projection's candidate. None when there is nothing to hold: no allocation in force,
    no switch, a forced switch, an ``allocation_overrides`` entry, or a projection equal to the
    target or absent from the table."""
    cur, policy = o.allocation, o.decider.policy
    if cur is None or not d.switched or d.forced or d.n_workers in policy.allocation_overrides:
        return None
    proj = project(cur, d.n_workers, policy)
    idx = d.table.index_of(proj)
    if d.target == proj or idx is None:
        return None
    c = d.table.candidate(idx)
    return replace(d, target=proj, predicted_makespan_s=c.makespan_s, switched=proj != cur), c


@dataclass(frozen=True, slots=True)
class ScheduleHold:
    """``hold_for_schedule``'s answer: the ``decision`` to act on and, when the switch was weighed
    (``weighed``), the composed makespans ``M_hat`` of the incumbent's projection (``old_s``) and
    of the switch's target (``new_s``), the ``saving`` and the ``threshold`` it had to exceed."""

    decision: Decision
    weighed: bool = False
    old_s: float = math.nan
    new_s: float = math.nan
    saving: float = math.nan
    threshold: float = math.nan

    @property
    def held(self) -> bool:
        return self.weighed and not self.saving > self.threshold

    def to_dict(self) -> dict[str, object]:
        outcome = GateOutcome.SAVING_BELOW_THRESHOLD if self.held else GateOutcome.ADMITTED
        return {"admit": not self.held, "outcome": outcome.value,
                "old_s": round(self.old_s, 3), "new_s": round(self.new_s, 3), "saving": round(self.saving, 4),
                "threshold": round(self.threshold, 4), "reason": self.decision.reason}


def hold_for_schedule(o: PoolOutlook, d: Decision, trainer_waits: bool) -> ScheduleHold:
    """Weigh a mode or ratio switch over the pool changes known to come within the batch.

    ``decide`` compares candidates on the budget of the moment, ``N``; a batch whose pool is known to change
    (``pool_changes``: a running training step's overlap GPUs coming back, a reclaim, an expansion)
    runs its later part on another budget, where the ranking may be reversed. With ``P`` the
    allocation in force projected onto ``N`` and ``T`` = ``d.target``::

        M_hat(a) = pool_schedule(o, d with target a and a's predicted makespan, trainer_waits)
        saving   = (M_hat(P) - M_hat(T)) / M_hat(P)

    The switch stands only if ``saving`` exceeds the threshold ``decide`` applied between the two
    (``decision.switch_threshold``, its switch cost weighed against ``M_hat(P)``); else ``P`` is
    kept. Modelling choice: only the incumbent is weighed against the chosen target (this holds a
    switch, it never starts one). ``d`` unchanged and not weighed: no allocation in force, no
    switch, a forced switch, the policy's ``weigh_pool_schedule`` off, an override
    (``allocation_overrides``, ``force_disaggregation``), a
    projection that is not a feasible candidate, no pool change known, or a composed makespan that
    is not a positive number."""
    policy = o.decider.policy
    found = _kept(o, d) if policy.weigh_pool_schedule and not policy.force_disaggregation else None
    i_new = d.table.index_of(d.target)
    if found is None or i_new is None or not pool_changes(o, trainer_waits, d.n_workers):
        return ScheduleHold(d)
    kept, c_old = found
    proj, c_new = kept.target, d.table.candidate(i_new)
    if not c_old.feasible:
        return ScheduleHold(d)
    new_s, _ = pool_schedule(o, d, trainer_waits)
    old_s, _ = pool_schedule(o, kept, trainer_waits)
    if not all(math.isfinite(m) and m > 0 for m in (new_s, old_s)):
        return ScheduleHold(d)
    saving = (old_s - new_s) / old_s
    threshold, why = switch_threshold(c_old, c_new, old_s, d.n_workers, d.batch, d.hw, d.wl, policy) \
        if d.hw is not None and d.wl is not None else (policy.ratio_switch_threshold, "ratio threshold")
    if saving > threshold:
        return ScheduleHold(d, True, old_s, new_s, saving, threshold)
    held = replace(kept, reason=f"hold {proj.label}: {d.target.label} would save only {saving:.1%} over the "
                                f"batch's known pool changes ({old_s:.1f} s -> {new_s:.1f} s) <= {why}")
    return ScheduleHold(held, True, old_s, new_s, saving, threshold)
