"""The real admin app in-process: every signal, every read, every error path."""

from __future__ import annotations

import json
import logging

import pytest
from aiohttp.test_utils import TestClient

from pearl.admin.local import StateControlPlane
from tests.admin.conftest import AUTH, TOKEN, ManualClock


async def post(client: TestClient, path: str, body: object, **headers: str):
    resp = await client.post(path, json=body, headers={**AUTH, **headers})
    return resp.status, await resp.json()


# ------------------------------------------------------------------------------ signals in
async def test_grant_adds_preemptible_gpus(client: TestClient, control: StateControlPlane) -> None:
    status, body = await post(client, "/v1/events/gpus-granted",
                              {"gpus": [{"gpu_id": "p9", "node": "node2", "instance_id": "i-09"}]})
    assert status == 202
    assert body["applied"] is True and body["kind"] == "gpus_granted" and body["gpu_ids"] == ["p9"]
    assert body["event_id"].startswith("api:")
    gpu = control.state.gpu("p9")
    assert (gpu.zone.value, gpu.node, gpu.instance_id) == ("preemptible", "node2", "i-09")
    assert control.instance_gpus("i-09") == ("p9",)


async def test_reclaim_by_gpu_ids_relative_deadline(
    client: TestClient, control: StateControlPlane, clock: ManualClock
) -> None:
    status, body = await post(client, "/v1/events/reclaim-notice",
                              {"gpu_ids": ["p2"], "deadline_in_s": 30, "notice_id": "n1"})
    assert status == 202 and body["gpu_ids"] == ["p2"]
    assert "p2" in control.state.gpus  # not before the deadline
    clock.t += 30.0
    state = await (await client.get("/v1/state", headers=AUTH)).json()
    assert "p2" not in {g["gpu_id"] for g in state["gpus"]}
    assert "w-p2" not in {w["worker_id"] for w in state["workers"]}


async def test_reclaim_by_instance_absolute_deadline_maps_wall_to_clock(
    client: TestClient, control: StateControlPlane, clock: ManualClock, wall: ManualClock
) -> None:
    # wall 1_800_000_000 = 2027-01-15T08:00:00Z; deadline 90 s later on the wall -> clock + 90
    status, body = await post(client, "/v1/events/reclaim-notice",
                              {"instance_id": "i-0abc", "deadline": "2027-01-15T08:01:30Z"})
    assert status == 202 and sorted(body["gpu_ids"]) == ["p0", "p1"]
    clock.t += 89.9
    control.state_dict()
    assert "p0" in control.state.gpus
    clock.t += 0.1
    control.state_dict()
    assert "p0" not in control.state.gpus and "p1" not in control.state.gpus


async def test_notice_cancelled_keeps_gpus(client: TestClient, control: StateControlPlane, clock: ManualClock) -> None:
    await post(client, "/v1/events/reclaim-notice", {"gpu_ids": ["p2"], "deadline_in_s": 10, "notice_id": "n7"})
    status, body = await post(client, "/v1/events/notice-cancelled", {"notice_id": "n7"})
    assert status == 202 and body["kind"] == "notice_cancelled"
    clock.t += 60
    assert "p2" in control.state.gpus and "p2" in {g["gpu_id"] for g in control.state_dict()["gpus"]}


async def test_training_finished_then_started_lends_and_returns(client: TestClient, control: StateControlPlane) -> None:
    status, _ = await post(client, "/v1/events/training-finished", {"step": 3, "weight_version": 3,
                                                                   "expected_idle_s": 40.5})
    assert status == 202
    assert control.state.gpu("o0").lent and control.state.worker("w-o0").status.value == "active"
    status, _ = await post(client, "/v1/events/training-started", {"step": 4})
    assert status == 202
    assert not control.state.gpu("o0").lent and control.state.worker("w-o0").status.value == "inactive"


async def test_aws_eventbridge_spot_warning(client: TestClient, control: StateControlPlane,
                                            clock: ManualClock) -> None:
    event = {
        "version": "0",
        "id": "1e5527d7-bb36-4607-3370-4164db56a40e",
        "detail-type": "EC2 Spot Instance Interruption Warning",
        "source": "aws.ec2",
        "account": "123456789012",
        "time": "2027-01-15T08:00:00Z",  # = the wall clock now: deadline 120 s away
        "region": "us-east-2",
        "resources": ["arn:aws:ec2:us-east-2a:instance/i-0abc"],
        "detail": {"instance-id": "i-0abc", "instance-action": "terminate"},
    }
    status, body = await post(client, "/v1/cloud/aws/eventbridge", event)
    assert status == 202 and sorted(body["gpu_ids"]) == ["p0", "p1"]
    assert body["event_id"] == "aws:1e5527d7-bb36-4607-3370-4164db56a40e"
    # EventBridge delivers at least once: the repeat is applied once
    status, body = await post(client, "/v1/cloud/aws/eventbridge", event)
    assert status == 200 and body["duplicate"] is True and body["applied"] is False
    clock.t += 119.0
    control.state_dict()
    assert "p0" in control.state.gpus
    clock.t += 1.0
    control.state_dict()
    assert "p0" not in control.state.gpus and "p2" in control.state.gpus


async def test_instance_metadata_document_polled_twice_applies_once(client: TestClient,
                                                                   control: StateControlPlane) -> None:
    doc = {"action": "terminate", "time": "2027-01-15T08:02:00Z"}
    s1, b1 = await post(client, "/v1/cloud/aws/instance-action?instance_id=i-0def", doc)
    s2, b2 = await post(client, "/v1/cloud/aws/instance-action?instance_id=i-0def", doc)
    assert (s1, s2) == (202, 200)
    assert b1["gpu_ids"] == ["p2"] and b1["event_id"] == b2["event_id"]
    assert sum(1 for h in control.history(1000) if h.get("kind") == "reclaim_notice") == 1


async def test_duplicate_by_idempotency_header_and_by_body_event_id(client: TestClient,
                                                                    control: StateControlPlane) -> None:
    body = {"step": 1, "weight_version": 1}
    s1, _ = await post(client, "/v1/events/training-finished", body, **{"Idempotency-Key": "k-1"})
    s2, b2 = await post(client, "/v1/events/training-finished", body, **{"Idempotency-Key": "k-1"})
    s3, b3 = await post(client, "/v1/events/training-finished", {**body, "event_id": "k-1"})
    assert (s1, s2, s3) == (202, 200, 200) and b2["duplicate"] and b3["duplicate"]
    assert control.events_applied == 1


async def test_idempotency_key_reused_with_other_payload_is_409(client: TestClient) -> None:
    s1, _ = await post(client, "/v1/events/training-started", {"step": 1}, **{"Idempotency-Key": "k-2"})
    s2, b2 = await post(client, "/v1/events/training-started", {"step": 2}, **{"Idempotency-Key": "k-2"})
    assert (s1, s2) == (202, 409) and b2["error"] == "idempotency_conflict"


async def test_header_and_body_event_id_must_agree(client: TestClient) -> None:
    status, body = await post(client, "/v1/events/training-started", {"step": 1, "event_id": "a"},
                              **{"Idempotency-Key": "b"})
    assert status == 409 and body["fields"][0]["field"] == "event_id"


# ------------------------------------------------------------------------------ errors
@pytest.mark.parametrize(
    ("path", "body", "field", "reason_part"),
    [
        ("/v1/events/gpus-granted", {"gpus": []}, "gpus", "at least 1"),
        ("/v1/events/gpus-granted", {"gpus": [{"gpu_id": "bad id!"}]}, "gpus.0.gpu_id", "pattern"),
        ("/v1/events/gpus-granted", {"gpus": [{"gpu_id": "x"}, {"gpu_id": "x"}]}, "gpus", "listed twice"),
        ("/v1/events/gpus-granted", {"gpus": [{"gpu_id": "x", "zone": "reserved"}]}, "gpus.0.zone", "Extra"),
        ("/v1/events/reclaim-notice", {"gpu_ids": ["p0"]}, "body", "deadline_in_s"),
        ("/v1/events/reclaim-notice", {"gpu_ids": ["p0"], "instance_id": "i-0abc", "deadline_in_s": 1}, "body",
         "exactly one of gpu_ids"),
        ("/v1/events/reclaim-notice", {"gpu_ids": ["p0"], "deadline_in_s": -1}, "deadline_in_s", "greater"),
        ("/v1/events/reclaim-notice", {"gpu_ids": ["p0"], "deadline": "2027-01-15T08:00:00"}, "deadline", "time zone"),
        ("/v1/events/training-finished", {"step": 1}, "weight_version", "required"),
        ("/v1/events/training-finished", {"step": "x", "weight_version": 1}, "step", "JSON number"),
        ("/v1/events/notice-cancelled", [], "body", "dictionary"),
        ("/v1/cloud/aws/eventbridge", {"id": "e1", "detail-type": "EC2 Instance Rebalance Recommendation",
                                       "time": "2027-01-15T08:00:00Z",
                                       "detail": {"instance-id": "i-0abc", "instance-action": "terminate"}},
         "detail-type", "EC2 Spot Instance Interruption Warning"),
    ],
)
async def test_validation_errors_name_field_and_reason(client: TestClient, control: StateControlPlane, path: str,
                                                       body: object, field: str, reason_part: str) -> None:
    before = control.state.to_dict()
    status, out = await post(client, path, body)
    assert status == 422, out
    assert out["error"] == "validation"
    fields = {f["field"]: f["reason"] for f in out["fields"]}
    assert field in fields, fields
    assert reason_part in fields[field]
    assert control.state.to_dict() == before and control.events_applied == 0


async def test_nan_is_rejected(client: TestClient) -> None:
    resp = await client.post("/v1/events/training-finished", data='{"step": 1, "weight_version": 1, '
                             '"expected_idle_s": NaN}', headers={**AUTH, "Content-Type": "application/json"})
    assert resp.status == 400 and (await resp.json())["fields"][0]["field"] == "body"


@pytest.mark.parametrize("raw", ["{", "not json", "[" * 5000 + "]" * 5000, "\x00"])
async def test_malformed_json_is_400(client: TestClient, raw: str) -> None:
    resp = await client.post("/v1/events/gpus-granted", data=raw,
                             headers={**AUTH, "Content-Type": "application/json"})
    body = await resp.json()
    assert resp.status == 400 and body["error"] == "bad_json"


async def test_wrong_content_type_is_415(client: TestClient) -> None:
    resp = await client.post("/v1/events/training-started", data='{"step": 1}',
                             headers={**AUTH, "Content-Type": "multipart/form-data; boundary=x"})
    assert resp.status == 415


async def test_curl_default_content_type_is_read_as_json(client: TestClient) -> None:
    resp = await client.post("/v1/events/training-started", data='{"step": 1}',
                             headers={**AUTH, "Content-Type": "application/x-www-form-urlencoded"})
    assert resp.status == 202


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/events/reclaim-notice", {"gpu_ids": ["nope"], "deadline_in_s": 5}, "GPU"),
        ("/v1/events/reclaim-notice", {"instance_id": "i-unknown", "deadline_in_s": 5}, "instance_id"),
        ("/v1/events/notice-cancelled", {"notice_id": "never-issued"}, "notice"),
        ("/v1/cloud/aws/instance-action?instance_id=i-unknown", {"action": "stop", "time": "2027-01-15T08:02:00Z"},
         "instance_id"),
    ],
)
async def test_unknown_resource_is_404(client: TestClient, control: StateControlPlane, path: str, body: object,
                                       field: str) -> None:
    status, out = await post(client, path, body)
    assert status == 404 and out["error"] == "not_found" and out["fields"][0]["field"] == field
    assert control.events_applied == 0


async def test_rejected_event_id_may_be_retried(client: TestClient, control: StateControlPlane) -> None:
    s1, _ = await post(client, "/v1/events/reclaim-notice", {"gpu_ids": ["nope"], "deadline_in_s": 5,
                                                              "event_id": "e-retry"})
    s2, _ = await post(client, "/v1/events/reclaim-notice", {"gpu_ids": ["p2"], "deadline_in_s": 5,
                                                              "event_id": "e-retry"})
    assert (s1, s2) == (404, 202)


async def test_controller_rejection_is_409(client: TestClient) -> None:
    status, out = await post(client, "/v1/events/gpus-granted", {"gpus": [{"gpu_id": "r0"}]})
    assert status == 409 and out["fields"] == [{"field": "gpus[0].gpu_id",
                                                "reason": "GPU 'r0' is already in the cluster"}]


async def test_instance_action_needs_instance_id(client: TestClient) -> None:
    status, out = await post(client, "/v1/cloud/aws/instance-action", {"action": "terminate",
                                                                      "time": "2027-01-15T08:02:00Z"})
    assert status == 422 and out["fields"][0]["field"] == "instance_id"


async def test_body_over_limit_is_413(client: TestClient, spec) -> None:
    big = {"gpus": [{"gpu_id": f"g{i:06d}", "node": "n" * 100} for i in range(1000)]}
    assert len(json.dumps(big)) > spec.max_body_bytes
    status, out = await post(client, "/v1/events/gpus-granted", big)
    assert status == 413 and out["error"] == "body_too_large"


async def test_chunked_body_over_limit_is_413(client: TestClient, spec) -> None:
    async def chunks():
        for _ in range(spec.max_body_bytes // 1024 + 2):
            yield b" " * 1024

    resp = await client.post("/v1/events/training-started", data=chunks(),
                             headers={**AUTH, "Content-Type": "application/json"})
    assert resp.status == 413


async def test_rate_limit_is_429_with_retry_after(control: StateControlPlane, clock: ManualClock) -> None:
    from aiohttp.test_utils import TestServer

    from pearl.admin.app import AdminApp
    from pearl.config import AdminSpec

    app = AdminApp(control, AdminSpec(max_events_per_s=2.0), TOKEN, clock_now=clock, monotonic=clock).build()
    async with TestClient(TestServer(app)) as c:
        codes = [(await c.post("/v1/events/training-started", json={"step": i}, headers=AUTH)).status
                 for i in range(3)]
        assert codes == [202, 202, 429]
        resp = await c.post("/v1/events/training-started", json={"step": 9}, headers=AUTH)
        assert resp.status == 429 and resp.headers["Retry-After"] == "1"
        assert (await c.get("/v1/state", headers=AUTH)).status == 200  # reads have their own bucket
        clock.t += 0.5
        assert (await c.post("/v1/events/training-started", json={"step": 10}, headers=AUTH)).status == 202


async def test_unknown_route_and_method_are_json(client: TestClient) -> None:
    resp = await client.get("/v1/nope", headers=AUTH)
    assert resp.status == 404 and (await resp.json())["error"] == "not_found"
    resp = await client.delete("/v1/state", headers=AUTH)
    assert resp.status == 405 and (await resp.json())["error"] == "method_not_allowed"


async def test_controller_crash_is_500_and_app_keeps_serving(client: TestClient, control: StateControlPlane,
                                                             monkeypatch, caplog) -> None:
    def boom() -> dict:
        raise RuntimeError("table broke")

    monkeypatch.setattr(control, "state_dict", boom)
    with caplog.at_level(logging.ERROR, "pearl.admin"):
        resp = await client.get("/v1/state", headers=AUTH)
    assert resp.status == 500 and (await resp.json())["error"] == "internal"
    assert "table broke" in caplog.text
    assert (await client.get("/v1/progress", headers=AUTH)).status == 200


async def test_slow_controller_is_503(control: StateControlPlane, clock: ManualClock) -> None:
    import asyncio

    from aiohttp.test_utils import TestServer

    from pearl.admin.app import AdminApp
    from pearl.config import AdminSpec

    never = asyncio.Event()

    async def stuck(event):
        await never.wait()

    from pearl.runtime.door import EventDoor

    control.door = EventDoor(stuck, lambda: [], None, clock, clock)  # a scheduler that never answers
    app = AdminApp(control, AdminSpec(submit_timeout_s=0.01), TOKEN, clock_now=clock).build()
    async with TestClient(TestServer(app)) as c:
        resp = await c.post("/v1/events/training-started", json={"step": 1}, headers=AUTH)
        assert resp.status == 503 and resp.headers["Retry-After"] == "1"


# ------------------------------------------------------------------------------ reads
async def test_reads(client: TestClient, control: StateControlPlane) -> None:
    state = await (await client.get("/v1/state", headers=AUTH)).json()
    assert state == control.state.to_dict()
    assert await (await client.get("/v1/decision", headers=AUTH)).json() == {"decision": None}
    await post(client, "/v1/events/training-started", {"step": 1})
    hist = await (await client.get("/v1/history?limit=5", headers=AUTH)).json()
    assert [e["kind"] for e in hist["entries"]] == ["training_started"]
    prog = await (await client.get("/v1/progress", headers=AUTH)).json()
    assert prog["extra"] == {"events_applied": 1} and prog["uptime_s"] == 0.0
    cfg = await (await client.get("/v1/config", headers=AUTH)).json()
    assert cfg["admin"]["token"] == "***" and TOKEN not in json.dumps(cfg)
    doc = await (await client.get("/v1/openapi.json", headers=AUTH)).json()
    assert doc["openapi"].startswith("3.1") and "/v1/events/reclaim-notice" in doc["paths"]


@pytest.mark.parametrize("limit", ["0", "1001", "x", "-3"])
async def test_history_limit_is_checked(client: TestClient, limit: str) -> None:
    resp = await client.get(f"/v1/history?limit={limit}", headers=AUTH)
    assert resp.status == 400 and (await resp.json())["fields"][0]["field"] == "limit"


async def test_metrics(client: TestClient) -> None:
    await post(client, "/v1/events/training-started", {"step": 1})
    await post(client, "/v1/events/reclaim-notice", {"gpu_ids": ["zz"], "deadline_in_s": 1})
    resp = await client.get("/metrics", headers=AUTH)
    text = await resp.text()
    assert resp.status == 200 and resp.content_type == "text/plain"
    assert 'pearl_gpus{zone="preemptible"} 3.0' in text
    assert 'pearl_workers{role="decode",status="active"} 3.0' in text
    assert 'pearl_admin_events_total{kind="training_started",result="applied"} 1.0' in text
    assert 'pearl_admin_events_total{kind="reclaim_notice",result="rejected"} 1.0' in text
    assert 'pearl_admin_requests_total{method="POST",route="/v1/events/reclaim-notice",status="404"} 1.0' in text


async def test_healthz_needs_no_token(client: TestClient) -> None:
    resp = await client.get("/healthz")
    assert resp.status == 200 and await resp.json() == {"status": "ok"}
