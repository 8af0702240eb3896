"""The admin API's side of the one door: every cloud notice for a live grant tightens the reclaim
(the earliest deadline wins, never a duplicate), a re-granted instance is reclaimed again, client
notice ids and instance ids never collide, a cancelled notice can be sent again, and a broken body
or a path-like id is a 4xx naming what was wrong (the real app over ``StateControlPlane``, time on
manual clocks)."""

from __future__ import annotations

import gzip
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from pearl.admin.app import AdminApp
from pearl.admin.local import StateControlPlane
from pearl.config import AdminSpec
from tests.admin.conftest import AUTH, TOKEN, ManualClock

WALL0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def eventbridge(eid: str, instance: str = "i-0abc", time: str = "2027-01-15T08:00:00Z") -> dict[str, Any]:
    return {"version": "0", "id": eid, "detail-type": "EC2 Spot Instance Interruption Warning",
            "source": "aws.ec2", "account": "123456789012", "time": time, "region": "us-east-1",
            "resources": [], "detail": {"instance-id": instance, "instance-action": "terminate"}}


async def post(c: TestClient, path: str, body: dict[str, Any], **headers: str) -> tuple[int, Any]:
    r = await c.post(path, json=body, headers={**AUTH, **headers})
    return r.status, await r.json()


def gpus(control: StateControlPlane) -> set[str]:
    return {g["gpu_id"] for g in control.state_dict()["gpus"]}


def app(control: StateControlPlane, clock: ManualClock, wall: ManualClock, spec: AdminSpec) -> AdminApp:
    return AdminApp(control, spec, TOKEN, clock_now=clock, wall_now=wall, monotonic=clock)


async def test_every_cloud_notice_for_an_instance_tightens_its_deadline(
        control: StateControlPlane, clock: ManualClock, wall: ManualClock, spec: AdminSpec) -> None:
    """Instance action 3,000 s out, then the EventBridge warning (120 s), then an instance action 5 s
    out: each is applied (202), and the GPUs are gone 5 s after the start."""
    a = app(control, clock, wall, spec)
    async with TestClient(TestServer(a.build())) as c:
        s1, _ = await post(c, "/v1/cloud/aws/instance-action?instance_id=i-0abc",
                           {"action": "terminate", "time": "2027-01-15T08:50:00Z"})
        s2, b2 = await post(c, "/v1/cloud/aws/eventbridge", eventbridge("eb-1"))
        s3, b3 = await post(c, "/v1/cloud/aws/instance-action?instance_id=i-0abc",
                            {"action": "terminate", "time": "2027-01-15T08:00:05Z"})
        assert (s1, s2, s3) == (202, 202, 202)
        assert not b2["duplicate"] and not b3["duplicate"] and b3["gpu_ids"] == ["p0", "p1"]
        clock.t += 5.0
        wall.t += 5.0
        assert not {"p0", "p1"} & gpus(control)
        s4, b4 = await post(c, "/v1/cloud/aws/eventbridge", eventbridge("eb-1"))  # redelivered: one event id
        assert s4 == 200 and b4["duplicate"] is True


async def test_a_watchers_later_spot_action_tightens_a_rebalance_recommendation(
        control: StateControlPlane, clock: ManualClock, wall: ManualClock, spec: AdminSpec) -> None:
    a = app(control, clock, wall, spec)
    first = await a.cloud_signal("i-0abc", "node1", WALL0 + 600.0, "aws-rebalance")
    second = await a.cloud_signal("i-0abc", "node1", WALL0 + 30.0, "aws-spot")
    assert first["applied"] and second["applied"] and not second["duplicate"]
    clock.t += 30.0
    assert not {"p0", "p1"} & gpus(control)


async def test_an_instance_granted_again_is_reclaimed_again(
        control: StateControlPlane, clock: ManualClock, wall: ManualClock, spec: AdminSpec) -> None:
    a = app(control, clock, wall, spec)
    async with TestClient(TestServer(a.build())) as c:
        assert (await post(c, "/v1/cloud/aws/eventbridge", eventbridge("eb-1")))[0] == 202
        clock.t += 120.0
        wall.t += 120.0
        assert not {"p0", "p1"} & gpus(control)
        regrant = {"gpus": [{"gpu_id": "p0", "node": "node2", "instance_id": "i-0abc"},
                            {"gpu_id": "p1", "node": "node2", "instance_id": "i-0abc"}]}
        assert (await post(c, "/v1/events/gpus-granted", regrant))[0] == 202
        s, b = await post(c, "/v1/cloud/aws/eventbridge", eventbridge("eb-2", time="2027-01-15T08:02:00Z"))
        assert s == 202 and not b["duplicate"]
        clock.t += 120.0
        wall.t += 120.0
        assert not {"p0", "p1"} & gpus(control)


async def test_an_operator_notice_id_never_collides_with_an_instance_id(
        control: StateControlPlane, clock: ManualClock, wall: ManualClock, spec: AdminSpec) -> None:
    a = app(control, clock, wall, spec)
    async with TestClient(TestServer(a.build())) as c:
        s1, _ = await post(c, "/v1/events/reclaim-notice",
                           {"gpu_ids": ["p2"], "deadline_in_s": 600, "notice_id": "i-0abc"})
        s2, b2 = await post(c, "/v1/cloud/aws/eventbridge", eventbridge("eb-1"))
        assert (s1, s2) == (202, 202) and b2["gpu_ids"] == ["p0", "p1"]


async def test_a_cancelled_notice_sent_again_is_armed_again(
        control: StateControlPlane, clock: ManualClock, wall: ManualClock, spec: AdminSpec) -> None:
    a = app(control, clock, wall, spec)
    notice = {"gpu_ids": ["p2"], "deadline_in_s": 60, "notice_id": "n1"}
    async with TestClient(TestServer(a.build())) as c:
        assert (await post(c, "/v1/events/reclaim-notice", notice, **{"Idempotency-Key": "e1"}))[0] == 202
        assert (await post(c, "/v1/events/notice-cancelled", {"notice_id": "n1"}))[0] == 202
        s, b = await post(c, "/v1/events/reclaim-notice", notice, **{"Idempotency-Key": "e2"})
        assert s == 202 and not b["duplicate"]
        clock.t += 60.0
        assert "p2" not in gpus(control)


async def test_a_corrupt_gzip_body_is_a_400(
        control: StateControlPlane, clock: ManualClock, wall: ManualClock, spec: AdminSpec) -> None:
    a = app(control, clock, wall, spec)
    good = gzip.compress(b'{"gpu_ids": ["p2"], "deadline_in_s": 60}')
    async with TestClient(TestServer(a.build())) as c:
        r = await c.post("/v1/events/reclaim-notice", data=good[:12] + b"\x00garbage" + good[12:],
                         headers={**AUTH, "Content-Type": "application/json", "Content-Encoding": "gzip"})
        body = await r.json()
        assert r.status == 400 and body["error"] == "bad_encoding" and "gzip" in body["message"]
        r = await c.post("/v1/events/reclaim-notice", data=good,
                         headers={**AUTH, "Content-Type": "application/json", "Content-Encoding": "gzip"})
        assert r.status == 202


async def test_path_like_ids_are_refused_at_the_door(
        control: StateControlPlane, clock: ManualClock, wall: ManualClock, spec: AdminSpec) -> None:
    a = app(control, clock, wall, spec)
    async with TestClient(TestServer(a.build())) as c:
        for gpu, node in (("../..", "node1"), ("q0", "../../etc"), ("a/b", "node1"), ("..", "node1")):
            s, b = await post(c, "/v1/events/gpus-granted", {"gpus": [{"gpu_id": gpu, "node": node}]})
            assert s == 422 and b["error"] == "validation", (gpu, node, b)
        s, b = await post(c, "/v1/events/gpus-granted", {"gpus": [{"gpu_id": "q0", "node": "node1"}]},
                          **{"Idempotency-Key": "x/../y"})
        assert s == 422 and b["fields"][0]["field"] == "Idempotency-Key"
        s, _ = await post(c, "/v1/events/gpus-granted", {"gpus": [{"gpu_id": "q0.1", "node": "node1"}]},
                          **{"Idempotency-Key": "aws:eb-1.v2"})
        assert s == 202


async def test_a_deadline_survives_a_restart_across_a_wall_clock_step(tmp_path: Any, spec: AdminSpec) -> None:
    """The journal keeps the deadline as absolute UTC and as the clock's own reading with the clock's
    epoch: a service restarted on the same boot (same monotonic clock) keeps the deadline even
    when the wall clock stepped an hour meanwhile."""
    from pearl.runtime.journal import Journal
    from tests.admin.conftest import small_cluster

    clock, wall = ManualClock(1000.0), ManualClock(WALL0)
    with Journal(tmp_path / "j.sqlite") as j:
        control = StateControlPlane(small_cluster(), clock, {}, journal=j, wall_now=wall, clock_epoch="boot:A")
        async with TestClient(TestServer(app(control, clock, wall, spec).build())) as c:
            s, _ = await post(c, "/v1/events/reclaim-notice", {"gpu_ids": ["p2"], "deadline_in_s": 600})
            assert s == 202
    clock.t += 10.0
    wall.t += 3600.0 + 10.0  # the wall clock was stepped while the service was down
    with Journal(tmp_path / "j.sqlite") as j:
        again = StateControlPlane(small_cluster(), clock, {}, journal=j, wall_now=wall, clock_epoch="boot:A")
        assert (await again.door.replay())["replayed"] == 1
        clock.t = 1599.0
        assert "p2" in gpus(again)
        clock.t = 1600.0
        assert "p2" not in gpus(again)
