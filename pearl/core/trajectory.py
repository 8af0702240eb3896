"""Trajectories and their life cycle: the unit of rollout work that must never be lost or duplicated.

A trajectory is a multi-turn episode. Its token sequence is a list of ``Segment`` s, each either
*prompt* tokens (system prompt, task, environment observations: not trained on) or *response*
tokens produced by the policy (trained on, with the sampling logprob of every token and the weight
version that produced it). An interrupted request contributes a response segment with its partial
tokens; its resumption appends a second response segment, so the trajectory records one seamless
response whose parts carry their own weight versions.

Life cycle (one table, ``TRAJECTORY_TRANSITIONS``; terminal states after ``done``)::

    pending -> running <-> interrupted          (interrupted: partial output kept, waiting to resume)
               running <-> env                  (an environment step is in progress)
               running | env | interrupted -> completed | failed
    pending -> failed                           (e.g. the environment could not be reset)
    completed -> consumed                       (handed to the trainer exactly once)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

#: the placeholder of a logprob an engine did not report (NaN: it poisons any arithmetic that forgets it)
MISSING_LOGPROB = float("nan")


class TrajectoryError(ValueError):
    """An illegal change to a trajectory; names the trajectory and both states."""


class TrajectoryStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    ENV = "env"
    INTERRUPTED = "interrupted"
    COMPLETED = "completed"
    FAILED = "failed"
    CONSUMED = "consumed"

    @property
    def terminal(self) -> bool:
        return self in (TrajectoryStatus.COMPLETED, TrajectoryStatus.FAILED, TrajectoryStatus.CONSUMED)


TRAJECTORY_TRANSITIONS: Mapping[TrajectoryStatus, frozenset[TrajectoryStatus]] = MappingProxyType(
    {
        TrajectoryStatus.PENDING: frozenset({TrajectoryStatus.RUNNING, TrajectoryStatus.FAILED}),
        TrajectoryStatus.RUNNING: frozenset(
            {TrajectoryStatus.ENV, TrajectoryStatus.INTERRUPTED, TrajectoryStatus.COMPLETED, TrajectoryStatus.FAILED}
        ),
        TrajectoryStatus.ENV: frozenset(
            {TrajectoryStatus.RUNNING, TrajectoryStatus.COMPLETED, TrajectoryStatus.FAILED,
             TrajectoryStatus.INTERRUPTED}
        ),
        TrajectoryStatus.INTERRUPTED: frozenset(
            {TrajectoryStatus.RUNNING, TrajectoryStatus.COMPLETED, TrajectoryStatus.FAILED}
        ),
        TrajectoryStatus.COMPLETED: frozenset({TrajectoryStatus.CONSUMED}),
        TrajectoryStatus.FAILED: frozenset(),
        TrajectoryStatus.CONSUMED: frozenset(),
    }
)


def check_trajectory_transition(traj_id: str, old: TrajectoryStatus, new: TrajectoryStatus) -> None:
    if new not in TRAJECTORY_TRANSITIONS[old]:
        raise TrajectoryError(f"trajectory {traj_id!r}: illegal transition {old.value} -> {new.value}")


@dataclass(frozen=True, slots=True)
class Segment:
    """A run of tokens in a trajectory. ``trained`` segments carry one logprob per token; a token
    whose logprob the engine did not report holds ``MISSING_LOGPROB`` (NaN, never a number that
    could be trained on): the trainer leaves such tokens out of the loss and counts them."""

    token_ids: tuple[int, ...]
    trained: bool
    logprobs: tuple[float, ...] = ()
    weight_version: int = -1
    turn: int = 0

    @property
    def missing_logprobs(self) -> int:
        """Trained tokens without a reported logprob (``MISSING_LOGPROB``)."""
        return sum(1 for x in self.logprobs if x != x) if self.trained else 0  # NaN != NaN

    def __post_init__(self) -> None:
        if self.trained and len(self.logprobs) != len(self.token_ids):
            raise TrajectoryError(
                f"response segment has {len(self.token_ids)} tokens but {len(self.logprobs)} logprobs"
            )


@dataclass(frozen=True, slots=True)
class TrajectoryRecord:
    """A finished (or interrupted) trajectory as handed to the trainer and the journal.

    ``group_id`` ties the GRPO group (same task, several samples); ``policy_version`` is the oldest
    weight version that produced any response token (used for the staleness bound).
    """

    traj_id: str
    group_id: str
    segments: tuple[Segment, ...]
    reward: float = 0.0
    status: TrajectoryStatus = TrajectoryStatus.COMPLETED
    info: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def token_ids(self) -> list[int]:
        return [t for s in self.segments for t in s.token_ids]

    @property
    def loss_mask(self) -> list[int]:
        return [1 if s.trained else 0 for s in self.segments for _ in s.token_ids]

    @property
    def rollout_logprobs(self) -> list[float]:
        """One value per token; 0.0 on untrained (prompt/observation) tokens."""
        out: list[float] = []
        for s in self.segments:
            out.extend(s.logprobs if s.trained else [0.0] * len(s.token_ids))
        return out

    @property
    def missing_logprobs(self) -> int:
        """Trained tokens without a reported logprob (see ``Segment``)."""
        return sum(s.missing_logprobs for s in self.segments)

    @property
    def response_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.segments if s.trained)

    @property
    def policy_version(self) -> int:
        versions = [s.weight_version for s in self.segments if s.trained and s.weight_version >= 0]
        return min(versions) if versions else -1
