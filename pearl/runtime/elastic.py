"""Elastic Scheduler (paper Sec. 4.1.2): one event queue -> decide -> plan -> execute.

Every elastic event (the door's outside events, trainer, tracker) enters ``submit``; one owner
task (``run``) handles them one at a time, so decisions never interleave: urgent events (a due
shrink) first, the rest in arrival order. Each handler is observe -> decide -> act: it gathers a
frozen ``PoolOutlook`` (``outlook()``), calls one pure function of ``pearl.core.elastic_step``
(``replan_step``, ``expansion_step``, ``borrow_step``) and applies what it returns:

================  ==============================================================================
event             handling
================  ==============================================================================
GpusGranted       add the preemptible GPUs to the state (unless ``policy.use_preemptible`` is off);
                  expansion gate (``expansion_gate``: fresh makespan ``M(n)`` now vs with the new
                  workers, expected GPU lifetime, EMA costs); admitted -> the Rebuilder prepares
                  the group in the background; declined GPUs stay idle and are reconsidered on the
                  next profile refit
(expansion ready) internal: stage the group, re-plan with it (decide -> plan -> execute role
                  changes), then admit every member at once
(worker failed)   internal, from the pipeline: remove the worker from the state, re-plan (a free
                  reserved GPU gets a new worker through a background expansion)
ReclaimNotice     arm or tighten its notice (``pearl.runtime.notices``: keyed by ``ReclaimKey``, the
                  earliest deadline wins); its timer queues the shrink at ``deadline -
                  lead`` (the margin, or longer after slow shrinks: pearl/runtime/notices.py;
                  at once if that has passed) as an urgent event
(shrink due)      internal, urgent: the Rebuilder's shrink, then a re-plan of the survivors; the
                  shrunk GPUs leave every other notice (no timer outlives its grant)
NoticeCancelled   drops a pending shrink (too late once it started: reported as not applied)
TrainingStarted   mandatory return of borrowed overlap GPUs (Toggle Manager); the submitter's
                  ``wait`` resolves as soon as the GPUs are back; then survivors are re-planned
TrainingFinished  borrow gate (``borrow_gate``: fresh makespans now vs with the lent workers,
                  window = ``expected_idle_s`` or the running batch's remaining time
                  ``outlook.remaining_s``); admitted -> lend + re-plan (ACTIVATE retained workers)
ProfileRefit      re-plan with the refit profiles (the decision engine's hysteresis decides whether
                  the mode / ratio changes; a batch has just ended, so lent GPUs leave now: the
                  switch gate) and reconsider declined preemptible GPUs
================  ==============================================================================

Re-plan (``replan``): ``elastic_step.replan_step`` decides the target once (decide, overrides,
switch hold) and plans it on the rollout budget; the executor runs the plan; ADD steps become a
background expansion group. ``replan`` returns a ``ReplanOutcome``.

Forecasts (the batch forecast recorded at each batch start, the running batch's remaining time,
how long the budget holds) are pure functions of a frozen ``PoolOutlook`` (``outlook()``: the
decision in force, lent GPUs, reclaim notices, expansions in preparation, measured costs) in
``pearl.core.outlook``.

Idempotency is the door's (``pearl.runtime.door``): the scheduler handles every event it is
given, so a client's id can never suppress one of the runtime's own. Every handled event,
decision and plan is appended to ``history`` (bounded), newest last (``watch(kind)``: a future of
the next entry of a kind); reconfigurations are counted by kind in ``reconfigurations``.

Public names: ``ElasticScheduler``, ``ReplanOutcome``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from pearl.config import RunConfig
from pearl.core.decision import Allocation, Decision, DecisionError
from pearl.core.elastic_step import (
    LIFETIME_EMA_ALPHA,
    ReplanStep,
    borrow_step,
    costs_from_policy,
    expansion_step,
    replan_step,
    rollout_budget,
    slots,
    switch_kind,
)
from pearl.core.events import (
    ElasticEvent,
    GpusGranted,
    NoticeCancelled,
    ProfileRefit,
    ReclaimKey,
    ReclaimNotice,
    TrainingFinished,
    TrainingStarted,
)
from pearl.core.gate import CostKind
from pearl.core.outlook import (
    Expansion,
    PoolOutlook,
    Reclaim,
    SwitchHold,
    TrainerView,
    batch_forecast,
    speeds_since,
)
from pearl.core.override import Decider
from pearl.core.planner import Plan, PlanError, StepKind, free_groups
from pearl.core.state import Gpu, WorkerStatus, Zone
from pearl.runtime.clock import Clock
from pearl.runtime.control import SubmitResult
from pearl.runtime.executor import ExecutionReport, PlanExecutor
from pearl.runtime.notices import ArmedNotice, NoticeBook
from pearl.runtime.pipeline import PipelineScheduler
from pearl.runtime.rebuilder import ClusterRebuilder, ExpansionGroup, GroupStatus
from pearl.runtime.toggle import ToggleManager
from pearl.runtime.tracker import RuntimeTracker


@dataclass(frozen=True, slots=True)
class _ExpansionDone:
    """Internal event: an expansion group finished preparing (ready or failed)."""

    group_id: str
    event_id: str = ""


@dataclass(frozen=True, slots=True)
class _Replan:
    """Internal event: re-plan, then consider the free preemptible GPUs again (the retry of a
    failed expansion)."""

    reason: str
    event_id: str = ""


@dataclass(frozen=True, slots=True)
class _ShrinkDue:
    """Internal event, put by a notice's timer: the shrink of ``notice`` is due (urgent: handled
    before every event queued that is not urgent)."""

    notice: ArmedNotice
    event_id: str = ""


@dataclass(frozen=True, slots=True)
class _WorkerFailed:
    """Internal event: a worker died or failed to load weights; remove it and re-plan."""

    worker_id: str
    reason: str
    event_id: str = ""


@dataclass(frozen=True, slots=True)
class ReplanOutcome:
    """What one ``replan`` did: the ``decision`` acted on and its ``plan`` (None when nothing was
    decided: an empty budget, or ``error``, the decision's or planner's refusal), the executor's
    ``report`` (None when nothing ran), the switch gate's answer (``switch``), and the expansion
    group started for the plan's ADD steps (``expansion``: its id, None when none)."""

    reason: str
    decision: Decision | None = None
    plan: Plan | None = None
    report: ExecutionReport | None = None
    switch: SwitchHold | None = None
    expansion: str | None = None
    error: str = ""

    @property
    def errors(self) -> tuple[str, ...]:
        """Every error of the re-plan: the refusal, then the failed steps."""
        return ((self.error,) if self.error else ()) + tuple(self.report.errors if self.report else ())


class ElasticScheduler:
    """The event queue and its handlers (module docstring) over the collaborators it is given: the
    ``executor`` (the state and its changes), the ``rebuilder`` (shrink, expansion), the ``toggle``
    manager (lent training GPUs), the ``tracker`` (the profiles decisions are made on) and the
    ``pipeline`` (its router's placement slack, the running batch's start and trajectories)."""

    def __init__(
        self,
        cfg: RunConfig,
        clock: Clock,
        executor: PlanExecutor,
        rebuilder: ClusterRebuilder,
        toggle: ToggleManager,
        tracker: RuntimeTracker,
        pipeline: PipelineScheduler,
        *,
        shrink_margin_s: float = 5.0,
        expected_lifetime_s: float = 1800.0,
        history_limit: int = 2000,
    ) -> None:
        self.cfg = cfg
        self.policy = cfg.policy
        self.clock = clock
        self.executor = executor
        self.rebuilder = rebuilder
        self.toggle = toggle
        self.tracker = tracker
        self.pipeline = pipeline
        self.shrink_margin_s = shrink_margin_s
        self.expected_lifetime_s = expected_lifetime_s  # EMA of observed preemptible lifetimes
        self.costs = costs_from_policy(cfg.policy)
        self.decision: Decision | None = None
        self.allocation: Allocation | None = None
        #: how many times ``allocation`` has changed (a budget change, a mode or ratio switch): a
        #: batch that saw no change ran one configuration throughout
        self.allocation_changes = 0
        #: the latest changes: ``(allocation_changes after it, time, allocation)``
        self.allocation_log: deque[tuple[int, float, Allocation | None]] = deque(maxlen=history_limit)
        self.history: deque[dict[str, Any]] = deque(maxlen=history_limit)
        self.reconfigurations: Counter[str] = Counter()
        #: the training steps observed: the expected step (EMA, ``cost_ema_alpha``, of observed
        #: spans from the prior ``train.step_time_s``), steps seen, the idle window the borrow gate
        #: weighed last (the batch forecast replays that gate for a lend that returns mid-batch)
        self.trainer = TrainerView(float(cfg.train.step_time_s))
        #: (time, decided makespan) of each decision since the one in force at the running
        #: batch's start (``outlook.remaining_s``)
        self._speeds: list[tuple[float, float]] = []
        self.granted_at: dict[str, float] = {}
        self.shrinks: list[dict[str, Any]] = []
        self.gate_log: list[dict[str, Any]] = []
        #: (urgency: 0 a due shrink, 1 the rest; arrival; event; its waiter)
        self._queue: asyncio.PriorityQueue[tuple[int, int, object, asyncio.Future[None] | None]] = (
            asyncio.PriorityQueue())
        self._arrivals = 0
        self._task: asyncio.Task[None] | None = None
        self._pending = 0
        self._idle = asyncio.Event()
        self._timers: set[asyncio.Task[None]] = set()
        self.book = NoticeBook(clock, shrink_margin_s, self._timers, self._queue_shrink, self._log)
        self._watchers: dict[str, list[asyncio.Future[dict[str, Any]]]] = {}

    # ------------------------------------------------------------------ life cycle
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run(), name="elastic-scheduler")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._timers) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._task = None
        self._timers.clear()

    async def run(self) -> None:
        while True:
            _urgency, _seq, ev, done = await self._queue.get()
            try:
                await self._handle(ev, done)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a failed handler must not kill the scheduler
                self.reconfigurations["handler_errors"] += 1
                self._log("error", event=_describe(ev), error=f"{type(e).__name__}: {e}")
            finally:
                if done is not None and not done.done():
                    done.set_result(None)
                self._pending -= 1
                if not self._pending:
                    self._idle.set()
                    self._idle = asyncio.Event()

    async def idle(self) -> None:
        """Wait until every queued event has been handled (tests, shutdown)."""
        while self._pending:
            await self._idle.wait()

    # ------------------------------------------------------------------ submission
    async def submit(self, event: ElasticEvent, wait: bool = False) -> SubmitResult:
        """Validate and queue ``event``; with ``wait`` return once it has been handled (for
        ``TrainingStarted``: once the borrowed GPUs are back)."""
        eid = event.event_id
        detail = self._validate(event)
        if isinstance(event, ReclaimNotice):
            self.book.queued[event.key] += 1
        done: asyncio.Future[None] | None = asyncio.get_running_loop().create_future() if wait else None
        self._put(event, done)
        if done is not None:
            await done
        return SubmitResult(applied=True, event_id=eid, detail=detail)

    def _put(self, ev: object, done: asyncio.Future[None] | None = None, urgent: bool = False) -> None:
        self._pending += 1
        self._arrivals += 1
        self._queue.put_nowait((0 if urgent else 1, self._arrivals, ev, done))

    def _validate(self, ev: ElasticEvent) -> str:
        state = self.executor.state
        if isinstance(ev, GpusGranted):
            if not ev.gpus:
                raise ValueError("gpus: a grant must name at least one GPU")
            dup = [g.gpu_id for g in ev.gpus if g.gpu_id in state.gpus]
            if dup:
                raise ValueError(f"gpus: {dup} are already in the cluster; grant new GPU ids")
            return f"{len(ev.gpus)} GPUs granted"
        if isinstance(ev, ReclaimNotice | NoticeCancelled):
            return self.book.validate(ev, state, self.rebuilder.preparing_gpus())
        return ""

    # ------------------------------------------------------------------ dispatch
    async def _handle(self, ev: object, done: asyncio.Future[None] | None) -> None:
        if isinstance(ev, GpusGranted):
            await self._on_grant(ev)
        elif isinstance(ev, ReclaimNotice):
            self._on_notice(ev)
        elif isinstance(ev, NoticeCancelled):
            self.book.cancel(ev)
        elif isinstance(ev, TrainingStarted):
            await self._on_training_started(ev, done)
        elif isinstance(ev, TrainingFinished):
            await self._on_training_finished(ev)
        elif isinstance(ev, ProfileRefit):
            await self.replan(f"profile refit after rollout step {ev.step}", batch_boundary=True)
            await self._consider_expansion("profile refit")
        elif isinstance(ev, _ExpansionDone):
            await self._on_group_done(ev)
        elif isinstance(ev, _ShrinkDue):
            await self._on_shrink_due(ev)
        elif isinstance(ev, _Replan):
            await self.replan(ev.reason)
            await self._consider_expansion(ev.reason)
        elif isinstance(ev, _WorkerFailed):
            await self._on_worker_failed(ev)

    # ------------------------------------------------------------------ budget and decisions
    def budget(self) -> frozenset[str]:
        """GPUs rollout may use now (``elastic_step.rollout_budget``)."""
        return rollout_budget(self.executor.state)

    def slots(self, budget: frozenset[str]) -> int:
        return slots(self.executor.state, budget, self.cfg.cluster.tp_size)

    def use_overrides(self, overrides: Mapping[int, str]) -> None:
        """Decide with ``policy.allocation_overrides = overrides`` from now on (a schedule of
        allocations: the oracle's plan, a fixed-allocation measurement)."""
        self.policy = self.policy.model_copy(update={"allocation_overrides": dict(overrides)})

    def decider(self) -> Decider:
        """The decision with the policy's overrides on the tracker's current profiles."""
        return Decider(self.cfg.workload.batch_size, self.tracker.hardware, self.tracker.workload, self.policy)

    def outlook(self) -> PoolOutlook:
        """A frozen view of what is known about the pool now (``pearl.core.outlook``)."""
        state = self.executor.state
        tp = self.cfg.cluster.tp_size
        t_b = self.pipeline.stats.batch_started_at
        self._speeds = list(speeds_since(self._speeds, t_b))
        reclaims = tuple(
            Reclaim(n.deadline, frozenset(n.gpus),
                    len({w for g in n.gpus if g in state.gpus and (w := state.owner_of(g)) is not None
                         and state.workers[w].status is WorkerStatus.ACTIVE}), n.started)
            for n in self.notices.values())
        expansions = tuple(Expansion(frozenset(g.gpus), len(g.members), g.started_at, g.ready_at)
                           for g in self.rebuilder.pending())
        overlap = len(self.toggle.overlap_gpus()) // max(tp, 1)
        return PoolOutlook(
            now=self.clock.now(), decider=self.decider(), costs=self.costs, decision=self.decision,
            allocation=self.allocation,
            lent_workers=overlap if self.toggle.borrowed else 0,
            returning_workers=(overlap if self.trainer.running and self.policy.borrow_enabled and not self.toggle.borrowed
                               else 0),
            trainer=self.trainer, reclaims=reclaims, expansions=expansions,
            shrink_margin_s=self.book.lead_s,
            placement_slack=float(self.pipeline.router.placement_slack(self.tracker.hardware, self.tracker.workload)),
            batch_started_at=t_b, speeds=tuple(self._speeds),
            remaining_trajectories=self.pipeline.remaining_trajectories())

    def batch_forecast(self, trainer_waits: bool) -> float:
        """The batch forecast of a rollout batch starting now (``outlook.batch_forecast``)."""
        return batch_forecast(self.outlook(), trainer_waits)

    def observe_weight_sync(self, seconds: float) -> None:
        """A weight sync paused a batch in flight for ``seconds`` (EMA ``CostModel.weight_sync_s``)."""
        self.costs = self.costs.observe(CostKind.WEIGHT_SYNC, seconds)

    async def replan(self, reason: str, batch_boundary: bool = False) -> ReplanOutcome:
        """Decide on the current budget, plan, execute. ``batch_boundary``: a rollout batch has just
        ended, so a training step starts now and takes any lent GPUs back (``outlook.hold_s``)."""
        budget = self.budget()
        n = self.slots(budget)
        state = self.executor.state
        if n < 1:
            rep = ExecutionReport()
            gone = [w for w, wk in state.workers.items() if not all(g in budget for g in wk.gpus)
                    and wk.status is not WorkerStatus.INACTIVE]
            await asyncio.gather(*(self.executor.remove(w, rep) if state.zone_of(state.workers[w]) is not Zone.OVERLAP
                                   else self.executor.deactivate(w, rep) for w in gone))
            self._log("replan", reason=reason, detail="no rollout GPU in the budget: nothing to decide")
            self._set_allocation(None)
            return ReplanOutcome(reason, report=rep)
        try:
            step = replan_step(self.outlook(), state, budget, self.cfg.cluster.tp_size, batch_boundary)
        except (DecisionError, PlanError) as e:
            self._log("replan", reason=reason, error=str(e))
            return ReplanOutcome(reason, error=str(e))
        d, p, held = step.decision, step.plan, step.switch
        self._log_switch(step)
        if (kind := switch_kind(self.allocation, d.target, self.policy)) is not None:
            self.reconfigurations[kind] += 1
        self.decision = d
        self._set_allocation(d.target)
        self._speeds.append((self.clock.now(), d.predicted_makespan_s))
        self._speeds = list(speeds_since(self._speeds, self.pipeline.stats.batch_started_at))
        # A GPU whose worker is still being prepared by an expansion group is not free: that group
        # provides it (a second ADD there would launch two servers on one GPU).
        preparing = self.rebuilder.preparing_gpus()
        adds = [s for s in p.of_kind(StepKind.ADD) if not preparing.intersection(s.gpus)]
        rep = await self.executor.execute(p)
        group = None
        if adds:
            grp = self.rebuilder.expand({s.worker_id: (s.gpus, s.role) for s in adds}, self._on_group_ready)
            group = grp.group_id
            self._log("expand_started", group=grp.group_id, workers=sorted(grp.members), reason=reason)
        for sec in rep.timings.get("activate", []):
            self.costs = self.costs.observe(CostKind.ACTIVATION, sec)
        self._log("replan", reason=reason, decision=d.to_dict(), plan=p.to_dict(),
                  executed={"steps": rep.steps, "aborted_requests": rep.aborted_requests, "seconds": rep.seconds,
                            "errors": rep.errors})
        if rep.errors:
            self.reconfigurations["errors"] += len(rep.errors)
        return ReplanOutcome(reason, decision=d, plan=p, report=rep, switch=held, expansion=group)

    def _set_allocation(self, target: Allocation | None) -> None:
        if target != self.allocation:
            self.allocation_changes += 1
            self.allocation_log.append((self.allocation_changes, self.clock.now(), target))
        self.allocation = target

    def allocations_since(self, changes: int) -> list[tuple[float, Allocation | None]] | None:
        """``(time, allocation)`` of each change after the ``changes``-th, oldest first; None if
        the log no longer holds them all."""
        out = [(t, a) for k, t, a in self.allocation_log if k > changes]
        return out if len(out) == self.allocation_changes - changes else None

    def _log_switch(self, step: ReplanStep) -> None:
        """Log the schedule hold and the switch gate when ``replan_step`` evaluated them."""
        sched = step.schedule
        if sched.weighed:
            self.gate_log.append({"t": self.clock.now(), "kind": "schedule",
                                  "from": self.allocation.label if self.allocation is not None else "",
                                  "to": step.wish.target.label, **sched.to_dict()})
            if sched.held:
                self._log("switch_declined", current=sched.decision.target.label, target=step.wish.target.label,
                          schedule=sched.to_dict())
        held, to = step.switch, step.wish.target.label
        if held.gate is None or held.projected is None:
            return
        self.gate_log.append({"t": self.clock.now(), "kind": "switch", "from": held.projected.label, "to": to,
                              **held.gate.to_dict()})
        if held.held:
            self._log("switch_declined", current=held.projected.label, target=to, gate=held.gate.to_dict())

    # ------------------------------------------------------------------ inter-scale
    async def _on_grant(self, ev: GpusGranted) -> None:
        if not self.policy.use_preemptible:
            self._log("grant_declined", gpus=[g.gpu_id for g in ev.gpus], reason="policy.use_preemptible is off")
            return
        new = [Gpu(g.gpu_id, Zone.PREEMPTIBLE, g.node, g.instance_id) for g in ev.gpus
               if g.gpu_id not in self.executor.state.gpus]
        if new:
            self.executor.set_state(self.executor.state.add_gpus(new))
        now = self.clock.now()
        for g in new:
            self.granted_at[g.gpu_id] = now
        self._log("grant", gpus=[g.gpu_id for g in new])
        await self._consider_expansion(f"grant of {len(new)} GPUs")

    def _candidates(self) -> list[tuple[str, ...]]:
        """Free preemptible GPU groups that are neither preparing nor under a reclaim notice."""
        state = self.executor.state
        busy = self.rebuilder.preparing_gpus() | self.book.gpus()
        free = [g for g in state.free_gpus([Zone.PREEMPTIBLE]) if g not in busy]
        return free_groups(state, free, self.cfg.cluster.tp_size)

    async def _consider_expansion(self, reason: str) -> None:
        groups = self._candidates()
        if not groups:
            return
        pending = sum(len(g.members) for g in self.rebuilder.pending())
        step = expansion_step(self.outlook(), self.executor.state, self.budget(), groups,
                              self.rebuilder.preparing_gpus(), pending, self.cfg.cluster.tp_size,
                              self.expected_lifetime_s)
        if step.gate is None:
            self._log("expand_declined", reason=reason, error=step.error)
            return
        self.gate_log.append({"t": self.clock.now(), "kind": "expansion", **step.gate.to_dict()})
        if not step.gate.admit:
            self._log("expand_declined", reason=reason, gate=step.gate.to_dict(), gpus=sorted(step.gpus))
            return
        if not step.members:
            return
        grp = self.rebuilder.expand(step.members, self._on_group_ready)
        self.reconfigurations["expansion_started"] += 1
        self._log("expand_started", group=grp.group_id, workers=sorted(grp.members), gate=step.gate.to_dict(),
                  reason=reason)

    def _on_group_ready(self, grp: ExpansionGroup) -> None:
        self._put(_ExpansionDone(grp.group_id))

    async def _on_group_done(self, ev: _ExpansionDone) -> None:
        grp = self.rebuilder.groups.get(ev.group_id)
        if grp is None:
            return
        if grp.status is GroupStatus.FAILED:
            self.reconfigurations["expansion_failed"] += 1
            self._log("expand_failed", group=grp.group_id, error=grp.error)
            self._replan_later(f"expansion {grp.group_id} failed: re-plan the missing workers")
            return
        if grp.status is not GroupStatus.READY:
            return
        for sec in grp.prep_s.values():
            self.costs = self.costs.observe(CostKind.EXPANSION_PREP, sec)
        t0 = self.clock.now()
        if not await self.rebuilder.stage(grp):
            self.reconfigurations["expansion_failed"] += 1
            self._log("expand_failed", group=grp.group_id, error=grp.error)
            self._replan_later(f"expansion {grp.group_id} failed: re-plan the missing workers")
            return
        await self.replan(f"admitting expansion {grp.group_id}")
        admitted = self.rebuilder.admit(grp)
        final = max(grp.final_s.values(), default=0.0) + (self.clock.now() - t0)
        self.costs = self.costs.observe(CostKind.EXPANSION_FINAL, final)
        self.reconfigurations["expansion"] += 1
        self._log("expand_admitted", group=grp.group_id, workers=admitted, wait_s=self.clock.now() - grp.started_at)

    @property
    def notices(self) -> dict[ReclaimKey, ArmedNotice]:
        """The armed reclaim notices by key (``NoticeBook``)."""
        return self.book.notices

    def _on_notice(self, ev: ReclaimNotice) -> None:
        if not self.book.note(ev):
            return
        now = self.clock.now()
        for g in ev.gpu_ids:  # a new reclaim: the lifetime its GPUs had teaches ``T_life``
            t = self.granted_at.pop(g, None)
            if t is not None:
                self.expected_lifetime_s += LIFETIME_EMA_ALPHA * ((now - t) - self.expected_lifetime_s)

    async def _queue_shrink(self, notice: ArmedNotice) -> None:
        """A notice's timer fired: queue its shrink (urgent); return once it and the survivors'
        re-plan are done."""
        done = asyncio.get_running_loop().create_future()
        self._put(_ShrinkDue(notice), done, urgent=True)
        await done

    async def _on_shrink_due(self, ev: _ShrinkDue) -> None:
        notice = ev.notice
        if not self.book.take(notice):
            return
        rep = await self.rebuilder.shrink(notice.gpus, notice.deadline)
        self.book.finish(notice)
        lead = self.book.observe(notice, rep.released_at)
        self.reconfigurations["shrink"] += 1
        self.shrinks.append(rep.to_dict())
        self._log("shrink", notice=notice.notice_id, **rep.to_dict(), next_lead_s=lead)
        await self.replan(f"re-plan survivors after reclaim {notice.notice_id}")

    def _replan_later(self, reason: str, delay_s: float = 30.0) -> None:
        """A failed expansion leaves the planned topology short (e.g. a replacement prefill worker
        that did not start: nothing could serve) and its preemptible GPUs idle; re-plan after
        ``delay_s`` and consider those GPUs again, behind the expansion gate (a bounded retry rate
        when launches keep failing; the retry's workers get fresh ids, ``ClusterRebuilder.expand``).
        The timer is owned like the shrink timers."""

        async def later() -> None:
            await self.clock.sleep(delay_s)
            self._put(_Replan(reason))

        task = asyncio.get_running_loop().create_task(later(), name="replan-after-failure")
        self._timers.add(task)
        task.add_done_callback(self._timers.discard)

    def worker_failed(self, worker_id: str, reason: str) -> None:
        """A worker died or could not load weights (the pipeline's ``PipelineHooks.worker_failed``)."""
        self._put(_WorkerFailed(worker_id, reason))

    async def _on_worker_failed(self, ev: _WorkerFailed) -> None:
        if ev.worker_id not in self.executor.state.workers:
            return
        rep = ExecutionReport()
        await self.executor.remove(ev.worker_id, rep)
        self.reconfigurations["worker_failed"] += 1
        self._log("worker_failed", worker=ev.worker_id, reason=ev.reason[:300])
        await self.replan(f"worker {ev.worker_id} failed: replace it")

    # ------------------------------------------------------------------ intra-scale
    async def _on_training_started(self, ev: TrainingStarted, done: asyncio.Future[None] | None) -> None:
        self.trainer = self.trainer.started(self.clock.now())
        had = self.toggle.borrowed
        rep = await self.toggle.give_back()
        if done is not None and not done.done():
            done.set_result(None)  # training may start: its GPUs are back
        if had:
            self.costs = self.costs.observe(CostKind.DEACTIVATION, rep.delay_s)
            self.reconfigurations["return"] += 1
            self._log("return", step=ev.step, **rep.to_dict())
            await self.replan(f"training step {ev.step} started: borrowed GPUs returned")

    async def _on_training_finished(self, ev: TrainingFinished) -> None:
        self.trainer = self.trainer.finished(self.clock.now(), self.policy.cost_ema_alpha)
        if not self.policy.borrow_enabled or not self.toggle.overlap_gpus():
            return
        n_now = self.slots(self.budget())
        overlap = self.toggle.overlap_gpus()
        n_with = n_now + len(overlap) // self.cfg.cluster.tp_size
        step = borrow_step(self.outlook(), n_now, n_with, ev.expected_idle_s)
        self.trainer = replace(self.trainer, idle_window_s=ev.expected_idle_s)
        gate = step.gate
        self.gate_log.append({"t": self.clock.now(), "kind": "borrow", "step": ev.step, **gate.to_dict()})
        if not gate.admit:
            self._log("borrow_declined", step=ev.step, gate=gate.to_dict())
            return
        self.toggle.lend()
        self.reconfigurations["borrow"] += 1
        self._log("borrow", step=ev.step, gate=gate.to_dict())
        await self.replan(f"training step {ev.step} finished: borrowing {len(overlap)} GPUs")

    # ------------------------------------------------------------------ history
    def _log(self, kind: str, **data: Any) -> None:
        entry = {"t": self.clock.now(), "kind": kind, **data}
        self.history.append(entry)
        for fut in self._watchers.pop(kind, ()):
            if not fut.done():
                fut.set_result(entry)

    def watch(self, kind: str) -> asyncio.Future[dict[str, Any]]:
        """A future of the next ``history`` entry of ``kind`` (``"shrink"``, ``"replan"`` ...)."""
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._watchers.setdefault(kind, []).append(fut)
        return fut

    async def close(self) -> None:
        await self.stop()
        self.book.close()
        with contextlib.suppress(Exception):
            await self.rebuilder.close()


def _describe(ev: object) -> str:
    return type(ev).__name__
