"""Elastic Scheduler (paper Sec. 4.1.2): one event queue -> decide -> plan -> execute.

Every elastic event (admin API, trace replayer, trainer, tracker) enters ``submit``; one owner
task (``run``) handles them in arrival order, so decisions never interleave. Each handler is
observe -> decide -> act:

================  ==============================================================================
event             handling
================  ==============================================================================
GpusGranted       add the preemptible GPUs to the state (unless ``policy.use_preemptible`` is off);
                  expansion gate (``expansion_gate``: predicted makespan now vs with the new
                  workers, expected GPU lifetime, EMA costs); admitted -> the Rebuilder prepares
                  the group in the background; declined GPUs stay idle and are reconsidered on the
                  next profile refit
(expansion ready) internal: stage the group, re-plan with it (decide -> plan -> execute role
                  changes), then admit every member at once
(worker failed)   internal, from the pipeline: remove the worker from the state, re-plan (a free
                  reserved GPU gets a new worker through a background expansion)
ReclaimNotice     urgent: a timer starts the shrink at ``deadline - shrink_margin_s`` (at once if
                  that has passed); the shrink runs *outside* the queue so a long handler cannot
                  delay it; then a re-plan of the survivors is queued
NoticeCancelled   drops a pending shrink (too late once it started: reported as not applied)
TrainingStarted   mandatory return of borrowed overlap GPUs (Toggle Manager); the submitter's
                  ``wait`` resolves as soon as the GPUs are back; then survivors are re-planned
TrainingFinished  borrow gate (``borrow_gate``: window = ``expected_idle_s`` or the predicted
                  remaining batch time); admitted -> lend + re-plan (ACTIVATE retained workers)
ProfileRefit      re-plan with the refit profiles (the decision engine's hysteresis decides whether
                  the mode / ratio changes; a batch has just ended, so lent GPUs leave now: the
                  switch gate) and reconsider declined preemptible GPUs
================  ==============================================================================

Re-plan (``replan``): the rollout budget is every GPU rollout may use now (GPUs of existing
workers, free reserved GPUs, lent overlap GPUs; not preemptible GPUs that were declined or are
still preparing); ``decide(n_slots, B, hw, wl, policy, current)`` picks the target (policy
overrides: ``allocation_overrides[n]`` replaces the decision; ``force_disaggregation`` takes the
best feasible split); a switch that cannot pay back before the budget is known to shrink is held
(``switch_gate``, ``_gate_switch``: the current allocation, projected onto the budget, stays);
``plan`` gives the minimal-change steps; the executor runs them; ADD steps become a background
expansion group.

Idempotency: an ``event_id`` is applied at most once (a repeat returns ``duplicate=True``).
Every handled event, decision and plan is appended to ``history`` (bounded), newest last.
Reconfigurations are counted by kind in ``reconfigurations``.

Public names: ``ElasticScheduler``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from pearl.config import RunConfig
from pearl.core.decision import Allocation, Decision, DecisionError, Mode, decide, project
from pearl.core.events import (
    ElasticEvent,
    GpusGranted,
    NoticeCancelled,
    ProfileRefit,
    ReclaimNotice,
    TrainingFinished,
    TrainingStarted,
)
from pearl.core.gate import CostKind, CostModel, GateDecision, borrow_gate, expansion_gate, switch_gate
from pearl.core.makespan import batch_progress, compose_makespan, sticky_pool, sync_stall_s
from pearl.core.planner import Plan, PlanError, StepKind, free_groups, plan
from pearl.core.state import Gpu, WorkerStatus, Zone
from pearl.runtime.clock import Clock
from pearl.runtime.control import SubmitResult, UnknownResourceError
from pearl.runtime.executor import ExecutionReport, PlanExecutor
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
    """Internal event: re-plan after something outside the queue changed the state (a shrink);
    ``expand``: then consider the free preemptible GPUs again (the retry of a failed expansion)."""

    reason: str
    event_id: str = ""
    expand: bool = False


@dataclass(frozen=True, slots=True)
class _WorkerFailed:
    """Internal event: a worker died or failed to load weights; remove it and re-plan."""

    worker_id: str
    reason: str
    event_id: str = ""


@dataclass
class _Notice:
    notice_id: str
    gpus: tuple[str, ...]
    deadline: float
    timer: asyncio.Task[None] | None = None
    started: bool = False


def _schedule(segments: list[tuple[float, float, int]]) -> list[tuple[float, float]]:
    """``(offset, makespan)`` of ``_pool_schedule``'s segments (``compose_makespan``'s input)."""
    return [(t, m) for t, m, _n in segments]


class ElasticScheduler:
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
        self.costs = CostModel(activation_s=cfg.policy.initial_activation_s,
                               deactivation_s=cfg.policy.initial_deactivation_s,
                               expansion_prep_s=cfg.policy.initial_expansion_prep_s,
                               expansion_final_s=cfg.policy.initial_expansion_final_s,
                               weight_sync_s=cfg.policy.initial_weight_sync_s,
                               alpha=cfg.policy.cost_ema_alpha)
        self.decision: Decision | None = None
        self.allocation: Allocation | None = None
        self.history: deque[dict[str, Any]] = deque(maxlen=history_limit)
        self.reconfigurations: Counter[str] = Counter()
        self.training = False
        self.trainings_seen = 0  # TrainingStarted events handled (a trainer exists: syncs will come)
        #: expected training step (s): EMA (``cost_ema_alpha``) of observed TrainingStarted ->
        #: TrainingFinished spans, prior ``train.step_time_s``; ``batch_prediction`` uses it
        self.train_step_s = float(cfg.train.step_time_s)
        self._training_since: float | None = None
        #: the trainer's expected idle window at its last TrainingFinished (the borrow gate's
        #: window; ``batch_prediction`` replays that gate for a lend that would return mid-batch)
        self._idle_window_s: float | None = None
        #: (time, predicted makespan) of each decision since the one in force at the running
        #: batch's start (``remaining_s``)
        self._speeds: list[tuple[float, float]] = []
        self.granted_at: dict[str, float] = {}
        self.notices: dict[str, _Notice] = {}
        self.shrinks: list[dict[str, Any]] = []
        self.gate_log: list[dict[str, Any]] = []
        self._seen: set[str] = set()
        self._queue: asyncio.Queue[tuple[object, asyncio.Future[None] | None]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._pending = 0
        self._idle = asyncio.Event()
        self._timers: set[asyncio.Task[None]] = set()
        self.rebuilder.on_ready = self._on_group_ready
        self.batch_started_at: Callable[[], float] = lambda: self.pipeline.stats.batch_started_at

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
            ev, done = await self._queue.get()
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
        if eid and eid in self._seen:
            return SubmitResult(applied=False, duplicate=True, event_id=eid, detail="event id already applied")
        detail = self._validate(event)
        if eid:
            self._seen.add(eid)
        done: asyncio.Future[None] | None = asyncio.get_running_loop().create_future() if wait else None
        self._put(event, done)
        if done is not None:
            await done
        return SubmitResult(applied=True, event_id=eid, detail=detail)

    def _put(self, ev: object, done: asyncio.Future[None] | None = None) -> None:
        self._pending += 1
        self._queue.put_nowait((ev, done))

    def _validate(self, ev: ElasticEvent) -> str:
        state = self.executor.state
        if isinstance(ev, GpusGranted):
            if not ev.gpus:
                raise ValueError("gpus: a grant must name at least one GPU")
            dup = [g.gpu_id for g in ev.gpus if g.gpu_id in state.gpus]
            if dup:
                raise ValueError(f"gpus: {dup} are already in the cluster; grant new GPU ids")
            return f"{len(ev.gpus)} GPUs granted"
        if isinstance(ev, ReclaimNotice):
            if not ev.gpu_ids:
                raise ValueError("gpu_ids: a reclaim notice must name at least one GPU")
            for g in ev.gpu_ids:
                if g not in state.gpus and g not in self.rebuilder.preparing_gpus():
                    raise UnknownResourceError("GPU", g)
                if g in state.gpus and state.gpus[g].zone is not Zone.PREEMPTIBLE:
                    raise ValueError(f"gpu_ids: {g} is a {state.gpus[g].zone.value} GPU; only preemptible "
                                     "GPUs can be reclaimed")
            if not math.isfinite(ev.deadline):
                raise ValueError(f"deadline: {ev.deadline} is not a finite clock time")
            return f"shrink of {len(ev.gpu_ids)} GPUs due by t={ev.deadline:.1f}"
        if isinstance(ev, NoticeCancelled):
            if ev.notice_id not in self.notices:
                raise UnknownResourceError("notice", ev.notice_id)
            return "notice cancellation queued"
        return ""

    # ------------------------------------------------------------------ dispatch
    async def _handle(self, ev: object, done: asyncio.Future[None] | None) -> None:
        if isinstance(ev, GpusGranted):
            await self._on_grant(ev)
        elif isinstance(ev, ReclaimNotice):
            self._on_notice(ev)
        elif isinstance(ev, NoticeCancelled):
            self._on_cancel(ev)
        elif isinstance(ev, TrainingStarted):
            await self._on_training_started(ev, done)
        elif isinstance(ev, TrainingFinished):
            await self._on_training_finished(ev)
        elif isinstance(ev, ProfileRefit):
            await self.replan(f"profile refit after rollout step {ev.step}", batch_boundary=True)
            await self._consider_expansion("profile refit")
        elif isinstance(ev, _ExpansionDone):
            await self._on_group_done(ev)
        elif isinstance(ev, _Replan):
            await self.replan(ev.reason)
            if ev.expand:
                await self._consider_expansion(ev.reason)
        elif isinstance(ev, _WorkerFailed):
            await self._on_worker_failed(ev)

    # ------------------------------------------------------------------ budget and decisions
    def budget(self) -> frozenset[str]:
        """GPUs rollout may use now (module docstring)."""
        state = self.executor.state
        out = set()
        for g, gpu in state.gpus.items():
            owner = state.owner_of(g)
            if gpu.zone is Zone.OVERLAP:
                if gpu.lent:
                    out.add(g)
            elif owner is not None or gpu.zone is Zone.RESERVED:
                out.add(g)
        return frozenset(out)

    def slots(self, budget: frozenset[str]) -> int:
        state = self.executor.state
        live = sum(1 for w in state.workers.values() if all(g in budget for g in w.gpus))
        return live + len(free_groups(state, budget, self.cfg.cluster.tp_size))

    def decide(self, n: int, current: Allocation | None) -> Decision:
        d = decide(n, self.cfg.workload.batch_size, self.tracker.hardware, self.tracker.workload, self.policy,
                   current)
        override = self.policy.allocation_overrides.get(n)
        if override is not None:
            target = Allocation.parse(override, n)
            idx = d.table.index_of(target)
            ms = d.table.candidate(idx).makespan_s if idx is not None else float("nan")
            return replace(d, target=target, predicted_makespan_s=ms, switched=target != current, forced=False,
                           reason=f"override: allocation_overrides[{n}] = {override}")
        if self.policy.force_disaggregation and d.target.mode is Mode.COLOCATED:
            splits = [c for c in d.candidates if c.allocation.mode is Mode.DISAGGREGATED and c.feasible]
            if splits:
                best = min(splits, key=lambda c: c.makespan_s)
                return replace(d, target=best.allocation, predicted_makespan_s=best.makespan_s,
                               switched=best.allocation != current,
                               reason=f"forced disaggregation: best feasible split {best.allocation.label}")
        return d

    def predicted(self, n: int) -> float:
        if n < 1:
            return math.inf
        return self.decide(n, None).predicted_makespan_s

    def batch_prediction(self, trainer_waits: bool) -> float:
        """Predicted makespan of a rollout batch starting now, with every pool change already known
        at its start (session 4: the borrow / return schedule; session 6: reclaim notices and
        expansions in preparation). Before session 4 it was the decision's fresh-batch makespan
        ``M_cur``, 18-45 % off on elastic replays. The known changes, as offsets from now:

        * lent overlap GPUs, when the trainer has a batch waiting (``trainer_waits``: the previous
          rollout batch, staleness >= 1): the trainer starts now, so their ``N_o`` workers leave
          after ``d_ret`` and, the step done, come back ``d_act`` after it (``-N_o`` at ``d_ret``,
          ``+N_o`` at ``d_ret + T + d_act``);
        * a pending reclaim notice: the workers on its GPUs leave when its shrink starts
          (``deadline - shrink_margin_s``);
        * an expansion group in preparation: its members join at ``started_at + t_prep +
          t_final`` (``ready_at + t_final`` once ready); a group on GPUs under a notice is left
          out (the shrink cancels it).

        Applied in time order to ``N`` (the decision's workers), they give the schedule::

            M_hat = compose_makespan([(0, M_cur), (t_1, M_1), (t_2, M_2), ...])

        ``M_cur`` is decided again at the start, on the profiles refit when the previous batch
        ended (the re-plan that acts on them is queued behind the start; before session 6 the
        prediction used the decision from before the refit, one batch behind).

        ``M_i`` = ``M(n_i)``, the decision engine's best makespan on the ``n_i`` workers then in
        force, except for a colocated pool that grows past ``n_low`` (the fewest workers the batch
        has had so far, which hold its in-flight trajectories): there the in-flight batch is placed
        as the router will place it, ``n_eff = sticky_pool(B, n_low, n_i, s)`` workers of
        ``M(n_i)``'s colocated curve, ``s`` the load slack the router keeps
        (``affinity.effective_slack`` of the profiles' typical turn with cost-aware affinity: 0 when
        re-prefill is cheaper than one more neighbour). ``d_ret``, ``d_act``, ``t_prep``,
        ``t_final`` are the measured EMAs of ``CostModel``; ``T = train_step_s`` (measured EMA of
        training spans). Modelling choices: the gates admit the regrowth (they admitted the lend and
        the expansion in force); a P:D pool change is used evenly (decode workers are picked by least
        load); ``compose_makespan``: progress is linear in time within each allocation. Without a
        known change ``M_cur``; NaN without a decision.

        Session 10: plus the weight sync that ends the training step, when it lands inside the
        batch (``_sync_stall``, ``makespan.sync_stall_s``): the sync aborts every request in flight
        and flushes the prefix caches, ~2 % of a batch that the prediction did not count (its
        batch-start error was -4.6 .. -7.8 % signed median on the Fig. 5 segments)."""
        if self.decision is None:
            return math.nan
        # the profiles were refit when the previous batch ended, and the re-plan that acts on them
        # is queued behind this start: decide again on them (the incumbent keeps its hysteresis)
        d = self.decide(self.decision.n_workers, self.allocation)
        m_cur = d.predicted_makespan_s
        if not math.isfinite(m_cur) or m_cur <= 0:
            return m_cur
        m_hat, segments = self._pool_schedule(d, trainer_waits)
        if not (math.isfinite(m_hat) and m_hat > 0):
            return m_hat
        return m_hat + self._sync_stall(d, trainer_waits, segments, m_hat)

    def observe_weight_sync(self, seconds: float) -> None:
        """A weight sync paused a batch in flight for ``seconds`` (EMA ``CostModel.weight_sync_s``)."""
        self.costs = self.costs.observe(CostKind.WEIGHT_SYNC, seconds)

    def _sync_stall(self, d: Decision, trainer_waits: bool, segments: list[tuple[float, float, int]],
                    m_hat: float) -> float:
        """The weight sync that ends the training step started at this batch's start, if it lands
        inside the batch (``makespan.sync_stall_s``): at ``t_s = d_ret + T`` (``d_ret`` only when
        overlap GPUs are lent: the step waits for their return), on the pool in force then. Only
        once a training step has been seen (a controller without a trainer never syncs)."""
        if not (trainer_waits and self.trainings_seen and d.hw is not None and d.wl is not None):
            return 0.0
        t_s = (self.costs.deactivation_s if self._lent_workers(d.n_workers) else 0.0) + self.train_step_s
        if t_s >= m_hat:
            return 0.0
        n_s = next((n for t, _m, n in reversed(segments) if t <= t_s), d.n_workers)
        prog = batch_progress(_schedule(segments), t_s)
        if d.target.mode is Mode.DISAGGREGATED:
            div = max(d.target.n_prefill * n_s / max(d.n_workers, 1), 1.0)
            return sync_stall_s(d.hw, d.wl, d.batch, prog, div, self.costs.weight_sync_s,
                                disaggregated=True)
        return sync_stall_s(d.hw, d.wl, d.batch, prog, float(n_s), self.costs.weight_sync_s)

    def _pool_schedule(self, d: Decision, trainer_waits: bool) -> tuple[float, list[tuple[float, float, int]]]:
        """``batch_prediction``'s composition of the known pool changes: the composed makespan and
        the allocations in force, ``(offset, makespan, workers)`` from ``(0, M_cur, N)`` on."""
        m_cur = d.predicted_makespan_s
        n = d.n_workers
        segments = [(0.0, m_cur, n)]
        changes = self._known_pool_changes(trainer_waits, n)
        if not changes:
            return m_cur, segments
        n_now, n_low = n, n
        slack: float | None = None
        for t, delta, regrow in changes:
            if regrow and not self._regrowth_admitted(_schedule(segments), t, n_now, n_now + delta):
                continue
            n_now += delta
            if n_now < 1:
                return math.inf, segments  # the pool empties mid-batch: nothing serves it until a grant
            if n_now > n_low:
                back = self.decide(n_now, self.allocation)  # the incumbent keeps its hysteresis
                m = back.predicted_makespan_s
                if back.target.mode is Mode.COLOCATED and back.colocated_curve:
                    if slack is None:
                        slack = float(self.pipeline.router.placement_slack(self.tracker.hardware,
                                                                           self.tracker.workload))
                    n_eff = sticky_pool(float(d.batch), float(n_low), float(n_now), slack)
                    m = back.colocated_curve[max(min(round(n_eff), n_now), 1) - 1]
            else:
                m = self.predicted(n_now)
            n_low = min(n_low, n_now)
            if not (math.isfinite(m) and m > 0):
                return m_cur, segments[:1]
            segments.append((t, m, n_now))
        return compose_makespan(_schedule(segments)), segments

    def _regrowth_admitted(self, schedule: list[tuple[float, float]], t: float, n_now: int, n_with: int) -> bool:
        """Whether the borrow gate, evaluated when the training step ends (``t - d_act`` into the
        batch), lends the overlap GPUs again: ``borrow_gate`` as ``_on_training_finished`` calls
        it, with the batch's remaining time ``(1 - p) M(n_now)``, ``p`` its progress by then under
        ``schedule`` (linear within each allocation), and the trainer's last idle window."""
        prog = batch_progress(schedule, max(t - self.costs.activation_s, 0.0))
        if prog >= 1.0:
            return True  # done before the step ends: the regrowth does not matter
        m_now, m_with = self.predicted(n_now), self.predicted(n_with)
        remaining = (1.0 - prog) * m_now
        window = self._idle_window_s if self._idle_window_s is not None else remaining
        return borrow_gate(m_now if math.isfinite(m_now) else 1e12, m_with, window, remaining,
                           self.costs, self.policy).admit

    def _lent_workers(self, n: int) -> int:
        """Workers on lent overlap GPUs that leave a pool of ``n`` when the trainer starts (0 when
        nothing is lent or the whole pool is lent)."""
        n_o = len(self.toggle.overlap_gpus()) // max(self.cfg.cluster.tp_size, 1) if self.toggle.borrowed else 0
        return n_o if 0 < n_o < n else 0

    def _known_pool_changes(self, trainer_waits: bool, n: int) -> list[tuple[float, int, bool]]:
        """(offset from now, change in workers, is the lend's regrowth) of every pool change known
        now, in time order (``batch_prediction``)."""
        out: list[tuple[float, int, bool]] = []
        n_o = self._lent_workers(n)
        if trainer_waits and n_o:
            d_ret, d_act = self.costs.deactivation_s, self.costs.activation_s
            out += [(d_ret, -n_o, False), (d_ret + self.train_step_s + d_act, n_o, True)]
        now = self.clock.now()
        state = self.executor.state
        noticed: set[str] = set()
        for notice in self.notices.values():
            noticed |= set(notice.gpus)
            if notice.started:
                continue
            leaving = {w for g in notice.gpus if g in state.gpus and (w := state.owner_of(g)) is not None
                       and state.workers[w].status is WorkerStatus.ACTIVE}
            if leaving:
                out.append((max(notice.deadline - self.shrink_margin_s - now, 0.0), -len(leaving), False))
        for grp in self.rebuilder.pending():
            if grp.gpus & noticed:
                continue
            t_final = self.costs.expansion_final_s
            ready = grp.ready_at if grp.ready_at is not None else grp.started_at + self.costs.expansion_prep_s
            out.append((max(ready + t_final - now, 0.0), len(grp.members), False))
        return sorted(out)

    def remaining_s(self) -> float:
        """Predicted remaining time of the running batch at the current speed (the borrow gate's
        ``remaining``). The batch has progressed under each decision in force since it started,
        at ``1 / M_i`` (``M_i`` that decision's predicted makespan; the progress model of
        ``compose_makespan``)::

            p = sum_i (t_{i+1} - t_i) / M_i     over [batch start, now]
            R = (1 - p) * M_now                 while p < 1
            R = (running / B) * M_now           once it has overrun (the tail: a fraction of the
                                                batch is still running; assume it needs that
                                                fraction of a batch time)

        With one decision over the batch, ``R = M - elapsed`` (session 5 and before, for any
        history). Session 6: a pool that grew mid-batch (an admitted expansion) made ``M -
        elapsed`` count the whole elapsed time at the new pool's speed; on the 30B-A3B scarce
        segment the gate then saw 35-40 s left where 158 s were, and declined a borrow that would
        have saved ~24 s."""
        ms = self.decision.predicted_makespan_s if self.decision is not None else 0.0
        if not math.isfinite(ms) or ms <= 0:
            return 0.0
        now, t_b = self.clock.now(), self.batch_started_at()
        self._prune_speeds()
        pieces = [(max(t - t_b, 0.0), m) for t, m in self._speeds] or [(0.0, ms)]
        prog = batch_progress(pieces, now - t_b)
        if prog < 1.0:
            return (1.0 - prog) * ms
        return self.pipeline.remaining_trajectories() / max(self.cfg.workload.batch_size, 1) * ms

    def _prune_speeds(self) -> None:
        """Keep the decisions from the one in force at the running batch's start on."""
        t_b = self.batch_started_at()
        cut = 0
        for i, (t, _m) in enumerate(self._speeds):
            if t <= t_b:
                cut = i
        del self._speeds[:cut]

    async def replan(self, reason: str, batch_boundary: bool = False) -> ExecutionReport | None:
        """Decide on the current budget, plan, execute. ``batch_boundary``: a rollout batch has just
        ended, so a training step starts now and takes any lent GPUs back (``_hold_s``)."""
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
            self.allocation = None
            return rep
        try:
            wish = self.decide(n, self.allocation)
            p = plan(state, wish.target, budget, self.cfg.cluster.tp_size)
            d = self._gate_switch(wish, p, budget, batch_boundary)
            if d is not wish:  # held: plan the current allocation instead
                p = plan(state, d.target, budget, self.cfg.cluster.tp_size)
        except (DecisionError, PlanError) as e:
            self._log("replan", reason=reason, error=str(e))
            return None
        if self.allocation is not None and d.target != self.allocation:
            if d.target.mode is not self.allocation.mode:
                self.reconfigurations["mode_switch"] += 1
            elif d.target.n_workers == self.allocation.n_workers:
                self.reconfigurations["ratio_switch"] += 1
        self.decision = d
        self.allocation = d.target
        self._speeds.append((self.clock.now(), d.predicted_makespan_s))
        self._prune_speeds()
        # A GPU whose worker is still being prepared by an expansion group is not free: that group
        # provides it (a second ADD there would launch two servers on one GPU).
        preparing = self.rebuilder.preparing_gpus()
        adds = [s for s in p.of_kind(StepKind.ADD) if not preparing.intersection(s.gpus)]
        rep = await self.executor.execute(p)
        if adds:
            grp = self.rebuilder.expand({s.worker_id: (s.gpus, s.role) for s in adds})
            self._log("expand_started", group=grp.group_id, workers=sorted(grp.members), reason=reason)
        for sec in rep.timings.get("activate", []):
            self.costs = self.costs.observe(CostKind.ACTIVATION, sec)
        self._log("replan", reason=reason, decision=d.to_dict(), plan=p.to_dict(),
                  executed={"steps": rep.steps, "aborted_requests": rep.aborted_requests, "seconds": rep.seconds,
                            "errors": rep.errors})
        if rep.errors:
            self.reconfigurations["errors"] += len(rep.errors)
        return rep

    def _active_steps(self, p: Plan, *kinds: StepKind) -> set[str]:
        """Workers now serving (ACTIVE) that ``p`` acts on with a step of one of ``kinds`` (the
        expansion and switch gates' re-planned serving workers)."""
        workers = self.executor.state.workers
        return {s.worker_id for s in p.of_kind(*kinds)
                if s.worker_id in workers and workers[s.worker_id].status is WorkerStatus.ACTIVE}

    def _hold_s(self, n: int, batch_boundary: bool, makespan_s: float) -> float:
        """Seconds a budget of ``n`` workers is known to hold (the switch gate's ``T_hold``): lent
        training GPUs leave when the next training step starts - now at a batch boundary (after
        the return's ``c_d``), else when the running batch ends - and a reclaim notice takes its
        GPUs at its deadline; ``math.inf`` when no shrink is known. The running batch ends after
        its remaining work at the budget's speed: ``remaining_s`` is at the speed of the decision
        in force (``M_old``), so ``T = remaining_s * M / M_old`` with ``M`` = ``makespan_s``, the
        current allocation's makespan on this budget."""
        t = math.inf
        if self._lent_workers(n) and not self.training:
            if batch_boundary:
                t = self.costs.deactivation_s
            else:
                m_old = self.decision.predicted_makespan_s if self.decision is not None else math.nan
                scale = makespan_s / m_old if math.isfinite(m_old) and m_old > 0 and math.isfinite(makespan_s) else 1.0
                t = self.remaining_s() * scale
        for off, delta, _regrow in self._known_pool_changes(False, n):
            if delta < 0:
                t = min(t, off)
        return t

    def _gate_switch(self, d: Decision, p: Plan, budget: frozenset[str], batch_boundary: bool) -> Decision:
        """Keep the current allocation (projected onto the budget) when a mode or ratio switch
        cannot pay back before the budget is known to shrink (``gate.switch_gate``; ``p`` is the
        plan for ``d.target``, whose re-roled serving workers are the cost). A forced
        switch (the projection is infeasible), a first decision and an ``allocation_overrides``
        entry (an explicit schedule: the oracle's, a fixed-allocation measurement) pass unchanged."""
        cur = self.allocation
        if cur is None or not d.switched or d.forced or d.n_workers in self.policy.allocation_overrides:
            return d
        proj = project(cur, d.n_workers, self.policy)
        idx = d.table.index_of(proj)
        if d.target == proj or idx is None:
            return d
        m_cur = d.table.candidate(idx).makespan_s
        hold = self._hold_s(d.n_workers, batch_boundary, m_cur)
        if math.isinf(hold):
            return d
        serving = sum(1 for wk in self.executor.state.workers.values()
                      if wk.status is WorkerStatus.ACTIVE and all(g in budget for g in wk.gpus))
        roled = self._active_steps(p, StepKind.CHANGE_ROLE)
        gate = switch_gate(m_cur, d.predicted_makespan_s, hold, self.costs, self.policy,
                           stalled_fraction=len(roled) / max(serving, 1))
        self.gate_log.append({"t": self.clock.now(), "kind": "switch", "from": proj.label, "to": d.target.label,
                              **gate.to_dict()})
        if gate.admit:
            return d
        self._log("switch_declined", current=proj.label, target=d.target.label, gate=gate.to_dict())
        return replace(d, target=proj, predicted_makespan_s=m_cur, switched=proj != cur,
                       reason=f"hold {proj.label}: {d.target.label} declined by the switch gate ({gate.reason})")

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
        busy = self.rebuilder.preparing_gpus() | {g for n in self.notices.values() for g in n.gpus}
        free = [g for g in state.free_gpus([Zone.PREEMPTIBLE]) if g not in busy]
        return free_groups(state, free, self.cfg.cluster.tp_size)

    async def _consider_expansion(self, reason: str) -> None:
        groups = self._candidates()
        if not groups:
            return
        budget = self.budget()
        n_now = self.slots(budget)
        pending = sum(len(g.members) for g in self.rebuilder.pending())
        n_base = n_now + pending
        n_with = n_base + len(groups)
        m_now, m_with = self.predicted(n_base), self.predicted(n_with)
        # roles for the new workers: the planner's ADD steps for the target on budget + new GPUs;
        # the same plan says which serving workers the admission would re-plan (the gate's cost)
        target = self.decide(n_with, self.allocation).target
        new_gpus = {g for gs in groups for g in gs}
        pool = budget | new_gpus | self.rebuilder.preparing_gpus()
        try:
            p = plan(self.executor.state, target, pool, self.cfg.cluster.tp_size)
        except PlanError as e:
            self._log("expand_declined", reason=reason, error=str(e))
            return
        stalled = self._active_steps(p, StepKind.REMOVE, StepKind.DEACTIVATE, StepKind.CHANGE_ROLE)
        gate = expansion_gate(m_now if math.isfinite(m_now) else 1e12, m_with, self.expected_lifetime_s,
                              self.costs, self.policy, stalled_fraction=len(stalled) / max(n_now, 1))
        self.gate_log.append({"t": self.clock.now(), "kind": "expansion", **gate.to_dict()})
        if not gate.admit:
            self._log("expand_declined", reason=reason, gate=gate.to_dict(), gpus=sorted(new_gpus))
            return
        members = {s.worker_id: (s.gpus, s.role) for s in p.of_kind(StepKind.ADD) if set(s.gpus) <= new_gpus}
        if not members:
            return
        grp = self.rebuilder.expand(members)
        self.reconfigurations["expansion_started"] += 1
        self._log("expand_started", group=grp.group_id, workers=sorted(grp.members), gate=gate.to_dict(),
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

    def _on_notice(self, ev: ReclaimNotice) -> None:
        nid = ev.notice_id or ev.event_id or f"notice-{len(self.notices) + 1}"
        notice = _Notice(nid, tuple(ev.gpu_ids), ev.deadline)
        self.notices[nid] = notice
        now = self.clock.now()
        for g in ev.gpu_ids:
            t = self.granted_at.pop(g, None)
            if t is not None:
                self.expected_lifetime_s += 0.3 * ((now - t) - self.expected_lifetime_s)
        start = max(now, ev.deadline - self.shrink_margin_s)
        task = asyncio.get_running_loop().create_task(self._shrink_at(notice, start), name=f"shrink-{nid}")
        notice.timer = task
        self._timers.add(task)
        task.add_done_callback(self._timers.discard)
        self._log("reclaim_notice", notice=nid, gpus=list(ev.gpu_ids), deadline=ev.deadline, shrink_at=start)

    async def _shrink_at(self, notice: _Notice, start: float) -> None:
        await self.clock.sleep_until(start)
        notice.started = True
        rep = await self.rebuilder.shrink(notice.gpus, notice.deadline)
        self.notices.pop(notice.notice_id, None)
        self.reconfigurations["shrink"] += 1
        self.shrinks.append(rep.to_dict())
        self._log("shrink", notice=notice.notice_id, **rep.to_dict())
        self._put(_Replan(f"re-plan survivors after reclaim {notice.notice_id}"))

    def _replan_later(self, reason: str, delay_s: float = 30.0) -> None:
        """A failed expansion leaves the planned topology short (e.g. a replacement prefill worker
        that did not start: nothing could serve) and its preemptible GPUs idle; re-plan after
        ``delay_s`` and consider those GPUs again, behind the expansion gate (a bounded retry rate
        when launches keep failing; the retry's workers get fresh ids, ``ClusterRebuilder.expand``).
        The timer is owned like the shrink timers."""

        async def later() -> None:
            await self.clock.sleep(delay_s)
            self._put(_Replan(reason, expand=True))

        task = asyncio.get_running_loop().create_task(later(), name="replan-after-failure")
        self._timers.add(task)
        task.add_done_callback(self._timers.discard)

    def worker_failed(self, worker_id: str, reason: str) -> None:
        """A worker died or could not load weights (``PipelineScheduler.on_worker_failed``)."""
        self._put(_WorkerFailed(worker_id, reason))

    async def _on_worker_failed(self, ev: _WorkerFailed) -> None:
        if ev.worker_id not in self.executor.state.workers:
            return
        rep = ExecutionReport()
        await self.executor.remove(ev.worker_id, rep)
        self.reconfigurations["worker_failed"] += 1
        self._log("worker_failed", worker=ev.worker_id, reason=ev.reason[:300])
        await self.replan(f"worker {ev.worker_id} failed: replace it")

    def _on_cancel(self, ev: NoticeCancelled) -> None:
        notice = self.notices.get(ev.notice_id)
        if notice is None or notice.started:
            self._log("notice_cancel_ignored", notice=ev.notice_id, reason="shrink already done")
            return
        if notice.timer is not None:
            notice.timer.cancel()
        self.notices.pop(ev.notice_id, None)
        self._log("notice_cancelled", notice=ev.notice_id)

    # ------------------------------------------------------------------ intra-scale
    async def _on_training_started(self, ev: TrainingStarted, done: asyncio.Future[None] | None) -> None:
        self.training = True
        self.trainings_seen += 1
        self._training_since = self.clock.now()
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
        self.training = False
        if self._training_since is not None:
            span = self.clock.now() - self._training_since
            if math.isfinite(span) and span > 0:
                self.train_step_s += self.policy.cost_ema_alpha * (span - self.train_step_s)
            self._training_since = None
        if not self.policy.borrow_enabled or not self.toggle.overlap_gpus():
            return
        budget = self.budget()
        n_now = self.slots(budget)
        overlap = self.toggle.overlap_gpus()
        n_with = n_now + len(overlap) // self.cfg.cluster.tp_size
        m_now, m_with = self.predicted(n_now), self.predicted(n_with)
        remaining = self.remaining_s()
        window = ev.expected_idle_s if ev.expected_idle_s is not None else remaining
        self._idle_window_s = ev.expected_idle_s
        gate: GateDecision = borrow_gate(m_now if math.isfinite(m_now) else 1e12, m_with, window, remaining,
                                         self.costs, self.policy)
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
        self.history.append({"t": self.clock.now(), "kind": kind, **data})

    async def close(self) -> None:
        await self.stop()
        for n in list(self.notices.values()):
            if n.timer is not None:
                n.timer.cancel()
        with contextlib.suppress(Exception):
            await self.rebuilder.close()


def _describe(ev: object) -> str:
    return type(ev).__name__
