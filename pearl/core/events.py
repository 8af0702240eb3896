"""Elastic events: the one vocabulary shared by the admin API, the trace replayer, the trainer and
the Elastic Scheduler's event queue (paper Sec. 4.1.2).

Times are seconds on the run's ``Clock`` (virtual time in replays). ``event_id`` makes delivery
idempotent: the Elastic Scheduler applies an event id at most once.
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


@dataclass(frozen=True, slots=True)
class ReclaimNotice:
    """Preemptible GPUs will be taken at ``deadline`` (urgent shrink: release before it)."""

    gpu_ids: tuple[str, ...]
    deadline: float
    notice_id: str = ""
    event_id: str = ""
    kind: EventKind = field(default=EventKind.RECLAIM_NOTICE, init=False)


@dataclass(frozen=True, slots=True)
class NoticeCancelled:
    """A reclaim notice was withdrawn before its deadline."""

    notice_id: str
    event_id: str = ""
    kind: EventKind = field(default=EventKind.NOTICE_CANCELLED, init=False)


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
