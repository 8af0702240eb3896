"""The controller's face to the outside: what the admin API (and tests) may ask of a running PEARL.

``pearl.runtime.controller.Controller`` implements ``ControlPlane``; ``pearl.admin`` only sees this
Protocol, so the admin API can be tested against any implementation and never reaches into the
schedulers.

Every outside event enters through ``door`` (``pearl.runtime.door.EventDoor``: idempotent on the
client's ``event_id``, journaled before it is acknowledged, a reclaim named by its ``ReclaimKey``);
``submit`` is that door for an event built in this process. Unknown GPUs / instances raise ``UnknownResourceError``
(the admin API maps it to 404); an event the controller rejects against its current state raises
``ValueError`` with a message naming the field (-> 409 Conflict: the request itself was valid;
schema validation failures are answered 422 by the admin API before reaching the controller).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pearl.core.events import ElasticEvent
from pearl.runtime.outcomes import SubmitResult, UnknownResourceError

if TYPE_CHECKING:
    from pearl.runtime.door import EventDoor


@dataclass(frozen=True, slots=True)
class Progress:
    """Rollout progress for dashboards; every field is JSON-serialisable."""

    rollout_step: int = 0
    train_step: int = 0
    weight_version: int = 0
    trajectories_completed: int = 0
    trajectories_in_flight: int = 0
    trajectories_interrupted: int = 0
    trajectories_lost: int = 0
    tokens_generated: int = 0
    throughput_traj_per_h: float = 0.0
    uptime_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class ControlPlane(Protocol):
    door: EventDoor

    async def submit(self, event: ElasticEvent, source: str = "trace") -> SubmitResult:
        """An elastic event (grant / reclaim / cancel / training started / finished) through the door."""
        ...

    def instance_gpus(self, instance_id: str) -> tuple[str, ...]:
        """GPU ids registered with a cloud instance (raises UnknownResourceError)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The GPU-worker-role table (``ClusterState.to_dict()`` shape)."""
        ...

    def decision_dict(self) -> dict[str, Any] | None:
        """The current decision with every candidate's predicted makespan (None before the first)."""
        ...

    def history(self, limit: int = 100) -> list[dict[str, Any]]:
        """Recent decisions, plans and applied events, newest last."""
        ...

    def progress(self) -> Progress: ...

    def config_dict(self) -> dict[str, Any]:
        """The effective config, secrets redacted."""
        ...


__all__ = ["ControlPlane", "Progress", "SubmitResult", "UnknownResourceError"]
