"""The one door every outside elastic event enters: the admin API, the cloud watchers, a lost node
and the trace replayer all call ``EventDoor.admit``; the runtime's own events (training start and
finish, refits) go to the Elastic Scheduler directly, so a client id can never suppress them.

One ``admit`` does, in this order, under one lock:

1. **idempotency** on the client's ``event_id``: seen with the same payload digest -> a duplicate
   (nothing applied again), with another digest -> ``EventRefused("idempotency_conflict")``;
2. the journal's health: a faulted journal (disk full, I/O error) -> ``JournalUnavailable``
   naming the cause (the admin API answers 503; nothing is acknowledged that is not durable);
3. ``build`` the typed event (an instance lookup may raise ``UnknownResourceError``) and the
   caller's ``check`` (the admin API's policy); every id it carries (the client's event id, GPU,
   node, instance and notice ids) must follow ``pearl.core.ids`` (no path separator, no ``..``:
   worker ids and folders are built from them), whichever source sent it, else
   ``EventRefused("invalid_id")`` naming the field;
4. **reclaim identity**: a ``ReclaimNotice`` gets its ``ReclaimKey`` = (the instance it names, else
   its GPUs; the generation of the grant that brought them). A notice for a live key *tightens* the
   reclaim: the deadline is the earliest given, and it is never a duplicate. A key whose GPUs were
   granted again has a new generation: a new reclaim. A cancelled key can be armed again. A
   client ``notice_id`` names one reclaim (a second reclaim under a live id ->
   ``EventRefused("notice_conflict")``); instance ids and client notice ids never meet;
5. **journal before acknowledging** (``Journal.commit``, off the event loop): the event with its
   digest, its key and its deadline as absolute UTC (and the clock's reading, with the clock's
   ``epoch``: a restart on the same boot keeps the monotonic deadline, whatever the wall clock did);
6. hand the scheduler the typed event (``apply``); a refusal (``ValueError``,
   ``UnknownResourceError``) un-journals it, so a corrected retry may reuse the id.

After a restart ``replay`` submits the accepted grants and notices again (a grant whose GPUs a later
notice names is not: it was applied and the cloud may have taken them); ``settle`` marks ``done``
what the table shows finished. Admission costs the same at any journal size: every lookup is a
dict, the journal keeps its sequence in memory, and ``settle`` looks only at the events still
``accepted``.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from pearl.core.events import (
    ElasticEvent,
    EventKind,
    GpusGranted,
    GrantedGpu,
    NoticeCancelled,
    ReclaimKey,
    ReclaimNotice,
    TrainingFinished,
    TrainingStarted,
)
from pearl.core.ids import ident_problem
from pearl.runtime.journal import EventStatus, Journal, JournaledEvent
from pearl.runtime.outcomes import SubmitResult, UnknownResourceError

log = logging.getLogger("pearl.door")


class EventRefused(ValueError):
    """The door refused an event (``code``: ``idempotency_conflict``, ``notice_conflict`` or
    ``invalid_id``; ``field``: the field at fault)."""

    def __init__(self, code: str, field: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.field = field


class JournalUnavailable(RuntimeError):
    """The journal cannot write (``reason``: disk full, I/O error, locked); nothing was accepted."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"journal unavailable: {reason}")
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Arrival:
    """An outside event at the door: its client id and payload digest, how to build it (run only
    once the idempotency check passed), the instance a notice names (``target``), the caller's
    ``check`` (raises to refuse) and the ``source`` (for the log)."""

    event_id: str
    digest: str
    kind: EventKind
    build: Callable[[], ElasticEvent]
    target: str | None = None
    check: Callable[[ElasticEvent], None] | None = None
    source: str = "api"

    @staticmethod
    def of(event: ElasticEvent, source: str, target: str | None = None) -> Arrival:
        """An event built elsewhere (trace replay, a lost node): its digest is its fields but the id."""
        body = repr(replace(event, event_id=""))
        digest = hashlib.sha256(f"{source}|{body}".encode()).hexdigest()[:32]
        return Arrival(event.event_id, digest, event.kind, lambda: event, target, None, source)


@dataclass(frozen=True, slots=True)
class Admission:
    """What the door did: ``applied`` (handed to the scheduler), ``duplicate`` (an id seen before;
    ``prior`` is its first event), the GPUs the event names and the scheduler's ``detail``."""

    applied: bool
    duplicate: bool
    event_id: str
    kind: str
    gpu_ids: tuple[str, ...] = ()
    detail: str = ""
    reclaim: ReclaimKey | None = None

    def result(self) -> SubmitResult:
        return SubmitResult(self.applied, self.duplicate, self.event_id, self.detail)


@dataclass(frozen=True, slots=True)
class _Seen:
    digest: str
    kind: str
    gpu_ids: tuple[str, ...]
    seq: int


@dataclass
class _Reclaim:
    """A live reclaim: its GPUs, the earliest deadline (clock and UTC), the notices that named it."""

    gpus: tuple[str, ...]
    deadline: float
    deadline_wall: float
    events: list[str] = field(default_factory=list)
    cancelled: bool = False


class EventDoor:
    """The door (module docstring). ``apply``: the scheduler's submit; ``gpus``: the GPU ids in the
    table now; ``clock_now`` / ``wall_now``: the run's clock and UTC; ``clock_epoch``: names the
    clock's origin (the boot id for a monotonic clock; None: never reused across a restart)."""

    def __init__(self, apply: Callable[[ElasticEvent], Awaitable[SubmitResult]],
                 gpus: Callable[[], Iterable[str]], journal: Journal | None,
                 clock_now: Callable[[], float], wall_now: Callable[[], float],
                 clock_epoch: str | None = None) -> None:
        self._apply = apply
        self._gpus = gpus
        self.journal = journal
        self._clock_now = clock_now
        self._wall_now = wall_now
        self._epoch = clock_epoch
        self._lock = asyncio.Lock()
        self._seen: dict[str, _Seen] = {}
        self._accepted: dict[str, JournaledEvent] = {}  # not yet done: replayed after a restart
        self._gen: dict[str, int] = {}  # GPU -> generation of the grant that brought it
        self._live: dict[ReclaimKey, _Reclaim] = {}
        self._names: dict[str, ReclaimKey] = {}  # client notice id -> its reclaim
        self._reclaimed: dict[str, ReclaimKey] = {}  # target -> its last finished reclaim
        self._seq = 0
        self._anon = itertools.count(1)
        for ev in journal.events() if journal is not None else ():
            self._index(ev)

    # ------------------------------------------------------------------ state
    @property
    def fault(self) -> str | None:
        """Why events cannot be accepted now (the journal's fault), None when they can."""
        return None if self.journal is None else self.journal.fault

    def seen(self, event_id: str) -> bool:
        return event_id in self._seen

    def count(self, kind: EventKind) -> int:
        return sum(1 for s in self._seen.values() if s.kind == kind.value)

    def pending_grant_gpus(self) -> set[str]:
        """GPU ids of accepted grants (what the scheduler may not have put in its table yet)."""
        return {g for e in self._accepted.values() if e.kind == EventKind.GPUS_GRANTED.value
                for g in _gpu_list(e)}

    def _index(self, ev: JournaledEvent) -> None:
        self._seq = max(self._seq, ev.seq)
        self._seen[ev.event_id] = _Seen(ev.digest, ev.kind, tuple(_gpu_list(ev)), ev.seq)
        if ev.status == "accepted":
            self._accepted[ev.event_id] = ev
        else:
            self._accepted.pop(ev.event_id, None)
        b = ev.body
        if ev.kind == EventKind.GPUS_GRANTED.value:
            for g in _gpu_list(ev):
                self._gen[g] = int(b.get("generation", ev.seq))
        elif ev.kind == EventKind.RECLAIM_NOTICE.value and "target" in b:
            key = ReclaimKey(str(b["target"]), int(b.get("generation", 0)))
            if b.get("notice_id"):
                self._names[str(b["notice_id"])] = key
            if ev.status == "accepted":
                wall = float(b["deadline_wall"])
                live = self._live.get(key)
                if live is None or live.cancelled:
                    live = self._live[key] = _Reclaim(tuple(b["gpu_ids"]), self._restored(b), wall)
                elif wall < live.deadline_wall:
                    live.deadline, live.deadline_wall = self._restored(b), wall
                live.events.append(ev.event_id)

    def _restored(self, body: Mapping[str, Any]) -> float:
        """A journaled deadline on this run's clock: the clock reading itself when the clock has the
        same epoch (same boot: the monotonic clock did not step), else ``now_c + (t_w - now_w)``."""
        if self._epoch is not None and body.get("clock_epoch") == self._epoch and "deadline_clock" in body:
            return float(body["deadline_clock"])
        now_c = self._clock_now()
        return now_c + max(0.0, float(body["deadline_wall"]) - self._wall_now())

    # ------------------------------------------------------------------ the door
    async def submit(self, event: ElasticEvent, source: str) -> SubmitResult:
        """``admit`` for an event built elsewhere (trace replay, a lost node, tools)."""
        return (await self.admit(Arrival.of(event, source))).result()

    async def admit(self, a: Arrival) -> Admission:
        """The one call (module docstring). Raises ``EventRefused`` (409), ``JournalUnavailable``
        (503), ``UnknownResourceError`` (404) or the scheduler's ``ValueError`` (409)."""
        async with self._lock:
            return await self._admit(a)

    async def _admit(self, a: Arrival) -> Admission:
        eid = a.event_id or f"{a.source}:anon-{next(self._anon)}"
        prior = self._seen.get(eid)
        if prior is not None:
            if prior.digest != a.digest:
                raise EventRefused("idempotency_conflict", "event_id",
                                   f"event id {eid!r} was already used with a different payload")
            return Admission(False, True, eid, a.kind.value, prior.gpu_ids, f"already accepted as event {eid}")
        if self.fault is not None:
            raise JournalUnavailable(self.fault)
        self.settle()
        try:
            event = replace(a.build(), event_id=eid)
        except UnknownResourceError:
            done = self._reclaimed.get(a.target or "")
            if done is None:
                raise
            # a late notice for an instance whose reclaim finished (its GPUs left): nothing to do
            return Admission(False, True, eid, a.kind.value, (), f"reclaim {done.label} already done")
        if a.check is not None:
            a.check(event)
        for what, value in _event_ids(event, a.event_id):
            problem = ident_problem(what, value)
            if problem is not None:
                raise EventRefused("invalid_id", what, problem)
        event, note = self._identify(event, a.target)
        body = self._body(event)
        status: EventStatus = "accepted" if isinstance(event, GpusGranted | ReclaimNotice) else "done"
        record = JournaledEvent(eid, a.kind.value, a.digest, status, MappingProxyType(body),
                                event.notice_id if isinstance(event, ReclaimNotice) and event.notice_id else None,
                                self._seq + 1)
        if self.journal is not None:
            j = self.journal
            await j.commit(lambda: j.record_event(record), f"event {eid}")
        self._index(record)
        try:
            result = await self._apply(event)
        except (ValueError, UnknownResourceError):
            await self._forget(record)
            raise
        self._after(event)
        gpus = _event_gpus(event)
        detail = f"{result.detail}{note}"
        log.info("event %s id=%s from %s: %s", a.kind.value, eid, a.source, detail)
        return Admission(result.applied, result.duplicate, eid, a.kind.value, gpus, detail,
                         event.reclaim if isinstance(event, ReclaimNotice | NoticeCancelled) else None)

    def _identify(self, event: ElasticEvent, target: str | None) -> tuple[ElasticEvent, str]:
        """A notice's ``ReclaimKey`` and the deadline it stands for (the earliest of its key); a
        cancellation's key from the client's notice id."""
        if isinstance(event, NoticeCancelled):
            key = self._names.get(event.notice_id)
            live = self._live.get(key) if key is not None else None
            if key is None or live is None or live.cancelled:
                raise UnknownResourceError("notice", event.notice_id)
            return replace(event, reclaim=key), ""
        if not isinstance(event, ReclaimNotice):
            return event, ""
        gpus = tuple(event.gpu_ids)
        key = ReclaimKey(target or "+".join(sorted(gpus)), max((self._gen.get(g, 0) for g in gpus), default=0))
        name = event.notice_id
        named = self._names.get(name) if name else None
        if named is not None and named != key and self._is_live(named):
            raise EventRefused("notice_conflict", "notice_id",
                               f"notice_id {name!r} already names the reclaim of {named.target}; "
                               "one reclaim per notice id (cancel it first)")
        live = self._live.get(key)
        note = ""
        if live is not None and not live.cancelled and live.deadline <= event.deadline:
            note = f" (reclaim {key.label} stays due at t={live.deadline:.1f}: the earliest deadline wins)"
        return replace(event, reclaim=key, notice_id=name or event.event_id), note

    def _is_live(self, key: ReclaimKey) -> bool:
        live = self._live.get(key)
        return live is not None and not live.cancelled

    def _body(self, event: ElasticEvent) -> dict[str, Any]:
        """The event as JSON data for the journal; a deadline as absolute UTC (and the clock's own
        reading with its epoch)."""
        if isinstance(event, GpusGranted):
            return {"gpus": [{"gpu_id": g.gpu_id, "node": g.node, "instance_id": g.instance_id} for g in event.gpus],
                    "generation": self._seq + 1}
        if isinstance(event, ReclaimNotice):
            assert event.reclaim is not None
            now_c, now_w = self._clock_now(), self._wall_now()
            body: dict[str, Any] = {"gpu_ids": list(event.gpu_ids), "deadline_wall": now_w + (event.deadline - now_c),
                                    "notice_id": event.notice_id, "target": event.reclaim.target,
                                    "generation": event.reclaim.generation}
            if self._epoch is not None:
                body.update(deadline_clock=event.deadline, clock_epoch=self._epoch)
            return body
        if isinstance(event, NoticeCancelled):
            return {"notice_id": event.notice_id}
        if isinstance(event, TrainingStarted):
            return {"step": event.step}
        if isinstance(event, TrainingFinished):
            return {"step": event.step, "weight_version": event.weight_version, "expected_idle_s": event.expected_idle_s}
        return {}

    def _after(self, event: ElasticEvent) -> None:
        if isinstance(event, NoticeCancelled) and event.reclaim is not None:
            live = self._live[event.reclaim]
            live.cancelled = True
            for eid in live.events:
                self._set_status(eid, "cancelled")

    async def _forget(self, record: JournaledEvent) -> None:
        """The scheduler refused the event: un-journal and un-index it."""
        self._seen.pop(record.event_id, None)
        self._accepted.pop(record.event_id, None)
        b = record.body
        if record.kind == EventKind.RECLAIM_NOTICE.value:
            key = ReclaimKey(str(b["target"]), int(b["generation"]))
            live = self._live.get(key)
            if live is not None and record.event_id in live.events:
                live.events.remove(record.event_id)
                if not live.events:
                    del self._live[key]
        if self.journal is not None:
            j = self.journal
            await j.commit(lambda: j.drop_event(record.event_id), f"drop event {record.event_id}")

    def _set_status(self, event_id: str, status: EventStatus) -> None:
        ev = self._accepted.pop(event_id, None)
        if ev is None:
            return
        if self.journal is not None:
            j = self.journal
            j.post(lambda: j.set_event_status(event_id, status), f"status of event {event_id}")

    # ------------------------------------------------------------------ after a restart
    def settle(self) -> None:
        """Mark ``done`` what the table shows finished: grants whose GPUs are all in it, notices whose
        GPUs have all left it (a reclaim whose GPUs left is no longer live)."""
        if not self._accepted and not self._live:
            return
        present = set(self._gpus())
        for e in list(self._accepted.values()):
            gpus = _gpu_list(e)
            granted = e.kind == EventKind.GPUS_GRANTED.value and all(g in present for g in gpus)
            reclaimed = e.kind == EventKind.RECLAIM_NOTICE.value and not any(g in present for g in gpus)
            if granted or reclaimed:
                self._set_status(e.event_id, "done")
        for key, live in list(self._live.items()):
            if live.cancelled or not any(g in present for g in live.gpus):
                del self._live[key]
                if not live.cancelled:
                    self._reclaimed[key.target] = key

    async def replay(self) -> dict[str, int]:
        """Submit again every accepted grant and reclaim notice not yet finished, in acceptance
        order; returns counts by outcome (``replayed``, ``done``)."""
        out = {"replayed": 0, "done": 0}
        async with self._lock:
            self.settle()
            events = sorted(self._accepted.values(), key=lambda e: e.seq)
            noticed: dict[str, int] = {}  # GPU -> the last notice naming it (done or not)
            for seen in self._seen.values():
                if seen.kind == EventKind.RECLAIM_NOTICE.value:
                    for g in seen.gpu_ids:
                        noticed[g] = max(noticed.get(g, 0), seen.seq)
            for e in events:
                if e.kind == EventKind.GPUS_GRANTED.value and any(noticed.get(g, 0) > e.seq for g in _gpu_list(e)):
                    self._set_status(e.event_id, "done")
                    continue
                try:
                    res = await self._apply(self._rebuilt(e))
                except (UnknownResourceError, ValueError) as err:
                    log.info("journaled event %s %s: nothing to replay (%s)", e.kind, e.event_id, err)
                    self._set_status(e.event_id, "done")
                    out["done"] += 1
                    continue
                out["replayed"] += 1
                log.info("journaled event %s %s replayed: %s", e.kind, e.event_id, res.detail)
        return out

    def _rebuilt(self, rec: JournaledEvent) -> ElasticEvent:
        b = rec.body
        if rec.kind == EventKind.GPUS_GRANTED.value:
            return GpusGranted(tuple(GrantedGpu(g["gpu_id"], g["node"], g.get("instance_id")) for g in b["gpus"]),
                               event_id=rec.event_id)
        if rec.kind == EventKind.RECLAIM_NOTICE.value:
            key = ReclaimKey(str(b["target"]), int(b.get("generation", 0))) if "target" in b else None
            live = self._live.get(key) if key is not None else None
            deadline = live.deadline if live is not None else self._restored(b)
            return ReclaimNotice(tuple(b["gpu_ids"]), deadline, notice_id=str(b.get("notice_id") or rec.event_id),
                                 event_id=rec.event_id, reclaim=key)
        raise ValueError(f"journaled event {rec.event_id!r} of kind {rec.kind!r} is not replayed")


def _gpu_list(ev: JournaledEvent) -> list[str]:
    if ev.kind == EventKind.GPUS_GRANTED.value:
        return [str(g["gpu_id"]) for g in ev.body.get("gpus", [])]
    return [str(g) for g in ev.body.get("gpu_ids", [])]


def _event_ids(event: ElasticEvent, client_id: str) -> list[tuple[str, str]]:
    """``(field, id)`` of every outside id ``event`` carries (``client_id``: the caller's event id)."""
    out = [("event_id", client_id)] if client_id else []
    if isinstance(event, GpusGranted):
        for g in event.gpus:
            out += [("gpu_id", g.gpu_id), ("node", g.node)] + ([("instance_id", g.instance_id)] if g.instance_id else [])
    elif isinstance(event, ReclaimNotice):
        out += [("gpu_ids", g) for g in event.gpu_ids] + ([("notice_id", event.notice_id)] if event.notice_id else [])
    elif isinstance(event, NoticeCancelled):
        out.append(("notice_id", event.notice_id))
    return out


def _event_gpus(event: ElasticEvent) -> tuple[str, ...]:
    if isinstance(event, GpusGranted):
        return tuple(g.gpu_id for g in event.gpus)
    if isinstance(event, ReclaimNotice):
        return event.gpu_ids
    return ()
