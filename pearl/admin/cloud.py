"""Cloud reclaim notices -> PEARL's ``ReclaimNotice`` (pure functions, no I/O).

Two real shapes are accepted:

- the AWS EventBridge event ``detail-type: "EC2 Spot Instance Interruption Warning"``
  (``id``, ``time``, ``detail.instance-id``, ``detail.instance-action``). AWS documents that the
  instance is interrupted two minutes after the warning, so the deadline is ``time + 120 s``.
  The EventBridge ``id`` is the idempotency key: EventBridge delivers at least once.
- the EC2 instance metadata document ``spot/instance-action``
  (``{"action": "terminate", "time": "2026-11-29T14:02:00Z"}``). ``time`` *is* the deadline. The
  document does not name its instance, so the poller on that instance passes ``instance_id``
  (from metadata ``instance-id``). A poller re-posts the same document every few seconds; the
  event id ``imds:<instance>:<time>`` makes those repeats one event.

Both are mapped to GPUs through the instance ids the GPUs were registered with
(``ControlPlane.instance_gpus``).

Time: cloud times are wall-clock (UTC); the controller's deadlines are on its ``Clock``. A wall
time ``t_w`` becomes ``t_c = now_c + (t_w - now_w)`` where ``now_c`` is the controller clock and
``now_w`` the wall clock read at the same moment. A deadline already in the past maps to ``now_c``
(release at once).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from pearl.admin.schemas import AwsSpotInterruptionIn, InstanceActionIn

#: AWS: "two minutes before Amazon EC2 stops or terminates your Spot Instance".
AWS_SPOT_NOTICE_S = 120.0


@dataclass(frozen=True, slots=True)
class CloudNotice:
    """A cloud reclaim notice for one instance, before mapping to GPUs."""

    instance_id: str
    deadline_wall: float  # POSIX seconds
    event_id: str
    action: str


def from_eventbridge(ev: AwsSpotInterruptionIn) -> CloudNotice:
    return CloudNotice(
        instance_id=ev.detail.instance_id,
        deadline_wall=_posix(ev.time) + AWS_SPOT_NOTICE_S,
        event_id=f"aws:{ev.id}",
        action=ev.detail.instance_action,
    )


def from_instance_action(doc: InstanceActionIn, instance_id: str) -> CloudNotice:
    t = _posix(doc.time)
    return CloudNotice(
        instance_id=instance_id,
        deadline_wall=t,
        event_id=f"imds:{instance_id}:{int(t)}",
        action=doc.action,
    )


def wall_to_clock(deadline_wall: float, now_clock: float, now_wall: float) -> float:
    """``t_c = now_c + max(0, t_w - now_w)`` (see the module docstring)."""
    return now_clock + max(0.0, deadline_wall - now_wall)


def _posix(t: datetime) -> float:
    """A time without a zone is read as UTC (AWS always sends ``Z``)."""
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return t.timestamp()
