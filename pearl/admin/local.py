"""``StateControlPlane``: a small, real ``ControlPlane`` over ``ClusterState`` without schedulers.

It applies elastic events straight to the GPU-worker-role table, with no decision engine and no
engines behind it. The admin API's tests and benchmark use it to exercise the API alone; a real run
uses ``pearl.runtime.controller.Controller``. Semantics (simplified on purpose, and only these):

- ``GpusGranted``: each GPU joins the preemptible zone with one colocated worker (``w-<gpu>``),
  ``initializing`` (there is no engine to bring it up). A GPU already in the table -> ValueError.
- ``ReclaimNotice``: unknown GPU -> UnknownResourceError; the notice is held, under its
  ``ReclaimKey``, until its deadline (a notice for a held key moves the deadline to the earliest
  given), then its GPUs (and their workers) are removed. Deadlines are checked lazily on every call.
- ``NoticeCancelled``: unknown (or already expired) notice -> UnknownResourceError.
- ``TrainingStarted``: serving overlap workers drain to inactive; overlap GPUs are un-lent.
- ``TrainingFinished``: overlap GPUs are lent; inactive overlap workers become active.

Events enter through the same door as a real run's (``pearl.runtime.door.EventDoor``, durable
with a ``journal``): an event id is applied at most once.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pearl.core.events import (
    ElasticEvent,
    GpusGranted,
    NoticeCancelled,
    ReclaimKey,
    ReclaimNotice,
    TrainingFinished,
    TrainingStarted,
)
from pearl.core.state import ClusterState, Gpu, Role, Worker, WorkerStatus, Zone
from pearl.runtime.control import Progress, SubmitResult, UnknownResourceError
from pearl.runtime.door import EventDoor
from pearl.runtime.journal import Journal


@dataclass(frozen=True, slots=True)
class _Notice:
    notice_id: str
    gpu_ids: tuple[str, ...]
    deadline: float


class StateControlPlane:
    def __init__(
        self,
        state: ClusterState,
        now: Callable[[], float],
        config: dict[str, Any] | None = None,
        history_len: int = 1000,
        journal: Journal | None = None,
        wall_now: Callable[[], float] = time.time,
        clock_epoch: str | None = None,
    ) -> None:
        self.state = state
        self._now = now
        self._t0 = now()
        self._config = config or {}
        self._notices: dict[ReclaimKey, _Notice] = {}
        self._history: deque[dict[str, Any]] = deque(maxlen=history_len)
        self.events_applied = 0
        self.door = EventDoor(self._submit, self._gpu_ids, journal, now, wall_now,
                              clock_epoch)

    # ------------------------------------------------------------------ ControlPlane
    async def submit(self, event: ElasticEvent, source: str = "trace") -> SubmitResult:
        return await self.door.submit(event, source)

    async def _submit(self, event: ElasticEvent) -> SubmitResult:
        self._expire()
        detail = self._apply(event)
        self.events_applied += 1
        self._history.append(
            {"type": "event", "kind": event.kind.value, "event_id": event.event_id, "t": self._now(), "detail": detail}
        )
        return SubmitResult(applied=True, event_id=event.event_id, detail=detail)

    def instance_gpus(self, instance_id: str) -> tuple[str, ...]:
        gpus = self.state.gpus_of_instance(instance_id)
        if not gpus:
            raise UnknownResourceError("instance", instance_id)
        return gpus

    def state_dict(self) -> dict[str, Any]:
        self._expire()
        return self.state.to_dict()

    def decision_dict(self) -> dict[str, Any] | None:
        return None  # no decision engine behind this control plane

    def history(self, limit: int = 100) -> list[dict[str, Any]]:
        return list(self._history)[-limit:] if limit > 0 else []

    def progress(self) -> Progress:
        return Progress(uptime_s=self._now() - self._t0, extra={"events_applied": self.events_applied})

    def config_dict(self) -> dict[str, Any]:
        return dict(self._config)

    def _gpu_ids(self) -> list[str]:
        self._expire()
        return list(self.state.gpus)

    # ------------------------------------------------------------------ events
    def _apply(self, event: ElasticEvent) -> str:
        if isinstance(event, GpusGranted):
            for i, g in enumerate(event.gpus):
                if g.gpu_id in self.state.gpus:
                    raise ValueError(f"gpus[{i}].gpu_id: GPU {g.gpu_id!r} is already in the cluster")
            st = self.state.add_gpus(
                Gpu(g.gpu_id, Zone.PREEMPTIBLE, node=g.node, instance_id=g.instance_id) for g in event.gpus
            )
            for g in event.gpus:
                st = st.add_worker(Worker(f"w-{g.gpu_id}", (g.gpu_id,), Role.COLOCATED, WorkerStatus.INITIALIZING))
            self.state = st
            return f"granted {len(event.gpus)} GPU(s)"
        if isinstance(event, ReclaimNotice):
            for gid in event.gpu_ids:
                if gid not in self.state.gpus:
                    raise UnknownResourceError("GPU", gid)
            nid = event.notice_id or event.event_id
            held = self._notices.get(event.key)
            deadline = min(event.deadline, held.deadline) if held is not None else event.deadline
            self._notices[event.key] = _Notice(nid, tuple(event.gpu_ids), deadline)
            self._expire()
            return f"notice {nid}: {len(event.gpu_ids)} GPU(s) reclaimed at t={deadline:.3f}"
        if isinstance(event, NoticeCancelled):
            if self._notices.pop(event.key, None) is None:
                raise UnknownResourceError("notice", event.notice_id)
            return f"notice {event.notice_id} cancelled"
        if isinstance(event, TrainingStarted):
            st = self.state
            overlap = [g for g, gpu in st.gpus.items() if gpu.zone is Zone.OVERLAP]
            for w in list(st.workers.values()):
                if st.zone_of(w) is Zone.OVERLAP and w.status in (WorkerStatus.ACTIVE, WorkerStatus.DRAINING):
                    st = st.set_status(w.worker_id, WorkerStatus.DRAINING).set_status(w.worker_id, WorkerStatus.INACTIVE)
            self.state = st.set_lent(overlap, False) if overlap else st
            return f"training step {event.step}: {len(overlap)} overlap GPU(s) returned"
        if isinstance(event, TrainingFinished):
            st = self.state
            overlap = [g for g, gpu in st.gpus.items() if gpu.zone is Zone.OVERLAP]
            st = st.set_lent(overlap, True) if overlap else st
            for w in list(st.workers.values()):
                if st.zone_of(w) is Zone.OVERLAP and w.status is WorkerStatus.INACTIVE:
                    st = st.set_status(w.worker_id, WorkerStatus.ACTIVE)
            self.state = st
            return f"training step {event.step} done: {len(overlap)} overlap GPU(s) lent"
        return f"{event.kind.value} recorded"

    def _expire(self) -> None:
        now = self._now()
        for key, n in list(self._notices.items()):
            if n.deadline <= now:
                del self._notices[key]
                present = [g for g in n.gpu_ids if g in self.state.gpus]
                self.state = self.state.remove_gpus(present)
                self._history.append({"type": "reclaim", "notice_id": n.notice_id, "gpu_ids": present, "t": now})
