"""Rate limiter, idempotency ledger and cloud-notice parsing (pure parts of the admin API)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from pearl.access import IdempotencyLedger, RateLimiter
from pearl.admin import cloud
from pearl.admin.schemas import AwsSpotInterruptionIn, InstanceActionIn
from tests.admin.conftest import ManualClock


def test_token_bucket_formula() -> None:
    t = ManualClock(0.0)
    rl = RateLimiter(4.0, t)  # capacity 4, 4 tokens/s
    assert [rl.take("a") for _ in range(4)] == [0.0] * 4
    assert rl.take("a") == pytest.approx(0.25)  # needs 1 token at 4/s
    assert rl.take("b") == 0.0  # other clients have their own bucket
    t.t = 0.5  # +2 tokens
    assert rl.take("a") == 0.0 and rl.take("a") == 0.0
    assert rl.take("a") > 0
    assert RateLimiter.retry_after(0.25) == "1" and RateLimiter.retry_after(2.2) == "3"


def test_rate_limiter_tracks_bounded_clients() -> None:
    rl = RateLimiter(1.0, ManualClock(0.0), max_clients=3)
    for i in range(10):
        rl.take(f"c{i}")
    assert len(rl._buckets) == 3


def test_ledger_conflict_and_forget() -> None:
    led = IdempotencyLedger(max_entries=2)
    d1, d2 = led.digest("/a", b"1"), led.digest("/a", b"2")
    assert not led.conflicts("k", d1)
    assert not led.conflicts("k", d1)
    assert led.conflicts("k", d2)
    led.forget("k")
    assert not led.conflicts("k", d2)
    led.conflicts("x", d1)
    led.conflicts("y", d1)
    assert not led.conflicts("k", d1)  # evicted: bounded memory


def test_eventbridge_deadline_is_two_minutes_after_time() -> None:
    ev = AwsSpotInterruptionIn.model_validate({
        "id": "abc", "detail-type": "EC2 Spot Instance Interruption Warning", "source": "aws.ec2",
        "time": "2027-01-15T08:00:00Z", "detail": {"instance-id": "i-1", "instance-action": "stop"},
        "region": "us-east-2",
    })
    n = cloud.from_eventbridge(ev)
    assert n == cloud.CloudNotice("i-1", datetime(2027, 1, 15, 8, 2, tzinfo=UTC).timestamp(), "aws:abc", "stop")


def test_instance_action_time_is_the_deadline() -> None:
    doc = InstanceActionIn.model_validate({"action": "terminate", "time": "2027-01-15T08:02:00Z"})
    n = cloud.from_instance_action(doc, "i-2")
    assert n.deadline_wall == datetime(2027, 1, 15, 8, 2, tzinfo=UTC).timestamp()
    assert n.event_id == f"imds:i-2:{int(n.deadline_wall)}"


def test_wall_to_clock() -> None:
    assert cloud.wall_to_clock(1000.0, now_clock=5.0, now_wall=990.0) == 15.0
    assert cloud.wall_to_clock(900.0, now_clock=5.0, now_wall=990.0) == 5.0  # past: at once
