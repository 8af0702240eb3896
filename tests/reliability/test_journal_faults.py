"""The journal never stalls the event loop and never fails silently.

A full disk is SQLite's own: the journal's file is capped (``Journal.set_max_pages``, SQLite's
``max_page_count``) below what the run needs, so every write fails with "database or disk is
full", and freed again later. A frozen disk is a second connection holding the database's
exclusive lock. Both against the real journal file, the real admin app and (for the disk-full run)
the real emulated service in virtual time."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from pearl.admin.app import AdminApp
from pearl.admin.local import StateControlPlane
from pearl.config import AdminSpec
from pearl.runtime.clock import LoopClock, run_virtual
from pearl.runtime.journal import Journal
from pearl.serve import Service
from tests.admin.conftest import AUTH, TOKEN, ManualClock, small_cluster
from tests.admin.test_emulated_resume import emulated_cfg


def test_a_full_disk_is_named_and_the_run_resumes_when_it_has_room(tmp_path: Path) -> None:
    cfg = emulated_cfg(tmp_path / "run")

    async def main() -> dict[str, Any]:
        clock = LoopClock()
        svc = Service(cfg, clock, port=0)
        await svc.start()
        out: dict[str, Any] = {}
        try:
            assert svc.journal is not None and svc.controller is not None and svc.admin is not None
            j, ctl = svc.journal, svc.controller
            await clock.sleep(120.0)
            j.set_max_pages(j.page_count())  # the disk is full from here on
            before = ctl.progress().trajectories_completed
            for _ in range(200):  # until a write failed (virtual time moves on meanwhile)
                if j.fault is not None:
                    break
                await clock.sleep(30.0)
            await clock.sleep(600.0)
            out["fault"] = j.fault
            out["progress_journal"] = ctl.progress().extra["journal"]
            out["completed_while_full"] = ctl.progress().trajectories_completed - before
            async with TestClient(TestServer(svc.admin.admin.build())) as c:
                r = await c.get("/healthz")
                out["health"] = (r.status, await r.json())
                r = await c.post("/v1/events/gpus-granted", json={"gpus": [{"gpu_id": "p0", "node": "node0"}]},
                                 headers={**AUTH, "Idempotency-Key": "g-1"} if svc.admin.token else {})
                out["grant"] = (r.status, await r.json())
                j.set_max_pages(None)  # room again: the queued writes land, in order
                await j.flush()
                r = await c.get("/healthz")
                out["health_after"] = await r.json()
            await clock.sleep(600.0)  # the run goes on after the disk came back
            await j.flush()
            out["journaled"] = len(j.completed_ids())
            out["completed"] = ctl.progress().trajectories_completed
            out["lost"] = ctl.progress().trajectories_lost
            out["trained"] = ctl.progress().train_step
        finally:
            await svc.stop()
        return out

    out = run_virtual(main())
    assert out["fault"] is not None and out["fault"].startswith("disk full:") and "journal.sqlite" in out["fault"]
    assert out["progress_journal"] == out["fault"]
    assert out["health"] == (200, {"status": "degraded", "journal": out["fault"]})
    assert out["grant"][0] == 503 and out["grant"][1]["error"] == "journal_unavailable"
    assert "disk full" in out["grant"][1]["message"]
    assert out["completed_while_full"] > 0  # the rollout went on
    assert out["health_after"] == {"status": "ok"}
    assert out["journaled"] == out["completed"]  # every trajectory completed meanwhile is on disk now
    assert out["lost"] == 0 and out["trained"] >= 2


async def test_a_frozen_disk_never_blocks_the_event_loop(tmp_path: Path) -> None:
    """While another process holds the journal's lock (the disk does not answer), ``/healthz``
    answers at once and the event waits; once the lock is gone the event is accepted."""
    clock, wall = ManualClock(), ManualClock(1_800_000_000.0)
    path = tmp_path / "j.sqlite"
    journal = Journal(path, busy_timeout_s=0.2)
    control = StateControlPlane(small_cluster(), clock, {}, journal=journal, wall_now=wall)
    app = AdminApp(control, AdminSpec(port=0, max_events_per_s=1000.0, max_reads_per_s=1000.0,
                                      submit_timeout_s=60.0), TOKEN, clock_now=clock, wall_now=wall, monotonic=clock)
    other = sqlite3.connect(str(path), isolation_level=None)
    try:
        async with TestClient(TestServer(app.build())) as c:
            other.execute("BEGIN EXCLUSIVE")
            post = asyncio.ensure_future(c.post("/v1/events/reclaim-notice", headers=AUTH,
                                                json={"gpu_ids": ["p2"], "deadline_in_s": 60, "notice_id": "n1"}))
            for _ in range(100):  # until the journal's writer has hit the lock
                if journal.fault is not None:
                    break
                await asyncio.sleep(0.05)
            r = await c.get("/healthz")
            health = await r.json()
            waiting = not post.done()
            other.execute("COMMIT")
            resp = await post
            assert resp.status == 202, await resp.text()
            r = await c.get("/healthz")
            after = await r.json()
    finally:
        other.close()
        journal.close()
    assert waiting
    assert health["status"] == "degraded" and health["journal"].startswith("database locked:")
    assert after == {"status": "ok"}
    with Journal(path) as j:
        assert [e.event_id for e in j.events()] != []
