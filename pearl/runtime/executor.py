"""Plan executor: applies ``pearl.core.planner.Plan`` steps to the engine, the pipeline and the state.

The one place where the GPU-worker-role table (``ClusterState``) changes at run time. It holds the
current value (``self.state``, frozen; replaced on every change) and performs each step in the
order the state machine allows, keeping the engine, the pipeline's router and the table in step:

    REMOVE      w  evict (stop dispatch, abort in-flight: partial outputs resume elsewhere)
                   -> engine.stop -> state.remove_worker
    DEACTIVATE  w  (overlap) active -> draining, evict, engine.release_memory -> inactive
    CHANGE_ROLE w  serving: active -> draining, evict, engine.set_role, state.set_role -> active,
                   readmit; not serving: engine.set_role + state.set_role only
    ACTIVATE    w  (retained process) engine.resume_memory, sync to the latest weights,
                   inactive -> active, admit to the router
    ADD         w  not executed here: the Inter-Scale Cluster Rebuilder launches new workers in the
                   background and admits them as a group (``rebuilder.py``)

Steps of one plan run in the planner's order (removals first: they free GPUs) and, within a
kind, concurrently. A step that fails on the engine is recorded in ``errors`` and its worker is
removed from the table (a worker we cannot control must not stay in the topology).

``latest_weights`` (a callable returning ``(version, path)``) is how newly activated workers
learn which snapshot to load: the lazy pull of paper Sec. 5. ``listeners`` (given to the
constructor) are called with every new state, in order (the journal records it durably).

Public names: ``PlanExecutor``, ``ExecutionReport``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pearl.core.planner import Plan, StepKind
from pearl.core.state import ClusterState, Role, StateError, WorkerStatus
from pearl.engines.base import EngineError, InferenceEngine
from pearl.runtime.clock import Clock
from pearl.runtime.pipeline import PipelineScheduler


@dataclass
class ExecutionReport:
    steps: int = 0
    aborted_requests: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)
    timings: dict[str, list[float]] = field(default_factory=dict)  # step kind -> seconds per worker

    def add_time(self, kind: str, s: float) -> None:
        self.timings.setdefault(kind, []).append(s)


class PlanExecutor:
    def __init__(self, state: ClusterState, engine: InferenceEngine, pipeline: PipelineScheduler, clock: Clock,
                 latest_weights: Callable[[], tuple[int, str]],
                 listeners: Sequence[Callable[[ClusterState], None]] = ()) -> None:
        self.state = state
        self.engine = engine
        self.pipeline = pipeline
        self.clock = clock
        self.latest_weights = latest_weights
        self._listeners = tuple(listeners)

    # ------------------------------------------------------------------ state changes
    def set_state(self, new: ClusterState) -> None:
        self.state = new
        for f in self._listeners:
            f(new)

    def _status(self, worker_id: str, status: WorkerStatus) -> None:
        self.set_state(self.state.set_status(worker_id, status))

    # ------------------------------------------------------------------ single steps
    async def remove(self, worker_id: str, report: ExecutionReport) -> None:
        if worker_id not in self.state.workers:
            return
        report.aborted_requests += await self.pipeline.evict(worker_id)
        with contextlib.suppress(EngineError):
            await self.engine.stop(worker_id)
        if worker_id in self.state.workers:
            self.set_state(self.state.remove_worker(worker_id))

    async def deactivate(self, worker_id: str, report: ExecutionReport) -> None:
        w = self.state.workers.get(worker_id)
        if w is None:
            return
        t0 = self.clock.now()
        if w.status is WorkerStatus.ACTIVE:
            self._status(worker_id, WorkerStatus.DRAINING)
        report.aborted_requests += await self.pipeline.evict(worker_id)
        try:
            await self.engine.release_memory(worker_id)
        except EngineError as e:
            report.errors.append(f"deactivate {worker_id}: {e}")
        if worker_id in self.state.workers:
            self._status(worker_id, WorkerStatus.INACTIVE)
        report.add_time("deactivate", self.clock.now() - t0)

    async def change_role(self, worker_id: str, role: Role, report: ExecutionReport) -> None:
        w = self.state.workers.get(worker_id)
        if w is None or w.role is role:
            return
        serving = w.status is WorkerStatus.ACTIVE
        if serving:
            self._status(worker_id, WorkerStatus.DRAINING)
            report.aborted_requests += await self.pipeline.evict(worker_id)
        t0 = self.clock.now()
        try:
            await self.engine.set_role(worker_id, role)
        except EngineError as e:
            report.errors.append(f"change_role {worker_id} -> {role.value}: {e}")
            await self.remove(worker_id, report)
            return
        report.add_time("change_role", self.clock.now() - t0)
        if worker_id not in self.state.workers:
            return
        self.set_state(self.state.set_role(worker_id, role))
        if serving:
            self._status(worker_id, WorkerStatus.ACTIVE)
            self.pipeline.admit(worker_id, role, self.pipeline.worker_versions.get(worker_id, 0))

    async def activate(self, worker_id: str, role: Role, report: ExecutionReport) -> None:
        w = self.state.workers.get(worker_id)
        if w is None or w.status is WorkerStatus.ACTIVE:
            return
        t0 = self.clock.now()
        try:
            await self.engine.resume_memory(worker_id)
            version, path = self.latest_weights()
            if await self.engine.weight_version(worker_id) != version:
                await self.engine.load_weights(worker_id, path, version)
            if w.role is not role:
                await self.engine.set_role(worker_id, role)
        except EngineError as e:
            report.errors.append(f"activate {worker_id}: {e}")
            return
        report.add_time("activate", self.clock.now() - t0)
        cur = self.state.workers.get(worker_id)
        if cur is None or cur.status is WorkerStatus.ACTIVE:
            return
        if cur.role is not role:
            self.set_state(self.state.set_role(worker_id, role))
        try:
            self._status(worker_id, WorkerStatus.ACTIVE)
        except StateError as e:  # e.g. its overlap GPUs were taken back meanwhile
            report.errors.append(f"activate {worker_id}: {e}")
            return
        self.pipeline.admit(worker_id, role, version)

    # ------------------------------------------------------------------ plans
    async def execute(self, plan: Plan, report: ExecutionReport | None = None) -> ExecutionReport:
        """Run every step except ADD (returned to the caller through ``plan.of_kind(ADD)``)."""
        rep = report or ExecutionReport()
        t0 = self.clock.now()
        removes = plan.of_kind(StepKind.REMOVE)
        deacts = plan.of_kind(StepKind.DEACTIVATE)
        await asyncio.gather(*(self.remove(s.worker_id, rep) for s in removes),
                             *(self.deactivate(s.worker_id, rep) for s in deacts))
        activating = {s.worker_id for s in plan.of_kind(StepKind.ACTIVATE)}
        roles = {s.worker_id: s.role for s in plan.of_kind(StepKind.CHANGE_ROLE)}
        await asyncio.gather(*(self.change_role(w, r, rep) for w, r in roles.items() if w not in activating))
        await asyncio.gather(*(self.activate(s.worker_id, roles.get(s.worker_id, s.role), rep)
                               for s in plan.of_kind(StepKind.ACTIVATE)))
        rep.steps += len(plan.steps) - len(plan.of_kind(StepKind.ADD))
        rep.seconds = self.clock.now() - t0
        return rep
