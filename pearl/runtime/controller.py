"""The Controller: composes the runtime and implements ``ControlPlane`` for the admin API.

One Controller drives any data plane: it is built from a ``RunConfig``, an ``InferenceEngine``
(emulated, vLLM or SGLang), an agent ``SessionFactory`` and optionally a ``TrainerHook``; the
injected ``Clock`` decides real or virtual time. Nothing else differs between a replay and a run.

Composition (arrows: "calls")::

    Controller --+--> PipelineScheduler --> engine (generate / abort / load_weights)
                 |        '--> RuntimeTracker (telemetry; refit after each rollout step)
                 +--> ElasticScheduler --> decide / plan (pearl.core) --> PlanExecutor
                 |        +--> ClusterRebuilder (shrink, background expansion, atomic admission)
                 |        '--> ToggleManager (borrow / mandatory return of training GPUs)
                 '--> trainer loop (optional TrainerHook)

Life cycle::

    c = Controller(cfg, engine, session_factory, trainer=None, clock=LoopClock())
    await c.start()      # reserved workers launched + admitted, retained overlap workers parked,
                         # the rollout pipeline (and the trainer loop, if a hook was given) running
    ... c.submit(event) / c.notify(event) / c.take_batch() / c.publish(version, path) ...
    await c.stop()       # cancels and awaits every task it owns, stops every worker

Trainer integration, two ways:

* ``trainer=TrainerHook``: the Controller runs the loop ``take_batch -> notify(TrainingStarted)
  -> train_step -> publish -> notify(TrainingFinished)`` itself;
* external trainer (e.g. ``pearl.sim.emulated_trainer.EmulatedTrainer``): it calls ``take_batch``,
  ``notify`` (waits until handled: ``TrainingStarted`` returns once borrowed GPUs are back) and
  ``publish``.

Wiring: every hook is given to a constructor. The pipeline's ``PipelineHooks`` are the
Controller's own methods (batch start: the batch forecast; batch done: refit; worker failed: the
Elastic Scheduler re-plans; trajectory done: the journal, then ``on_trajectory_done``); the
executor's state listeners are the journal's ``record_state`` and ``state_listeners``; a journal's
recovered run reaches the pipeline as its ``Resume`` (``journal_replay.attach``).

Initial cluster (``initial_state``): reserved GPUs ``r0..`` and training (overlap) GPUs
``t0..``, ``cluster.gpus_per_node`` per node. Preemptible GPUs arrive by ``GpusGranted`` with the
ids the trace replayer or cloud chooses.

Public names: ``Controller``, ``TrainerHook``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future
from statistics import median
from typing import Any, Protocol

from pearl.config import RunConfig
from pearl.core.decision import Allocation
from pearl.core.events import ElasticEvent, ProfileRefit, TrainingFinished, TrainingStarted
from pearl.core.outlook import batch_pieces
from pearl.core.profile import HardwareProfile, WorkloadProfile
from pearl.core.session import SessionFactory
from pearl.core.state import ClusterState, Gpu, Role, Zone
from pearl.core.telemetry import IterationLogging, IterationRecord, TelemetryRecord
from pearl.core.trajectory import TrajectoryRecord
from pearl.engines.base import InferenceEngine
from pearl.runtime.clock import Clock, LoopClock
from pearl.runtime.control import Progress, SubmitResult, UnknownResourceError
from pearl.runtime.door import EventDoor
from pearl.runtime.elastic import ElasticScheduler
from pearl.runtime.executor import PlanExecutor
from pearl.runtime.journal import Journal, RecoveredRun
from pearl.runtime.journal_replay import JournaledEngine, JournalHooks, restart_state
from pearl.runtime.journal_replay import attach as attach_journal
from pearl.runtime.pipeline import PipelineHooks, PipelineScheduler, Resume
from pearl.runtime.rebuilder import ClusterRebuilder
from pearl.runtime.router import Router
from pearl.runtime.toggle import ToggleManager
from pearl.runtime.tracker import RuntimeTracker
from pearl.train.snapshot import WeightRegistry


class TrainerHook(Protocol):
    async def train_step(self, step: int, batch: Sequence[TrajectoryRecord]) -> str | None:
        """One optimizer step on ``batch``; returns the new snapshot folder (None: nothing to load,
        e.g. an emulated trainer). The new weight version is ``step``."""
        ...


class Controller:
    def __init__(
        self,
        cfg: RunConfig,
        engine: InferenceEngine,
        session_factory: SessionFactory,
        trainer: TrainerHook | None = None,
        *,
        clock: Clock | None = None,
        initial_state: ClusterState | None = None,
        initial_weights: tuple[int, str] | None = None,
        expected_lifetime_s: float = 1800.0,
        max_batches: int | None = None,
        journal: Journal | None = None,
        registry: WeightRegistry | None = None,
        on_trajectory_done: Callable[[TrajectoryRecord], None] | None = None,
        state_listeners: Sequence[Callable[[ClusterState], None]] = (),
        wall_now: Callable[[], float] = time.time,
        clock_epoch: str | None = None,
        train_steps: int = 0,
        pd_pair_node: Callable[[str], str] | None = None,
        telemetry_listeners: Sequence[Callable[[TelemetryRecord], None]] = (),
    ) -> None:
        """``on_trajectory_done``: called with every completed trajectory (once the journal has it on
        disk); ``state_listeners``: called with every new ``ClusterState`` (after the journal's);
        ``wall_now`` / ``clock_epoch``: UTC and the clock's origin for the door's deadlines
        (``pearl.runtime.door``); ``train_steps``: training steps already done (a resumed run's
        step and version metrics continue from there); ``pd_pair_node``: worker -> node when a
        prefill-decode pair must share a node (``Router``); ``telemetry_listeners``: called with every
        request's telemetry before the tracker keeps it (``RuntimeTracker``)."""
        self.cfg = cfg
        #: where published versions are looked up when ``publish`` gets no path (the trainer
        #: registers its snapshots there; workers pull the folder lazily)
        self.registry = registry
        # Durable journal (pearl/runtime/journal.py): on a restart its recovered run restores the
        # GPU table, completed trajectories and partial outputs (replayed at the engine boundary).
        self.journal = journal
        self._taken: collections.deque[list[str]] = collections.deque()  # batches being trained on
        self._trained: list[str] = []  # trained on, not yet durable (no checkpoint since)
        #: the engine's per-iteration telemetry, where it logs one (``IterationLogging``: the emulator
        #: given a list at construction), drained into the tracker at every batch's refit
        self._iterations: list[IterationRecord] = (
            engine.iteration_log if isinstance(engine, IterationLogging) and engine.iteration_log is not None else [])
        self.recovered: RecoveredRun | None = None
        if journal is not None:
            self.recovered = journal.recover()
            engine = JournaledEngine(engine, journal, self.recovered.partials)
            if initial_state is None and self.recovered.state is not None:
                initial_state = restart_state(self.recovered.state)
        self.engine = engine
        self.clock: Clock = clock or LoopClock()
        self.trainer = trainer
        self._trajectory_done = on_trajectory_done
        tp = cfg.cluster.tp_size
        state = initial_state or self.initial_state(cfg)
        wired: JournalHooks | None = None
        if journal is not None and self.recovered is not None:
            wired = attach_journal(journal, state, self.recovered, cfg.workload.batch_size)
        hw = HardwareProfile.from_specs(cfg.model, cfg.hardware, tp)
        wl = WorkloadProfile.from_spec(cfg.workload)
        self.tracker = RuntimeTracker(hw, wl, cfg.policy.profile_ema_alpha, listeners=telemetry_listeners)
        version, path = initial_weights or (0, cfg.model.path or "emulated://v0")
        self._weights = (version, path)
        self._record_trajectory = wired.record_trajectory if wired is not None else None
        hooks = PipelineHooks(batch_started=self._on_batch_start, batch_done=self._on_batch_done,
                              worker_failed=self._on_worker_failed,
                              trajectory_done=self._on_trajectory_done
                              if wired is not None or on_trajectory_done is not None else None)
        self.pipeline = PipelineScheduler(
            engine, self.clock, self.tracker, session_factory,
            batch_size=cfg.workload.batch_size, group_size=cfg.workload.group_size,
            max_staleness=cfg.policy.max_staleness, max_trajectory_tokens=cfg.workload.max_trajectory_tokens,
            hooks=hooks, weights=self._weights, max_batches=max_batches,
            resume=Resume(wired.completed, wired.first_batch) if wired is not None else None,
            router=Router(cfg.policy.affinity_slack, cost_aware=cfg.policy.affinity == "cost", pair_node=pd_pair_node),
        )
        listeners = ((wired.record_state,) if wired is not None else ()) + tuple(state_listeners)
        self.executor = PlanExecutor(state, engine, self.pipeline, self.clock, self.latest_weights, listeners)
        self.rebuilder = ClusterRebuilder(self.executor, engine, self.clock, self.latest_weights)
        self.toggle = ToggleManager(self.executor, engine, self.clock, tp)
        self.elastic = ElasticScheduler(cfg, self.clock, self.executor, self.rebuilder, self.toggle, self.tracker,
                                        self.pipeline, shrink_margin_s=cfg.policy.shrink_margin_s,
                                        expected_lifetime_s=expected_lifetime_s)
        #: the one door of outside events (admin API, cloud watchers, lost nodes, trace replay)
        self.door = EventDoor(self.elastic.submit, lambda: self.executor.state.gpus, journal, self.clock.now,
                              wall_now, clock_epoch)
        self.started_at: float | None = None
        self.ready_at: float | None = None
        self.train_steps = train_steps
        self.batch_predictions: list[tuple[float, float]] = []  # (predicted at batch start, observed) s
        #: per ``batch_predictions`` entry, the allocation in force at the batch's start and end
        #: (``"coloc/16"``, ``"5P11D/16"``; None before the first decision)
        self.batch_allocations: list[tuple[str | None, str | None]] = []
        #: per ``batch_predictions`` entry, whether one allocation ran it throughout (no change of
        #: budget, mode or ratio between its start and end)
        self.batch_one_configuration: list[bool] = []
        #: per ``batch_predictions`` entry, whether it corrected the closed loop (it ran one mode:
        #: ``RuntimeTracker.observe_batch``)
        self.batch_closed_loop: list[bool] = []
        # batch index -> the predicted makespan in force when that batch started (keyed, so the
        # pairing stays right even if a pipeline ever overlaps consecutive batches)
        self._predicted_at_start: dict[int, float] = {}
        self._allocation_at_start: dict[int, Allocation | None] = {}
        #: per batch, ``ElasticScheduler.allocation_changes`` at its start
        self._changes_at_start: dict[int, int] = {}
        #: per batch, the workers serving rollout requests at its start (``_serving_throughout``)
        self._serving_at_start: dict[int, frozenset[str]] = {}
        self._tasks: list[asyncio.Task[None]] = []

    # ------------------------------------------------------------------ construction helpers
    @staticmethod
    def initial_state(cfg: RunConfig) -> ClusterState:
        per = cfg.cluster.gpus_per_node
        gpus = [Gpu(f"r{i}", Zone.RESERVED, f"rnode{i // per}") for i in range(cfg.cluster.reserved_gpus)]
        gpus += [Gpu(f"t{i}", Zone.OVERLAP, f"tnode{i // per}") for i in range(cfg.cluster.training_gpus)]
        return ClusterState.build(gpus)

    def latest_weights(self) -> tuple[int, str]:
        return self._weights

    # ------------------------------------------------------------------ life cycle
    async def start(self) -> None:
        """Launch and admit the initial workers, park the retained overlap workers, start the loops."""
        self.started_at = self.clock.now()
        self.elastic.start()
        version, path = self._weights
        prep: list[Awaitable[list[str]]] = []
        if self.cfg.policy.borrow_enabled and self.toggle.overlap_gpus():
            prep.append(self.toggle.prepare(version, path))
        await self.elastic.replan("startup")
        groups = [g.task for g in self.rebuilder.pending() if g.task is not None]
        await asyncio.gather(*prep, *groups)
        await self.elastic.idle()
        self.ready_at = self.clock.now()
        self._tasks.append(asyncio.get_running_loop().create_task(self._run_pipeline(), name="pipeline"))
        if self.trainer is not None:
            self._tasks.append(asyncio.get_running_loop().create_task(self._train_loop(), name="trainer"))

    async def _run_pipeline(self) -> None:
        await self.pipeline.run()

    async def stop(self, close_engine: bool = True) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await self.elastic.close()
        await self.pipeline.close()
        if close_engine:
            with contextlib.suppress(Exception):
                await self.engine.close()

    async def wait_batches(self, n: int) -> None:
        """Wait until the pipeline has completed ``n`` rollout batches; re-raises if the pipeline
        task failed, returns if it stopped."""
        while self.pipeline.stats.rollout_step < n:
            task = self._tasks[0] if self._tasks else None
            if task is None or task.done():
                if task is not None and not task.cancelled() and task.exception() is not None:
                    raise RuntimeError("the rollout pipeline stopped with an error") from task.exception()
                return
            batch = asyncio.ensure_future(self.pipeline.wait_batch())
            try:
                await asyncio.wait({task, batch}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                batch.cancel()

    # ------------------------------------------------------------------ trainer side
    async def take_batch(self) -> list[TrajectoryRecord]:
        """The next rollout batch for the trainer. It is journaled as consumed only once the update
        trained on it is durable (``batch_trained``; ``publish`` calls it): a batch the trainer held
        when the service stopped is delivered again, as journaled, after a restart."""
        batch = await self.pipeline.next_batch()
        if self.journal is not None:
            await self.journal.flush()  # the batch is on disk before the trainer has it
        self._taken.append([r.traj_id for r in batch])
        return batch

    def batch_trained(self, durable: bool = True) -> None:
        """The trainer finished with the oldest batch it took (``take_batch``). ``durable``: the
        trainer's state after it survives a restart (a checkpoint was written, or the trainer has no
        state to lose, as the emulated one); only then are this batch and every earlier trained one
        journaled as consumed. With ``train.checkpoint_every`` > 1 the batches of the updates between
        checkpoints stay unconsumed until the next checkpoint: a restart resumes from the older
        checkpoint and trains on them again, so none is lost and none is trained twice into the
        weights that survive."""
        if not self._taken:
            raise RuntimeError("batch_trained() without a batch taken by take_batch()")
        self._trained.extend(self._taken.popleft())
        if durable:
            if self.journal is not None:
                j, ids = self.journal, list(self._trained)
                j.post(lambda: j.record_consumed(ids), "consumed batch")
            self._trained.clear()

    async def notify(self, event: ElasticEvent) -> SubmitResult:
        """Submit and wait until handled (``TrainingStarted``: until borrowed GPUs are back)."""
        return await self.elastic.submit(event, wait=True)

    async def publish(self, version: int, path: str | None = None, *, durable: bool = True) -> None:
        """A new policy version exists: staleness gate moves, serving workers load it. The update
        that made it finished with the oldest taken batch: ``batch_trained(durable)`` (nothing when
        no batch was taken, as when initial weights are published)."""
        if self._taken:
            self.batch_trained(durable)
            if self.journal is not None:
                await self.journal.flush()  # the trained batch is on disk before the update counts
        if version <= self._weights[0]:
            return
        if path is None and self.registry is not None and version in self.registry.versions():
            path = self.registry.get(version).path
        self._weights = (version, path or f"emulated://v{version}")
        self.train_steps = max(self.train_steps, version)
        self.pipeline.set_trainer_version(version)
        mid_batch = self.pipeline.remaining_trajectories() > 0 and bool(self.pipeline.router.workers)
        t0 = self.clock.now()
        await self.pipeline.sync_weights(*self._weights)
        if mid_batch:  # the pause a batch in flight saw (the batch-start prediction adds it)
            self.elastic.observe_weight_sync(self.clock.now() - t0)

    async def _train_loop(self) -> None:
        assert self.trainer is not None
        step = self._weights[0]
        while True:
            batch = await self.take_batch()
            step += 1
            await self.notify(TrainingStarted(step, event_id=f"train-start-{step}"))
            path = await self.trainer.train_step(step, batch)
            await self.publish(step, path)
            await self.notify(TrainingFinished(step, step, event_id=f"train-finish-{step}"))

    def _on_batch_start(self, r: int) -> None:
        # the previous batch is queued for the trainer (the pipeline hands it over right before
        # starting this one), so a trainer holding lent GPUs starts on it now
        waits = r > self.pipeline.first_batch
        self._predicted_at_start[r] = self.elastic.batch_forecast(trainer_waits=waits)
        self._allocation_at_start[r] = self.elastic.allocation
        self._changes_at_start[r] = self.elastic.allocation_changes
        self._serving_at_start[r] = self._serving_now()

    def _on_worker_failed(self, worker_id: str, reason: str) -> None:
        self.elastic.worker_failed(worker_id, reason)

    def _on_trajectory_done(self, record: TrajectoryRecord) -> None:
        """Journal the trajectory (queued on the writer thread); ``on_trajectory_done`` hears of it
        once it is on disk (an acknowledged trajectory survives a ``kill -9``)."""
        done = self._trajectory_done
        if self._record_trajectory is None:
            if done is not None:
                done(record)
            return
        fut = self._record_trajectory(record)
        if done is None:
            return
        loop = asyncio.get_running_loop()

        def landed(f: Future[bool]) -> None:
            if not f.cancelled() and f.exception() is None and not loop.is_closed():
                loop.call_soon_threadsafe(done, record)

        fut.add_done_callback(landed)

    async def _on_batch_done(self, r: int, records: list[TrajectoryRecord]) -> None:
        # ``run_batch(r)`` appended its makespan just before this call (no await in between)
        observed = self.pipeline.stats.batch_makespans[-1]
        predicted = self._predicted_at_start.pop(r, math.nan)
        ran = self._allocation_at_start.pop(r, None)
        changes = self._changes_at_start.pop(r, -1)
        # a pool that shrank and grew back mid-batch ends where it started but did not run one
        # configuration: the count of allocation changes tells them apart
        one = ran is not None and changes == self.elastic.allocation_changes
        window, self._iterations[:] = list(self._iterations), []
        self.tracker.refit(window, serving=self._serving_throughout(r))
        pieces = self._pieces(ran, changes, observed)
        closed = pieces is not None and self.tracker.observe_batch(pieces, self.cfg.workload.batch_size)
        if math.isfinite(predicted):
            self.batch_predictions.append((predicted, observed))
            self.batch_allocations.append((_pool_label(ran), _pool_label(self.elastic.allocation)))
            self.batch_one_configuration.append(one)
            self.batch_closed_loop.append(closed)
        await self.elastic.submit(ProfileRefit(r + 1, event_id=f"refit-{r + 1}"))

    def _pieces(self, ran: Allocation | None, changes: int, observed: float
                ) -> list[tuple[Allocation, float, float]] | None:
        """The allocations the batch that just ended ran (``outlook.batch_pieces``); None where
        one is unknown."""
        since = self.elastic.allocations_since(changes) if changes >= 0 else None
        if ran is None or since is None:
            return None
        end = self.clock.now()
        slack = self.pipeline.router.placement_slack(self.tracker.hardware, self.tracker.workload)
        return batch_pieces(ran, since, end - observed, end, float(self.cfg.workload.batch_size), slack)

    def _serving_now(self) -> frozenset[str]:
        """The active workers whose requests carry their id (colocated, decode)."""
        return frozenset(w.worker_id for w in self.executor.state.active_workers()
                         if w.role in (Role.COLOCATED, Role.DECODE))

    def _serving_throughout(self, r: int) -> frozenset[str]:
        """The workers that served batch ``r``'s requests from its start to its end: each of them
        was handed trajectories (admission spreads the batch over them) and must appear in the
        window's records (``fitting.fit_workload``, ``silent_worker``). Empty where the pool is
        larger than the batch (a worker may then rightly serve nothing)."""
        serving = self._serving_at_start.pop(r, frozenset()) & self._serving_now()
        return serving if len(serving) <= self.cfg.workload.batch_size else frozenset()

    # ------------------------------------------------------------------ ControlPlane
    async def submit(self, event: ElasticEvent, source: str = "trace") -> SubmitResult:
        """An outside event built in this process (trace replay, a lost node, tools): through the door."""
        return await self.door.submit(event, source)

    def instance_gpus(self, instance_id: str) -> tuple[str, ...]:
        gpus = self.executor.state.gpus_of_instance(instance_id)
        if not gpus:
            raise UnknownResourceError("instance", instance_id)
        return gpus

    def state_dict(self) -> dict[str, Any]:
        return self.executor.state.to_dict()

    def decision_dict(self) -> dict[str, Any] | None:
        d = self.elastic.decision
        return None if d is None else d.to_dict()

    def history(self, limit: int = 100) -> list[dict[str, Any]]:
        h = list(self.elastic.history)
        return h[-limit:] if limit > 0 else []

    def progress(self) -> Progress:
        st = self.pipeline.stats
        up = self.clock.now() - (self.ready_at if self.ready_at is not None else self.clock.now())
        return Progress(
            rollout_step=st.rollout_step, train_step=self.train_steps, weight_version=self._weights[0],
            trajectories_completed=st.trajectories_completed, trajectories_in_flight=st.trajectories_in_flight,
            trajectories_interrupted=st.interruptions, trajectories_lost=st.trajectories_failed,
            tokens_generated=st.tokens_generated,
            throughput_traj_per_h=st.trajectories_completed / (up / 3600.0) if up > 0 else 0.0,
            uptime_s=up,
            extra={"allocation": None if self.elastic.allocation is None else self.elastic.allocation.label,
                   "reconfigurations": dict(self.elastic.reconfigurations),
                   "journal": self.door.fault},
        )

    def config_dict(self) -> dict[str, Any]:
        d = self.cfg.model_dump(mode="json")
        if d.get("admin", {}).get("token"):
            d["admin"]["token"] = "***"
        return d

    # ------------------------------------------------------------------ reports
    def summary(self) -> dict[str, Any]:
        """Counters for reports (the simulator folds these into its JSON)."""
        signed = [(p - o) / o for p, o in self.batch_predictions if o > 0 and math.isfinite(p)]
        errs = [abs(e) for e in signed]
        return {
            "rollout_steps": self.pipeline.stats.rollout_step,
            "train_steps": self.train_steps,
            "trajectories_completed": self.pipeline.stats.trajectories_completed,
            "interruptions": self.pipeline.stats.interruptions,
            "reconfigurations": dict(self.elastic.reconfigurations),
            "makespan_prediction_error": median(errs) if errs else None,
            "makespan_prediction_bias": median(signed) if signed else None,
            "batch_predictions": [{"predicted_s": p, "observed_s": o, "allocation_at_start": a0, "allocation_at_end": a1,
                                   "one_configuration": one, "closed_loop": closed}
                                  for (p, o), (a0, a1), one, closed in zip(
                                      self.batch_predictions, self.batch_allocations, self.batch_one_configuration,
                                      self.batch_closed_loop, strict=True)],
            "closed_loop_batches": self.tracker.workload.correction.batches,
            "shrinks": list(self.elastic.shrinks),
            "returns": [r.to_dict() for r in self.toggle.returns],
            "costs": self.elastic.costs.to_dict(),
            "gates": list(self.elastic.gate_log),
            "expansions": [g.to_dict() for g in self.rebuilder.groups.values()],
        }


def _pool_label(a: Allocation | None) -> str | None:
    """``"<label>/<workers>"`` of an allocation (``"coloc/16"``, ``"5P11D/16"``), None for none."""
    return None if a is None else f"{a.label}/{a.n_workers}"
