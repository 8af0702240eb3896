"""Elastic events: the one vocabulary shared by the admin API, the trace replayer, the trainer and
the Elastic Scheduler's event queue (paper Sec. 4.1.2).

Times are seconds on the run's ``Clock`` (virtual time in replays). An outside event enters
through the one door (``pearl.runtime.door.EventDoor``), which makes delivery idempotent on
``event_id`` (the client's namespace) and names each reclaim by its ``ReclaimKey``; the runtime's own
events (training start / finish, refits) go to the Elastic Scheduler directly and are never
compared with client ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class EventKind(StrEnum):
    GPUS_GRANTED = "gpus_granted"
    RECLAIM_NOTICE = "reclaim_notice"
    NOTICE_CANCELLED = "notice_cancelled"
    TRAINING_STARTED = "training_started"
    TRAINING_FINISHED = "training_finished"
    PROFILE_REFIT = "profile_refit"


@dataclass(frozen=True, slots=True)
class GrantedGpu:
    gpu_id: str
    node: str = "node0"
    instance_id: str | None = None


@dataclass(frozen=True, slots=True)
class GpusGranted:
    """Preemptible GPUs became available (inter-scale expansion is optional and gated)."""

    gpus: tuple[GrantedGpu, ...]
    event_id: str = ""
    kind: EventKind = field(default=EventKind.GPUS_GRANTED, init=False)


@dataclass(frozen=True, slots=True, order=True)
class ReclaimKey:
    """Which reclaim a notice belongs to: what it takes (``target``: the cloud instance, else its
    GPUs as ``gpu+gpu``) and the ``generation`` of the grant that brought those GPUs (the door's
    sequence number of that grant; 0 for GPUs the cluster started with). Every notice for one key
    is one reclaim whose deadline is the earliest given; a re-granted instance has a new key."""

    target: str
    generation: int = 0

    @property
    def label(self) -> str:
        return f"{self.target}@{self.generation}"


@dataclass(frozen=True, slots=True)
class ReclaimNotice:
    """Preemptible GPUs will be taken at ``deadline`` (urgent shrink: release before it).

    ``notice_id``: the client's name for the notice (cancel it by this id); ``reclaim``: the key the
    door gave it (None outside the door: the scheduler keys the notice by ``notice_id``)."""

    gpu_ids: tuple[str, ...]
    deadline: float
    notice_id: str = ""
    event_id: str = ""
    reclaim: ReclaimKey | None = None
    kind: EventKind = field(default=EventKind.RECLAIM_NOTICE, init=False)

    @property
    def key(self) -> ReclaimKey:
        return self.reclaim or ReclaimKey(self.notice_id or self.event_id or "+".join(self.gpu_ids))


@dataclass(frozen=True, slots=True)
class NoticeCancelled:
    """A reclaim notice was withdrawn before its deadline (``reclaim``: as ``ReclaimNotice``)."""

    notice_id: str
    event_id: str = ""
    reclaim: ReclaimKey | None = None
    kind: EventKind = field(default=EventKind.NOTICE_CANCELLED, init=False)

    @property
    def key(self) -> ReclaimKey:
        return self.reclaim or ReclaimKey(self.notice_id)


@dataclass(frozen=True, slots=True)
class TrainingStarted:
    """Training needs its GPUs: borrowed overlap GPUs must be returned (mandatory)."""

    step: int
    event_id: str = ""
    kind: EventKind = field(default=EventKind.TRAINING_STARTED, init=False)


@dataclass(frozen=True, slots=True)
class TrainingFinished:
    """Training GPUs are idle until the next update: borrowing may be admitted (gated).

    ``expected_idle_s`` is the trainer's estimate of the idle window (None: unknown, the gate uses
    its own estimate).
    """

    step: int
    weight_version: int
    expected_idle_s: float | None = None
    event_id: str = ""
    kind: EventKind = field(default=EventKind.TRAINING_FINISHED, init=False)


@dataclass(frozen=True, slots=True)
class ProfileRefit:
    """The Runtime Tracker refit the workload profile after a rollout step."""

    step: int
    event_id: str = ""
    kind: EventKind = field(default=EventKind.PROFILE_REFIT, init=False)


ElasticEvent = GpusGranted | ReclaimNotice | NoticeCancelled | TrainingStarted | TrainingFinished | ProfileRefit
