"""Accepted elastic events are durable and one notice is one notice.

``test_accepted_events_survive_kill_9``: a real ``python -m pearl serve`` (emulated engine, real
time) accepts a grant and a reclaim notice (202), is killed with SIGKILL at once, and a service
restarted on the same ``output_dir`` replays them: the grant is known (a retry is the 200
duplicate), the notice's deadline passed while the controller was down, so its GPUs are shrunk at
once. The other tests drive the real app over ``StateControlPlane`` with a real journal file.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from pearl.admin.app import AdminApp, EventPolicy
from pearl.admin.local import StateControlPlane
from pearl.config import AdminSpec, load_config
from pearl.runtime.clock import LoopClock
from pearl.runtime.journal import Journal
from pearl.serve import Service
from tests.admin.conftest import AUTH, TOKEN, ManualClock, small_cluster
from tests.admin.test_service import Proc, free_port, spawn, write_config


async def post(c: TestClient, path: str, body: dict[str, Any], **headers: str) -> tuple[int, Any]:
    r = await c.post(path, json=body, headers={**AUTH, **headers})
    return r.status, await r.json()


def app_on(journal: Journal | None, clock: ManualClock, policy: EventPolicy | None = None,
           control: StateControlPlane | None = None) -> tuple[AdminApp, StateControlPlane]:
    wall = ManualClock(1_800_000_000.0)
    control = control or StateControlPlane(small_cluster(), clock, {}, journal=journal, wall_now=wall)
    spec = AdminSpec(port=0, max_events_per_s=1000.0, max_reads_per_s=1000.0)
    return AdminApp(control, spec, TOKEN, clock_now=clock, wall_now=wall, monotonic=clock, policy=policy), control


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_accepted_events_survive_kill_9(tmp_path: Path, procs: list[Proc]) -> None:
    cfg_path = write_config(tmp_path)
    port = free_port()
    p = await spawn(sys.executable, "-m", "pearl", "serve", "--config", str(cfg_path), "--port", str(port), env={})
    procs.append(p)
    await p.wait_line("PEARL serving")
    url = f"http://127.0.0.1:{port}"
    grant = {"gpus": [{"gpu_id": "p0", "node": "node0", "instance_id": "i-0abc"},
                      {"gpu_id": "p1", "node": "node0", "instance_id": "i-0abc"}]}
    # due in 30 s: its shrink (deadline - 5 s margin) cannot start before the kill below
    notice = {"gpu_ids": ["p0", "p1"], "deadline_in_s": 30.0, "notice_id": "n-1"}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/v1/events/gpus-granted", json=grant,
                             headers={**AUTH, "Idempotency-Key": "grant-1"}) as r:
            assert r.status == 202, await r.text()
        async with http.post(f"{url}/v1/events/reclaim-notice", json=notice,
                             headers={**AUTH, "Idempotency-Key": "notice-1"}) as r:
            assert r.status == 202, await r.text()
        killed_at = time.time()
        p.proc.send_signal(signal.SIGKILL)
    await p.proc.wait()
    journal_path = tmp_path / "run" / "journal.sqlite"
    with Journal(journal_path) as j:
        kept = {e.event_id: e for e in j.events()}
    assert set(kept) == {"grant-1", "notice-1"} and kept["notice-1"].status == "accepted"
    assert kept["notice-1"].body["deadline_wall"] <= killed_at + 30.0

    cfg = load_config(cfg_path)
    svc = Service(cfg, LoopClock(), port=0)
    await svc.start()
    try:
        assert svc.controller is not None and svc.admin is not None
        app = svc.admin.admin
        # the replayed notice is armed again (its shrink starts 5 s before the journaled deadline)
        await svc.controller.elastic.idle()
        await asyncio.gather(*[n.timer for n in svc.controller.elastic.notices.values() if n.timer is not None])
        gpus = {g["gpu_id"] for g in svc.controller.state_dict()["gpus"]}
        assert not gpus & {"p0", "p1"}
        assert svc.controller.elastic.reconfigurations["shrink"] == 1
        async with TestClient(TestServer(app.build())) as c:
            status, body = await post(c, "/v1/events/gpus-granted", grant, **{"Idempotency-Key": "grant-1"})
            assert status == 200 and body["duplicate"] is True
            status, body = await post(c, "/v1/events/reclaim-notice", {**notice, "deadline_in_s": 9.0})
            assert status == 404 and body["error"] == "not_found"  # its GPUs are gone
    finally:
        await svc.stop()
    with Journal(journal_path) as j:
        assert {e.event_id: e.status for e in j.events()} == {"grant-1": "done", "notice-1": "done"}


def test_a_notice_whose_deadline_passed_while_down_shrinks_at_once(tmp_path: Path) -> None:
    """The journal holds a preemptible GPU and an accepted notice for it due an hour ago; the
    restarted service (emulated, virtual time) starts the shrink at its start-up replay."""
    from pearl.core.state import ClusterState, Gpu, Zone
    from pearl.runtime.clock import run_virtual
    from pearl.runtime.controller import Controller
    from pearl.runtime.journal import JournaledEvent
    from tests.admin.test_emulated_resume import emulated_cfg

    cfg = emulated_cfg(tmp_path / "run")
    with Journal(tmp_path / "run" / "journal.sqlite") as j:
        st = ClusterState.build([*Controller.initial_state(cfg).gpus.values(),
                                 Gpu("p0", Zone.PREEMPTIBLE, "node0", "i-0abc")])
        j.record_state(st.to_dict())
        j.record_event(JournaledEvent("grant-1", "gpus_granted", "d1", "accepted",
                                      {"gpus": [{"gpu_id": "p0", "node": "node0", "instance_id": "i-0abc"}]}))
        j.record_event(JournaledEvent("notice-1", "reclaim_notice", "d2", "accepted",
                                      {"gpu_ids": ["p0"], "deadline_wall": time.time() - 3600, "notice_id": "n-1"},
                                      "n-1"))

    async def restart() -> tuple[list[dict[str, Any]], float, set[str], dict[str, str]]:
        clock = LoopClock()
        svc = Service(cfg, clock, port=0)
        await svc.start()
        try:
            assert svc.controller is not None
            ready = clock.now()
            await svc.controller.elastic.idle()
            await asyncio.gather(*[n.timer for n in svc.controller.elastic.notices.values() if n.timer])
            hist = [h for h in svc.controller.elastic.history if h["kind"] in ("reclaim_notice", "shrink")]
            gpus = {g["gpu_id"] for g in svc.controller.state_dict()["gpus"]}
        finally:
            await svc.stop()
        with Journal(tmp_path / "run" / "journal.sqlite") as j:
            status = {e.event_id: e.status for e in j.events()}
        return hist, ready, gpus, status

    hist, ready, gpus, status = run_virtual(restart())
    notice = next(h for h in hist if h["kind"] == "reclaim_notice")
    assert notice["notice"] == "n-1" and notice["shrink_at"] <= ready  # at once, at the start-up replay
    assert any(h["kind"] == "shrink" for h in hist) and "p0" not in gpus
    assert status == {"grant-1": "done", "notice-1": "done"}  # the grant was not applied again


async def test_a_202_is_in_the_journal_before_the_answer(tmp_path: Path) -> None:
    clock = ManualClock()
    with Journal(tmp_path / "j.sqlite") as j:
        app, _ = app_on(j, clock)
        async with TestClient(TestServer(app.build())) as c:
            status, _ = await post(c, "/v1/events/reclaim-notice", {"gpu_ids": ["p2"], "deadline_in_s": 30,
                                                                    "notice_id": "n1"})
            assert status == 202
            with Journal(tmp_path / "j.sqlite") as other:  # another connection sees it committed
                (ev,) = other.events()
            assert (ev.kind, ev.notice_id, ev.status, list(ev.body["gpu_ids"])) == ("reclaim_notice", "n1",
                                                                                    "accepted", ["p2"])
            assert ev.body["deadline_wall"] == 1_800_000_000.0 + 30


async def test_one_notice_per_notice_id() -> None:
    clock = ManualClock()
    app, control = app_on(None, clock)
    async with TestClient(TestServer(app.build())) as c:
        s1, _ = await post(c, "/v1/events/reclaim-notice", {"gpu_ids": ["p0", "p1"], "deadline_in_s": 30,
                                                            "notice_id": "n1"})
        s2, b2 = await post(c, "/v1/events/reclaim-notice", {"gpu_ids": ["p2"], "deadline_in_s": 30,
                                                            "notice_id": "n1"})
        assert (s1, s2, b2["error"]) == (202, 409, "notice_conflict")
        s3, b3 = await post(c, "/v1/events/reclaim-notice", {"gpu_ids": ["p0", "p1"], "deadline_in_s": 30,
                                                            "notice_id": "n1"})
        # the same reclaim again (a new event id): never a duplicate, the earliest deadline stays
        assert s3 == 202 and b3["duplicate"] is False and b3["gpu_ids"] == ["p0", "p1"]
        assert "earliest deadline wins" in b3["detail"]
        s4, _ = await post(c, "/v1/events/notice-cancelled", {"notice_id": "n1"})
        assert s4 == 202
        clock.t += 60
        assert {"p0", "p1", "p2"} <= {g["gpu_id"] for g in control.state_dict()["gpus"]}  # nothing shrunk


async def test_eventbridge_and_metadata_document_for_one_instance_are_one_reclaim() -> None:
    clock = ManualClock()
    app, control = app_on(None, clock)
    event = {"version": "0", "id": "eb-1", "detail-type": "EC2 Spot Instance Interruption Warning",
             "source": "aws.ec2", "account": "123456789012", "time": "2027-01-15T08:00:00Z", "region": "us-east-1",
             "resources": [], "detail": {"instance-id": "i-0abc", "instance-action": "terminate"}}
    doc = {"action": "terminate", "time": "2027-01-15T08:02:00Z"}
    async with TestClient(TestServer(app.build())) as c:
        s1, _ = await post(c, "/v1/cloud/aws/eventbridge", event)
        s2, b2 = await post(c, "/v1/cloud/aws/instance-action?instance_id=i-0abc", doc)
        assert (s1, s2) == (202, 202) and b2["duplicate"] is False and b2["gpu_ids"] == ["p0", "p1"]
        assert "earliest deadline wins" in b2["detail"]  # the same deadline: the reclaim is unchanged
        assert app.metrics.events.labels("reclaim_notice", "applied")._value.get() == 2
        clock.t += 300  # past the deadline: the instance's GPUs are reclaimed
        assert not {"p0", "p1"} & {g["gpu_id"] for g in control.state_dict()["gpus"]}
        s3, b3 = await post(c, "/v1/cloud/aws/eventbridge", event)  # EventBridge delivers at least once
        assert s3 == 200 and b3["duplicate"] is True


async def test_training_events_belong_to_an_internal_trainer() -> None:
    clock = ManualClock()
    app, _ = app_on(None, clock, EventPolicy(training_owner="the emulated trainer"))
    async with TestClient(TestServer(app.build())) as c:
        status, body = await post(c, "/v1/events/training-finished", {"step": 1, "weight_version": 1})
        assert status == 409 and body["error"] == "training_owned" and "the emulated trainer" in body["message"]


async def test_outside_training_steps_never_go_back_or_overlap() -> None:
    clock = ManualClock()
    app, _ = app_on(None, clock)
    async with TestClient(TestServer(app.build())) as c:
        assert (await post(c, "/v1/events/training-started", {"step": 3}))[0] == 202
        status, body = await post(c, "/v1/events/training-finished", {"step": 2, "weight_version": 2})
        assert status == 409 and "step 3 is running" in body["message"]  # would lend GPUs mid-step
        assert (await post(c, "/v1/events/training-finished", {"step": 3, "weight_version": 3}))[0] == 202
        status, body = await post(c, "/v1/events/training-started", {"step": 2})
        assert status == 409 and "behind" in body["message"]
        assert (await post(c, "/v1/events/training-started", {"step": 4}))[0] == 202


async def test_grants_stay_within_max_preemptible_gpus_on_known_nodes() -> None:
    clock = ManualClock()
    app, control = app_on(None, clock, EventPolicy(max_preemptible_gpus=4))  # 3 preemptible GPUs held
    async with TestClient(TestServer(app.build())) as c:
        two = {"gpus": [{"gpu_id": "q0", "node": "node1"}, {"gpu_id": "q1", "node": "node1"}]}
        status, body = await post(c, "/v1/events/gpus-granted", two)
        assert status == 409 and body["error"] == "over_capacity" and "max_preemptible_gpus=4" in body["message"]
        status, body = await post(c, "/v1/events/gpus-granted", {"gpus": [{"gpu_id": "q0", "node": "node9"}]})
        assert status == 409 and body["error"] == "unknown_node" and body["fields"][0]["field"] == "gpus.0.node"
        assert (await post(c, "/v1/events/gpus-granted", {"gpus": [{"gpu_id": "q0", "node": "node1"}]}))[0] == 202
        status, _ = await post(c, "/v1/events/gpus-granted", {"gpus": [{"gpu_id": "q1", "node": "node1"}]})
        assert status == 409
        assert sum(1 for g in control.state_dict()["gpus"] if g["zone"] == "preemptible") == 4


async def test_a_grant_whose_gpus_were_reclaimed_is_not_granted_again(tmp_path: Path) -> None:
    """The kill came after a notice's shrink removed the granted GPU and before either event was
    marked done: the replay must not re-grant a GPU the cloud has taken."""
    from pearl.runtime.door import EventDoor
    from pearl.runtime.journal import JournaledEvent

    with Journal(tmp_path / "j.sqlite") as j:
        j.record_event(JournaledEvent("grant-1", "gpus_granted", "d1", "accepted",
                                      {"gpus": [{"gpu_id": "p0", "node": "node0"}]}))
        j.record_event(JournaledEvent("notice-1", "reclaim_notice", "d2", "accepted",
                                      {"gpu_ids": ["p0"], "deadline_wall": 0.0}, "n-1"))
        j.record_event(JournaledEvent("grant-2", "gpus_granted", "d3", "accepted",
                                      {"gpus": [{"gpu_id": "p1", "node": "node0"}]}))
    applied: list[str] = []

    async def apply(ev: Any) -> Any:
        from pearl.runtime.control import SubmitResult

        applied.append(ev.event_id)
        return SubmitResult(True, event_id=ev.event_id)

    with Journal(tmp_path / "j.sqlite") as j:
        door = EventDoor(apply, lambda: ["r0"], j, lambda: 0.0, lambda: 1.0)
        await door.replay()
        assert applied == ["grant-2"]  # the notice's GPU is gone already: nothing to replay
    with Journal(tmp_path / "j.sqlite") as j:
        assert {e.event_id: e.status for e in j.events()} == {"grant-1": "done", "notice-1": "done",
                                                              "grant-2": "accepted"}
