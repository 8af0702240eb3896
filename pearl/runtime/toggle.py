"""Intra-Scale Toggle Manager (paper Sec. 4.6): borrow idle training GPUs, return them on time.

Training GPUs form the ``overlap`` zone. One rollout worker per ``tp`` training GPUs is launched
once (``prepare``) and then *retained*: between borrowings it is ``inactive`` with its device
memory released, so borrowing costs an activation (resume memory, ~6 s) rather than a launch
(~60 s), and returning costs a deactivation (release memory, 3.2-4.4 s), paper Table 3.

Life cycle per training step::

    TrainingFinished --gate admits--> lend(): overlap GPUs marked lent; the Elastic Scheduler's
                                      plan ACTIVATEs the retained workers (executor)
    TrainingStarted  --mandatory----> give_back(): every overlap worker drains (dispatch stops,
                                      in-flight requests abort and resume on dedicated workers),
                                      releases memory, goes inactive; GPUs un-lent. Returns the
                                      return delay (seconds from the call until the last GPU is
                                      free), which the trainer waits for and the cost EMA learns.

The gate itself (``pearl.core.gate.borrow_gate``) is evaluated by the Elastic Scheduler, which
knows the predicted makespans; this module only performs the handoff.

Public names: ``ToggleManager``, ``ReturnReport``.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from pearl.core.state import Role, Worker, WorkerStatus, Zone
from pearl.engines.base import EngineError, InferenceEngine, ServerSpec
from pearl.runtime.clock import Clock
from pearl.runtime.executor import ExecutionReport, PlanExecutor


@dataclass(frozen=True, slots=True)
class ReturnReport:
    workers: tuple[str, ...]
    aborted_requests: int
    started_at: float
    returned_at: float

    @property
    def delay_s(self) -> float:
        return self.returned_at - self.started_at

    def to_dict(self) -> dict[str, object]:
        return {"workers": list(self.workers), "aborted_requests": self.aborted_requests,
                "started_at": self.started_at, "returned_at": self.returned_at, "delay_s": self.delay_s}


class ToggleManager:
    def __init__(self, executor: PlanExecutor, engine: InferenceEngine, clock: Clock, tp_size: int = 1) -> None:
        self.executor = executor
        self.engine = engine
        self.clock = clock
        self.tp_size = tp_size
        self.borrowed = False
        self.returns: list[ReturnReport] = []

    def overlap_gpus(self) -> list[str]:
        return sorted(g for g, gpu in self.executor.state.gpus.items() if gpu.zone is Zone.OVERLAP)

    async def prepare(self, version: int, path: str) -> list[str]:
        """Launch one retained worker per ``tp`` overlap GPUs and park it (memory released,
        ``inactive``). Run once before the first borrowing; returns the worker ids."""
        state = self.executor.state
        free = [g for g in self.overlap_gpus() if state.owner_of(g) is None]
        groups = [tuple(free[i:i + self.tp_size]) for i in range(0, len(free) - self.tp_size + 1, self.tp_size)]
        ids = [f"o-{g[0]}" for g in groups]

        async def one(wid: str, gpus: tuple[str, ...]) -> None:
            await self.engine.launch(ServerSpec(wid, gpus, Role.COLOCATED, path, version))
            await self.engine.load_weights(wid, path, version)
            await self.engine.release_memory(wid)

        results = await asyncio.gather(*(one(w, g) for w, g in zip(ids, groups, strict=True)),
                                       return_exceptions=True)
        ok = []
        for wid, gpus, res in zip(ids, groups, results, strict=True):
            if isinstance(res, BaseException):
                with contextlib.suppress(EngineError):
                    await self.engine.stop(wid)
                continue
            state = self.executor.state.add_worker(Worker(wid, gpus, Role.COLOCATED, WorkerStatus.INACTIVE))
            self.executor.set_state(state)
            ok.append(wid)
        return ok

    def lend(self) -> list[str]:
        """Training hands its GPUs to rollout (they become part of the rollout budget)."""
        gpus = self.overlap_gpus()
        if gpus:
            self.executor.set_state(self.executor.state.set_lent(gpus, True))
        self.borrowed = bool(gpus)
        return gpus

    async def give_back(self) -> ReturnReport:
        """Mandatory return: drain and park every overlap worker, then un-lend every overlap GPU."""
        t0 = self.clock.now()
        state = self.executor.state
        busy = [w.worker_id for w in state.workers.values()
                if state.zone_of(w) is Zone.OVERLAP and w.status is not WorkerStatus.INACTIVE]
        rep = ExecutionReport()
        await asyncio.gather(*(self._park(w, rep) for w in busy))
        lent = [g for g in self.overlap_gpus() if self.executor.state.gpus[g].lent]
        if lent:
            self.executor.set_state(self.executor.state.set_lent(lent, False))
        self.borrowed = False
        report = ReturnReport(tuple(sorted(busy)), rep.aborted_requests, t0, self.clock.now())
        if busy:  # only real handoffs are reconfigurations (Table 3 deactivation)
            self.returns.append(report)
        return report

    async def _park(self, worker_id: str, rep: ExecutionReport) -> None:
        w = self.executor.state.workers.get(worker_id)
        if w is None:
            return
        if w.status is WorkerStatus.INITIALIZING:  # a worker that never served: park it directly
            self.executor.set_state(self.executor.state.set_status(worker_id, WorkerStatus.INACTIVE))
            with contextlib.suppress(EngineError):
                await self.engine.release_memory(worker_id)
            return
        await self.executor.deactivate(worker_id, rep)
