"""Inter-Scale Cluster Rebuilder (paper Sec. 4.5): urgent shrink and all-or-nothing expansion.

**Urgent shrink** (``shrink``): a reclaim notice names preemptible GPUs and a deadline. For every
worker bound to them: stop dispatch, abort its in-flight requests (the pipeline keeps their
partial outputs and resumes them on survivors), stop the server, then drop the GPUs from the
state. Expansion groups still preparing on any of those GPUs are cancelled whole. The release
time is recorded against the deadline (``ShrinkReport.met_deadline``). Re-planning the survivors
is the Elastic Scheduler's next step.

**Background expansion** (``expand`` -> ``ExpansionGroup``)::

    preparing --all launched + latest weights loaded--> ready --admit()--> admitted
        |                                                 |
        +--any member fails / cancel()--> failed | cancelled (every member stopped)

Preparation runs in a background task owned by the rebuilder (launch = process start + engine
init, then the first ``load_weights`` of the latest snapshot). Members stay *outside* the
``ClusterState`` while preparing, so no partial topology is ever visible: the state, the router
and the decision engine see the group only when ``admit`` adds every member at once. ``admit``
first re-checks every member reports the latest weight version (the trainer may have published a
newer one meanwhile: the member reloads) and fails the whole group if any member cannot.
``expand(members, on_settled)``: ``on_settled(group)`` is called when that group is ready or
failed (the Elastic Scheduler enqueues an event so that admission happens on its queue).

**Worker ids are never reused.** The planner names a new worker after its first GPU and the state
version (``w-<gpu>-<version>``); a failed or cancelled group leaves the version unchanged, so a
retry on the same GPUs would get the same ids while the failed members' servers may still be
stopping (and logs, metrics and telemetry would mix two servers under one name). ``expand``
renames a member whose id any earlier group used to ``<id>.<k>`` (the smallest k >= 2 not used).

Public names: ``ClusterRebuilder``, ``ExpansionGroup``, ``GroupStatus``, ``ShrinkReport``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from pearl.core.state import Role, Worker, WorkerStatus
from pearl.engines.base import EngineError, InferenceEngine, ServerSpec
from pearl.runtime.clock import Clock
from pearl.runtime.executor import ExecutionReport, PlanExecutor


class GroupStatus(StrEnum):
    PREPARING = "preparing"
    READY = "ready"
    ADMITTED = "admitted"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass
class ExpansionGroup:
    group_id: str
    members: dict[str, tuple[tuple[str, ...], Role]]  # worker id -> (GPUs, role)
    started_at: float
    status: GroupStatus = GroupStatus.PREPARING
    ready_at: float | None = None
    admitted_at: float | None = None
    error: str = ""
    prep_s: dict[str, float] = field(default_factory=dict)  # per member: launch (Table 3 preparation)
    final_s: dict[str, float] = field(default_factory=dict)  # per member: first weight load (finalization)
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def gpus(self) -> set[str]:
        return {g for gs, _ in self.members.values() for g in gs}

    def to_dict(self) -> dict[str, object]:
        return {"group_id": self.group_id, "status": self.status.value, "started_at": self.started_at,
                "ready_at": self.ready_at, "admitted_at": self.admitted_at, "error": self.error,
                "members": {w: {"gpus": list(g), "role": r.value} for w, (g, r) in self.members.items()}}


@dataclass(frozen=True, slots=True)
class ShrinkReport:
    gpus: tuple[str, ...]
    workers: tuple[str, ...]
    aborted_requests: int
    cancelled_groups: tuple[str, ...]
    started_at: float
    released_at: float
    deadline: float

    @property
    def met_deadline(self) -> bool:
        return self.released_at <= self.deadline

    def to_dict(self) -> dict[str, object]:
        return {"gpus": list(self.gpus), "workers": list(self.workers), "aborted_requests": self.aborted_requests,
                "cancelled_groups": list(self.cancelled_groups), "started_at": self.started_at,
                "released_at": self.released_at, "deadline": self.deadline, "met_deadline": self.met_deadline}


class ClusterRebuilder:
    def __init__(self, executor: PlanExecutor, engine: InferenceEngine, clock: Clock,
                 latest_weights: Callable[[], tuple[int, str]]) -> None:
        self.executor = executor
        self.engine = engine
        self.clock = clock
        self.latest_weights = latest_weights
        self.groups: dict[str, ExpansionGroup] = {}
        self._seq = 0
        self._issued: set[str] = set()  # every member id any group was given (module docstring)

    # ------------------------------------------------------------------ queries
    def preparing_gpus(self) -> set[str]:
        return {g for grp in self.groups.values() if grp.status in (GroupStatus.PREPARING, GroupStatus.READY)
                for g in grp.gpus}

    def pending(self) -> list[ExpansionGroup]:
        return [g for g in self.groups.values() if g.status in (GroupStatus.PREPARING, GroupStatus.READY)]

    # ------------------------------------------------------------------ shrink
    async def shrink(self, gpu_ids: Iterable[str], deadline: float) -> ShrinkReport:
        t0 = self.clock.now()
        gpus = tuple(sorted(set(gpu_ids)))
        cancelled = []
        for grp in self.pending():
            if grp.gpus & set(gpus):
                await self.cancel(grp, f"reclaim of {sorted(grp.gpus & set(gpus))}")
                cancelled.append(grp.group_id)
        state = self.executor.state
        workers = sorted({w for g in gpus if g in state.gpus and (w := state.owner_of(g)) is not None})
        rep = ExecutionReport()
        await asyncio.gather(*(self.executor.remove(w, rep) for w in workers))
        present = [g for g in gpus if g in self.executor.state.gpus]
        if present:
            self.executor.set_state(self.executor.state.remove_gpus(present))
        return ShrinkReport(gpus, tuple(workers), rep.aborted_requests, tuple(cancelled), t0, self.clock.now(),
                            deadline)

    # ------------------------------------------------------------------ expansion
    def expand(self, members: dict[str, tuple[tuple[str, ...], Role]],
               on_settled: Callable[[ExpansionGroup], None] | None = None) -> ExpansionGroup:
        """Start preparing a group in the background; returns at once. A member id used by an
        earlier group is renamed (module docstring): read the ids from the returned group.
        ``on_settled(group)`` is called once the group is ready or failed (not when cancelled)."""
        self._seq += 1
        unique: dict[str, tuple[tuple[str, ...], Role]] = {}
        for wid, spec in members.items():
            name, k = wid, 1
            while name in self._issued or name in unique:
                k += 1
                name = f"{wid}.{k}"
            unique[name] = spec
        self._issued.update(unique)
        grp = ExpansionGroup(f"x{self._seq}", unique, self.clock.now())
        self.groups[grp.group_id] = grp
        grp.task = asyncio.get_running_loop().create_task(self._prepare(grp, on_settled),
                                                          name=f"expansion-{grp.group_id}")
        return grp

    async def _prepare(self, grp: ExpansionGroup, on_settled: Callable[[ExpansionGroup], None] | None) -> None:
        version, path = self.latest_weights()

        async def one(wid: str, gpus: tuple[str, ...], role: Role) -> None:
            t0 = self.clock.now()
            await self.engine.launch(ServerSpec(wid, gpus, role, path, version))
            t1 = self.clock.now()
            await self.engine.load_weights(wid, path, version)
            grp.prep_s[wid] = t1 - t0
            grp.final_s[wid] = self.clock.now() - t1

        tasks = [asyncio.create_task(one(w, g, r)) for w, (g, r) in grp.members.items()]
        try:
            done = await asyncio.gather(*tasks, return_exceptions=True)
        except asyncio.CancelledError:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        errors = [f"{w}: {e}" for w, e in zip(grp.members, done, strict=True) if isinstance(e, BaseException)]
        if errors:
            grp.status = GroupStatus.FAILED
            grp.error = "; ".join(errors)
            await self._stop_members(grp)
        else:
            grp.status = GroupStatus.READY
            grp.ready_at = self.clock.now()
        if on_settled is not None:
            on_settled(grp)

    async def _stop_members(self, grp: ExpansionGroup) -> None:
        for w in grp.members:
            with contextlib.suppress(EngineError):
                await self.engine.stop(w)

    async def cancel(self, grp: ExpansionGroup, reason: str) -> None:
        if grp.status not in (GroupStatus.PREPARING, GroupStatus.READY):
            return
        grp.status = GroupStatus.CANCELLED
        grp.error = reason
        if grp.task is not None and not grp.task.done():
            grp.task.cancel()
            await asyncio.gather(grp.task, return_exceptions=True)
        await self._stop_members(grp)
        state = self.executor.state
        staged = [w for w in grp.members if w in state.workers]
        for w in staged:
            state = state.remove_worker(w)
        if staged:
            self.executor.set_state(state)

    async def stage(self, grp: ExpansionGroup) -> bool:
        """Finalization part 1 (on the scheduler's queue): every member must still be healthy and
        report the latest version (reload if the trainer moved on); then the members enter the state
        as ``initializing`` together. False (group failed, members stopped) if any member cannot."""
        if grp.status is not GroupStatus.READY:
            return False
        version, path = self.latest_weights()
        try:
            for w in grp.members:
                if not await self.engine.healthy(w):
                    raise EngineError(w, "not healthy at admission")
                if await self.engine.weight_version(w) != version:
                    await self.engine.load_weights(w, path, version)
        except EngineError as e:
            grp.status = GroupStatus.FAILED
            grp.error = f"admission: {e}"
            await self._stop_members(grp)
            return False
        if grp.status is not GroupStatus.READY:  # cancelled while reloading
            return False
        state = self.executor.state
        missing = [g for g in grp.gpus if g not in state.gpus or state.owner_of(g) is not None]
        if missing:
            grp.status = GroupStatus.FAILED
            grp.error = f"admission: GPUs {sorted(missing)} are gone or taken"
            await self._stop_members(grp)
            return False
        for w, (gpus, role) in grp.members.items():
            state = state.add_worker(Worker(w, gpus, role, WorkerStatus.INITIALIZING))
        self.executor.set_state(state)
        return True

    def admit(self, grp: ExpansionGroup) -> list[str]:
        """Finalization part 2: every staged member becomes ``active`` and dispatchable at once
        (synchronous: no other task runs in between). Returns the admitted worker ids."""
        if grp.status is not GroupStatus.READY:
            return []
        version, _ = self.latest_weights()
        state = self.executor.state
        admitted = []
        for w in grp.members:
            wk = state.workers.get(w)
            if wk is not None and wk.status is WorkerStatus.INITIALIZING:
                state = state.set_status(w, WorkerStatus.ACTIVE)
                admitted.append(w)
        self.executor.set_state(state)
        for w in admitted:
            self.executor.pipeline.admit(w, state.workers[w].role, version)
        grp.status = GroupStatus.ADMITTED
        grp.admitted_at = self.clock.now()
        return admitted

    async def close(self) -> None:
        for grp in list(self.groups.values()):
            await self.cancel(grp, "shutdown")
