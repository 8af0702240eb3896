"""The admin API's book of accepted elastic events: idempotency, one notice per id, durability.

Every event the admin API answers 202 is first written to the book; with a controller journal
(``pearl.runtime.journal.Journal``, table ``events``) the write is one committed SQLite transaction,
so an answer of 202 means the event survives a ``kill -9`` of the controller. Without a journal
(``pearl serve --no-journal``, the API tests over ``StateControlPlane``) the book lives in memory.

Rules the book decides (``EventBook.check``), in this order, before an event reaches the controller:

1. **event id**: an id seen before with the same payload digest is a duplicate (200, nothing
   applied again), with another digest a conflict (409). This is checked before anything is
   looked up, so an AWS EventBridge event redelivered after its instance's GPUs were reclaimed is
   still the documented 200 duplicate.
2. **notice id**: one reclaim notice per ``notice_id``. A second notice with the same id and the
   same notice digest is a duplicate (200); with another digest a conflict (409). The two AWS
   shapes (the EventBridge warning and the instance-metadata ``spot/instance-action`` document)
   carry the instance id as notice id and the notice digest ``cloud:<instance>``: for one
   instance they are one event, whichever arrives first.

Replay (``EventBook.replayable``): after a restart, every event still ``accepted`` is submitted
again in acceptance order. Grants whose GPUs are already in the journaled table and notices whose
GPUs are gone (the shrink happened before the crash) are then reported by the controller as
already applied / unknown and marked ``done``; a notice whose wall-clock deadline has passed maps
to the controller's ``now`` (``pearl.admin.cloud.wall_to_clock``): the shrink starts at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Literal

from pearl.runtime.journal import EventStatus, Journal, JournaledEvent

Verdict = Literal["new", "duplicate", "conflict", "notice_duplicate", "notice_conflict"]


@dataclass(frozen=True, slots=True)
class Check:
    verdict: Verdict
    prior: JournaledEvent | None = None

    @property
    def duplicate(self) -> bool:
        return self.verdict in ("duplicate", "notice_duplicate")


class EventBook:
    """Accepted events by id (and reclaim notices by notice id), durable when given a journal."""

    def __init__(self, journal: Journal | None = None) -> None:
        self._journal = journal
        self._events: dict[str, JournaledEvent] = {}
        self._notices: dict[str, str] = {}  # notice id -> event id of the notice
        for ev in journal.events() if journal is not None else ():
            self._index(ev)

    def _index(self, ev: JournaledEvent) -> None:
        self._events[ev.event_id] = ev
        if ev.notice_id is not None and ev.kind == "reclaim_notice":
            self._notices.setdefault(ev.notice_id, ev.event_id)

    @property
    def durable(self) -> bool:
        return self._journal is not None

    def get(self, event_id: str) -> JournaledEvent | None:
        return self._events.get(event_id)

    def notice(self, notice_id: str) -> JournaledEvent | None:
        eid = self._notices.get(notice_id)
        return None if eid is None else self._events.get(eid)

    def check(self, event_id: str, digest: str, notice_id: str | None = None,
              notice_digest: str | None = None) -> Check:
        prior = self._events.get(event_id)
        if prior is not None:
            return Check("duplicate" if prior.digest == digest else "conflict", prior)
        if notice_id is not None:
            first = self.notice(notice_id)
            if first is not None:
                same = first.body.get("notice_digest") == notice_digest
                return Check("notice_duplicate" if same else "notice_conflict", first)
        return Check("new")

    def accept(self, event_id: str, kind: str, digest: str, body: Mapping[str, Any],
               notice_id: str | None = None, status: EventStatus = "accepted") -> JournaledEvent:
        """Write the event (durably with a journal) before the API answers 202."""
        seq = max((e.seq for e in self._events.values()), default=0) + 1
        ev = JournaledEvent(event_id, kind, digest, status, MappingProxyType(dict(body)), notice_id, seq)
        if self._journal is not None:
            self._journal.record_event(ev)
        self._index(ev)
        return ev

    def drop(self, event_id: str) -> None:
        """The controller rejected the event: forget it (a corrected retry may reuse the id)."""
        ev = self._events.pop(event_id, None)
        if ev is not None and ev.notice_id is not None and self._notices.get(ev.notice_id) == event_id:
            del self._notices[ev.notice_id]
        if self._journal is not None:
            self._journal.drop_event(event_id)

    def set_status(self, event_id: str, status: EventStatus) -> None:
        ev = self._events.get(event_id)
        if ev is None or ev.status == status:
            return
        self._events[event_id] = replace(ev, status=status)
        if self._journal is not None:
            self._journal.set_event_status(event_id, status)

    def replayable(self) -> list[JournaledEvent]:
        """Accepted grants and reclaim notices not yet known to be done, in acceptance order. A grant
        whose GPUs a later notice names is not replayed: it was applied (a notice is accepted only for
        GPUs in the table), and re-granting GPUs the cloud may already have taken would be wrong."""
        events = sorted(self._events.values(), key=lambda e: e.seq)
        noticed: dict[str, int] = {}
        for e in events:
            if e.kind == "reclaim_notice":
                for g in e.body.get("gpu_ids", []):
                    noticed[str(g)] = max(noticed.get(str(g), 0), e.seq)
        out = []
        for e in events:
            if e.status != "accepted" or e.kind not in ("gpus_granted", "reclaim_notice"):
                continue
            if e.kind == "gpus_granted" and any(noticed.get(str(g["gpu_id"]), 0) > e.seq for g in e.body["gpus"]):
                self.set_status(e.event_id, "done")
                continue
            out.append(e)
        return out

    def settle(self, gpus_in_table: Iterable[str]) -> None:
        """Mark ``done`` what the table shows finished: grants whose GPUs are all in it, notices whose
        GPUs have all left it."""
        present = set(gpus_in_table)
        for e in list(self._events.values()):
            if e.status != "accepted":
                continue
            granted = e.kind == "gpus_granted" and all(g["gpu_id"] in present for g in e.body.get("gpus", []))
            reclaimed = e.kind == "reclaim_notice" and not any(g in present for g in e.body.get("gpu_ids", []))
            if granted or reclaimed:
                self.set_status(e.event_id, "done")

    def pending_grant_gpus(self) -> set[str]:
        """GPU ids of accepted grants (what the controller may not have put in its table yet)."""
        return {g["gpu_id"] for e in self._events.values() if e.status == "accepted" and e.kind == "gpus_granted"
                for g in e.body.get("gpus", [])}
