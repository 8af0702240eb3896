"""The node-side cloud watch against local servers speaking each cloud's documented wire format.

Real: ``pearl.runtime.node.cloud_watch``'s sources over aiohttp against aiohttp servers on 127.0.0.1
that implement the documented interfaces (EC2 IMDSv2 with session tokens, the GCE metadata server
with ``Metadata-Flavor`` and hanging ``wait_for_change`` GETs, the Kubernetes ``/api/v1/nodes``
object with a service-account bearer token), including the cloud being unreachable, slow and
answering garbage; and the watch feeding a real emulated ``pearl serve`` ``Service``."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from pearl.runtime.node.cloud_watch import (
    AwsImds,
    CloudAnswerError,
    CloudSignal,
    CloudWatch,
    GcpMetadata,
    KubernetesNode,
)


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeImds:
    """EC2 instance metadata, IMDSv2: a PUT gives a session token every GET must carry."""

    def __init__(self) -> None:
        self.instance_action: Any = None  # None: 404 (no interruption scheduled)
        self.rebalance: Any = None
        self.tokens: set[str] = set()
        self.mode = "ok"  # ok | garbage | slow | status500
        self.puts = 0
        self.release = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_put("/latest/api/token", self._token)
        app.router.add_get("/latest/meta-data/{path:.*}", self._get)
        return app

    async def _token(self, request: web.Request) -> web.Response:
        ttl = request.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
        if ttl is None or not 1 <= int(ttl) <= 21600:
            return web.Response(status=400)
        self.puts += 1
        tok = f"tok-{self.puts}"
        self.tokens.add(tok)
        return web.Response(text=tok)

    async def _get(self, request: web.Request) -> web.Response:
        if request.headers.get("X-aws-ec2-metadata-token") not in self.tokens:
            return web.Response(status=401)
        if self.mode == "slow":
            await self.release.wait()
        if self.mode == "status500":
            return web.Response(status=500)
        path = request.match_info["path"]
        if path == "instance-id":
            return web.Response(text="i-0abc")
        doc = {"spot/instance-action": self.instance_action,
               "events/recommendations/rebalance": self.rebalance}.get(path)
        if self.mode == "garbage" and path == "spot/instance-action":
            return web.Response(text="<html>not json</html>", content_type="text/plain")
        if doc is None:
            return web.Response(status=404)
        return web.Response(text=json.dumps(doc), content_type="text/plain")


class FakeGce:
    """GCE metadata: ``Metadata-Flavor: Google`` both ways; ``wait_for_change`` hangs until a change."""

    def __init__(self) -> None:
        self.values = {"preempted": "FALSE", "maintenance-event": "NONE"}
        self.etag = {"preempted": 1, "maintenance-event": 1}
        self.changed = asyncio.Condition()
        self.garbage = False

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/computeMetadata/v1/instance/{key}", self._get)
        return app

    async def set(self, key: str, value: str) -> None:
        async with self.changed:
            self.values[key] = value
            self.etag[key] += 1
            self.changed.notify_all()

    async def _get(self, request: web.Request) -> web.Response:
        if request.headers.get("Metadata-Flavor") != "Google":
            return web.Response(status=403)
        key = request.match_info["key"]
        hdr = {"Metadata-Flavor": "Google"}
        if key == "id":
            return web.Response(text="4520031799277581759", headers=hdr)
        if request.query.get("wait_for_change") == "true":
            last = request.query.get("last_etag")
            async with self.changed:
                while last is not None and last == str(self.etag[key]):
                    await self.changed.wait()
        value = "MAYBE" if self.garbage else self.values[key]
        return web.Response(text=value, headers={**hdr, "ETag": str(self.etag[key])})


class FakeApiServer:
    """The Kubernetes API server's ``GET /api/v1/nodes/<name>`` with a bearer token."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.node: Any = {"kind": "Node", "apiVersion": "v1", "metadata": {"name": "gpu-node-1"},
                          "spec": {"providerID": "aws:///us-east-1a/i-0k8s"}}

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/v1/nodes/{name}", self._get)
        return app

    async def _get(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return web.json_response({"kind": "Status", "code": 401}, status=401)
        if request.match_info["name"] != "gpu-node-1":
            return web.json_response({"kind": "Status", "code": 404}, status=404)
        return web.json_response(self.node)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def serve(app: web.Application) -> TestServer:
    srv = TestServer(app, host="127.0.0.1")
    await srv.start_server()
    return srv


# ------------------------------------------------------------------------------------------- AWS
async def test_aws_spot_interruption_with_imdsv2_tokens(http: aiohttp.ClientSession) -> None:
    imds = FakeImds()
    srv = await serve(imds.app())
    try:
        src = AwsImds("node0", str(srv.make_url("")))
        assert await src.poll(http) == []  # 404: nothing scheduled
        deadline = time.time() + 120
        imds.instance_action = {"action": "terminate", "time": rfc3339(deadline)}
        (sig,) = await src.poll(http)
        assert (sig.source, sig.instance_id, sig.node, sig.detail) == ("aws-spot", "i-0abc", "node0", "terminate")
        assert sig.deadline_wall == int(deadline)
        imds.tokens.clear()  # the session token expired: a 401 renews it
        assert len(await src.poll(http)) == 1 and imds.puts == 2
    finally:
        await srv.close()


async def test_aws_rebalance_is_a_notice_only_when_configured(http: aiohttp.ClientSession) -> None:
    imds = FakeImds()
    srv = await serve(imds.app())
    try:
        t = time.time()
        imds.rebalance = {"noticeTime": rfc3339(t)}
        assert await AwsImds("node0", str(srv.make_url(""))).poll(http) == []
        (sig,) = await AwsImds("node0", str(srv.make_url("")), rebalance_deadline_s=90.0).poll(http)
        assert sig.source == "aws-rebalance" and sig.deadline_wall == int(t) + 90.0
    finally:
        await srv.close()


@pytest.mark.parametrize("mode", ["garbage", "slow", "status500", "unreachable"])
async def test_aws_faults_are_logged_backed_off_and_survived(http: aiohttp.ClientSession, mode: str,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    imds = FakeImds()
    srv = await serve(imds.app())
    url = str(srv.make_url(""))
    imds.mode = mode if mode != "unreachable" else "ok"
    if mode == "unreachable":
        await srv.close()
    sleeps: list[float] = []
    enough = asyncio.Event()

    async def sleep(s: float) -> None:
        sleeps.append(s)
        if len(sleeps) >= 5:
            enough.set()
            await asyncio.Event().wait()  # park the loop here: the test has seen enough
        await asyncio.sleep(0)

    reported: list[CloudSignal] = []

    async def sink(sig: CloudSignal) -> None:
        reported.append(sig)

    imds.instance_action = {"action": "terminate", "time": rfc3339(time.time() + 60)}
    src = AwsImds("node0", url, period_s=1.0, timeout_s=0.2, max_backoff_s=8.0, sleep=sleep)
    task = asyncio.ensure_future(src.run(http, sink))
    await enough.wait()
    assert not task.done()  # never raised out of its loop
    task.cancel()
    imds.release.set()
    await srv.close()
    assert sleeps == [2.0, 4.0, 8.0, 8.0, 8.0]  # doubling from period_s, capped at max_backoff_s
    assert src.errors == 5 and reported == [] and src.last_error
    assert sum("cloud watch aws" in r.getMessage() for r in caplog.records) == 5


# ------------------------------------------------------------------------------------------- GCP
async def test_gcp_preempted_waits_for_change(http: aiohttp.ClientSession) -> None:
    gce = FakeGce()
    srv = await serve(gce.app())
    try:
        src = GcpMetadata("node0", str(srv.make_url("")), notice_s=30.0, key="preempted", now=lambda: 1000.0)
        assert await src.poll(http) == []  # FALSE (first read, no etag yet)
        waiting = asyncio.ensure_future(src.poll(http))  # hangs: the value has not changed
        await asyncio.sleep(0)
        assert not waiting.done()
        await gce.set("preempted", "TRUE")
        (sig,) = await waiting
        assert (sig.source, sig.instance_id, sig.deadline_wall) == ("gcp-preempted", "4520031799277581759", 1030.0)
    finally:
        await srv.close()


async def test_gcp_maintenance_terminate_is_a_notice_migrate_is_not(http: aiohttp.ClientSession) -> None:
    gce = FakeGce()
    srv = await serve(gce.app())
    try:
        src = GcpMetadata("node0", str(srv.make_url("")), key="maintenance-event", now=lambda: 50.0)
        await gce.set("maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE")
        assert await src.poll(http) == []
        await gce.set("maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE")
        (sig,) = await src.poll(http)
        assert sig.source == "gcp-maintenance" and sig.deadline_wall == 80.0
        gce.garbage = True
        await gce.set("maintenance-event", "NONE")
        with pytest.raises(CloudAnswerError, match="unknown value"):
            await src.poll(http)
    finally:
        await srv.close()


# ------------------------------------------------------------------------------------ Kubernetes
async def test_kubernetes_node_deletion_and_drain_taints(http: aiohttp.ClientSession, tmp_path: Path) -> None:
    (tmp_path / "token").write_text("sa-token-abc\n")
    api = FakeApiServer("sa-token-abc")
    srv = await serve(api.app())
    try:
        src = KubernetesNode("node0", "gpu-node-1", str(srv.make_url("")), grace_s=30.0, sa_dir=tmp_path,
                             now=lambda: 500.0)
        assert await src.poll(http) == []
        api.node["spec"]["taints"] = [{"key": "ToBeDeletedByClusterAutoscaler", "value": "1700000000",
                                       "effect": "NoSchedule"}]
        (sig,) = await src.poll(http)
        assert (sig.source, sig.instance_id, sig.deadline_wall) == ("k8s-node", "i-0k8s", 530.0)
        api.node["spec"]["taints"] = []
        api.node["metadata"]["deletionTimestamp"] = "2027-01-15T08:00:00Z"
        (sig,) = await src.poll(http)
        assert "deletionTimestamp" in sig.detail
        api.node = ["not", "a", "node"]
        with pytest.raises(CloudAnswerError, match="not a JSON object"):
            await src.poll(http)
        (tmp_path / "token").write_text("wrong")
        with pytest.raises(CloudAnswerError, match="401"):
            await src.poll(http)
    finally:
        await srv.close()


# ------------------------------------------------------------------------------------- end to end
async def test_the_watch_feeds_the_service_and_eventbridge_is_the_same_notice(tmp_path: Path) -> None:
    """A Spot interruption in the (fake) instance metadata shrinks the service's GPUs of that
    instance; the EventBridge warning for the same instance arriving later is the 200 duplicate."""
    from pearl.config import RunConfig, load_config
    from pearl.runtime.clock import LoopClock
    from pearl.serve import Service

    imds = FakeImds()
    srv = await serve(imds.app())
    d = load_config(str(Path(__file__).resolve().parents[2] / "configs/emulated-demo.yaml")).model_dump()
    d["admin"].update(tensorboard=False, port=0)
    d["output_dir"] = str(tmp_path / "run")
    d["cloud_watch"] = {"aws": True, "aws_url": str(srv.make_url("")), "period_s": 0.2, "timeout_s": 2.0}
    svc = Service(RunConfig.model_validate(d), LoopClock(), port=0)
    await svc.start()
    try:
        assert svc.admin is not None and svc.controller is not None and svc.cloud_watch is not None
        app = svc.admin.admin
        from aiohttp.test_utils import TestClient

        async with TestClient(TestServer(app.build())) as c:
            grant = {"gpus": [{"gpu_id": "p0", "node": "node0", "instance_id": "i-0abc"}]}
            assert (await c.post("/v1/events/gpus-granted", json=grant)).status == 202
            await svc.controller.elastic.idle()
            assert "p0" in {g["gpu_id"] for g in svc.controller.state_dict()["gpus"]}
            seen = asyncio.Event()
            sink = svc.cloud_watch.sink

            async def watched(sig: CloudSignal) -> None:
                await sink(sig)
                seen.set()

            svc.cloud_watch.sink = watched
            imds.instance_action = {"action": "terminate", "time": rfc3339(time.time())}  # due now
            await seen.wait()
            await svc.controller.elastic.idle()
            await asyncio.gather(*[n.timer for n in svc.controller.elastic.notices.values() if n.timer])
            assert "p0" not in {g["gpu_id"] for g in svc.controller.state_dict()["gpus"]}
            assert svc.controller.elastic.reconfigurations["shrink"] == 1
            event = {"version": "0", "id": "eb-9", "detail-type": "EC2 Spot Instance Interruption Warning",
                     "source": "aws.ec2", "time": rfc3339(time.time()), "detail": {"instance-id": "i-0abc",
                                                                                   "instance-action": "terminate"}}
            r = await c.post("/v1/cloud/aws/eventbridge", json=event)
            assert r.status == 200 and (await r.json())["duplicate"] is True
            assert svc.controller.elastic.reconfigurations["shrink"] == 1
    finally:
        await svc.stop()
        await srv.close()


async def test_a_refused_signal_is_logged_and_retried_on_the_next_sighting(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[CloudSignal] = []

    async def sink(sig: CloudSignal) -> None:
        calls.append(sig)
        if len(calls) == 1:
            raise RuntimeError("controller unreachable")

    watch = CloudWatch([], sink)
    sig = CloudSignal("aws-spot", "i-1", "node0", 100.0)
    await watch._report(sig)
    await watch._report(sig)
    await watch._report(sig)
    assert len(calls) == 2 and watch.sink_errors == 1 and list(watch.reported) == [sig.key]
    assert "not delivered: controller unreachable" in caplog.text


async def test_a_node_agents_signal_reaches_rank_0_once(http: aiohttp.ClientSession) -> None:
    """Multi-node: the agent's cloud watch lists its signal in ``/agent/v1/health``; rank 0's
    ``AgentWatcher`` relays it once (a failed relay is retried at the next poll)."""
    from pearl.config import load_config
    from pearl.engines.emulated import EmulatedEngine
    from pearl.runtime.clock import LoopClock
    from pearl.runtime.node.agent import AgentClient, NodeAgent
    from pearl.runtime.node.watch import AgentWatcher

    imds = FakeImds()
    imds.instance_action = {"action": "stop", "time": rfc3339(time.time() + 100)}
    srv = await serve(imds.app())
    seen = asyncio.Event()

    async def keep(_sig: CloudSignal) -> None:
        seen.set()

    base = load_config("qwen3-8b-h200")
    clock = LoopClock()
    watch = CloudWatch([AwsImds("node1", str(srv.make_url("")), period_s=0.05)], keep)
    agent = NodeAgent("node1", 1, EmulatedEngine(base.model, base.hardware, clock, base.emulator), "agent-token-0123456789",
                      cloud_watch=watch)
    await agent.start()
    try:
        await seen.wait()
        client = AgentClient(agent.url, "agent-token-0123456789", http)
        relayed: list[tuple[str, Any]] = []

        async def on_cloud(node: str, sig: Any) -> None:
            relayed.append((node, sig))
            if len(relayed) == 1:
                raise RuntimeError("admin gate busy")

        w = AgentWatcher({"node1": client.health}, clock, on_dead=print, on_cloud=on_cloud)
        for _ in range(3):
            await w.poll_once()
        assert len(relayed) == 2  # failed once, relayed at the next poll, then never again
        node, sig = relayed[-1]
        assert node == "node1" and (sig["source"], sig["instance_id"]) == ("aws-spot", "i-0abc")
    finally:
        await agent.close()
        await srv.close()
