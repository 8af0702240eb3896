"""What the journal stores, as values: a partial output, an accepted event, a recovered run, and a
completed trajectory's JSON form (``record_to_json`` / ``record_from_json``: floats round-trip
exactly). Pure data and pure functions; ``pearl.runtime.journal.Journal`` reads and writes them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from pearl.core.trajectory import Segment, TrajectoryRecord, TrajectoryStatus

#: ``events.status``: ``accepted`` (journaled, answered 202, replayed after a restart), ``done``
#: (nothing left to replay: a notice whose GPUs are gone, a grant whose GPUs are in the table, a
#: training event), ``cancelled`` (a notice withdrawn by ``NoticeCancelled``)
EventStatus = Literal["accepted", "done", "cancelled"]


@dataclass(frozen=True, slots=True)
class PartialOutput:
    """One journaled response part of an in-flight trajectory (an aborted request's output)."""

    traj_id: str
    turn: int
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    weight_version: int
    seq: int = 0
    input_len: int = -1  # prompt length the part was generated on (-1: unknown)
    finished: bool = False  # the request ended normally with this part (the turn's output is complete)

    def segment(self) -> Segment:
        return Segment(
            token_ids=self.tokens, trained=True, logprobs=self.logprobs, weight_version=self.weight_version,
            turn=self.turn,
        )


@dataclass(frozen=True, slots=True)
class JournaledEvent:
    """One elastic event the admin API accepted (``Journal.record_event``).

    ``body``: the event as JSON-able data, deadlines as wall-clock POSIX seconds (a restarted
    controller's clock has another origin); ``digest``: the request's payload digest (same id with
    another digest is an idempotency conflict); ``notice_id``: a reclaim notice's id (one notice
    per id)."""

    event_id: str
    kind: str
    digest: str
    status: str
    body: Mapping[str, Any]
    notice_id: str | None = None
    seq: int = 0


@dataclass(frozen=True, slots=True)
class RecoveredRun:
    """What a restarted controller gets back.

    ``completed``: every completed trajectory in completion order; ``consumed``: the ids of those the
    trainer already took; ``partials``: per in-flight trajectory, its parts in write order;
    ``state``: the last journaled ``ClusterState.to_dict()`` (None if never written).
    """

    completed: tuple[TrajectoryRecord, ...]
    partials: Mapping[str, tuple[PartialOutput, ...]]
    state: dict[str, Any] | None
    consumed: frozenset[str] = field(default_factory=frozenset)

    @property
    def unconsumed(self) -> tuple[TrajectoryRecord, ...]:
        """Completed trajectories the trainer has not taken yet (re-queue these, do not regenerate)."""
        return tuple(r for r in self.completed if r.traj_id not in self.consumed)

    @property
    def partial_tokens(self) -> int:
        return sum(len(p.tokens) for ps in self.partials.values() for p in ps)


# ------------------------------------------------------------------------------ serialization
def record_to_json(rec: TrajectoryRecord) -> str:
    """``TrajectoryRecord`` -> JSON text (floats round-trip exactly; ``info`` values via ``str`` if
    they are not JSON types)."""
    body = {
        "traj_id": rec.traj_id,
        "group_id": rec.group_id,
        "reward": rec.reward,
        "status": rec.status.value,
        "info": dict(rec.info),
        "segments": [
            {"t": list(s.token_ids), "tr": s.trained, "lp": list(s.logprobs), "v": s.weight_version, "turn": s.turn}
            for s in rec.segments
        ],
    }
    return json.dumps(body, separators=(",", ":"), default=str)


def record_from_json(text: str) -> TrajectoryRecord:
    d = json.loads(text)
    return TrajectoryRecord(
        traj_id=d["traj_id"],
        group_id=d["group_id"],
        segments=tuple(
            Segment(token_ids=tuple(s["t"]), trained=s["tr"], logprobs=tuple(s["lp"]), weight_version=s["v"],
                    turn=s["turn"])
            for s in d["segments"]
        ),
        reward=d["reward"],
        status=TrajectoryStatus(d["status"]),
        info=MappingProxyType(d["info"]),
    )
