"""A node agent process dies (``kill -9``) under a running two-rank ``pearl/main.py`` on loopback.

Real processes: two ``pearl/main.py`` ranks (gloo + node agents) with the emulated engine in real
time. Rank 1 (node1) holds a granted preemptible GPU ``p0`` and serves on it; then the test kills
rank 1 with SIGKILL, as a spot instance that vanishes without a notice would. Checked: rank 0's
agent watcher sees node1 stop answering and declares it lost (``GET /v1/nodes``), the controller
treats ``p0`` as reclaimed (it leaves the GPU table, its worker is gone), rollout continues on
node0 (trajectories keep completing) and no trajectory is lost; SIGTERM then stops rank 0 with
exit 0 although its peer is gone.

The watcher's settings are shortened for the test (1 s period, 3 misses) with a generous 10 s poll
timeout: a dead agent refuses connections at once, so it is lost after ~3 s, while a live agent
that is merely slow on a loaded machine would need 30 s of silence to be declared lost.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.admin.test_service import AUTH, Proc, free_port, get, progress_until, spawn_ranks, write_config

pytestmark = pytest.mark.slow


async def until(http: aiohttp.ClientSession, url: str, check: Callable[[Any], bool], timeout_s: float = 240.0) -> Any:
    """Poll ``url`` (another process: nothing to await) until ``check(body)`` holds."""
    t0 = time.monotonic()
    while True:
        _, body = await get(http, url)
        if check(body):
            return body
        assert time.monotonic() - t0 < timeout_s, body
        await asyncio.sleep(0.25)


@pytest.mark.timeout(900)
async def test_killed_rank1_is_lost_and_its_gpu_reclaimed_with_nothing_lost(tmp_path: Path,
                                                                             procs: list[Proc]) -> None:
    cfg_path = write_config(tmp_path, {"allow_disaggregation": False}, gpus_per_node=1, reserved_gpus=1,
                            training_gpus=0, max_preemptible_gpus=2)
    cfg = yaml.safe_load(cfg_path.read_text())
    cfg["admin"].update(agent_health_period_s=1.0, agent_health_timeout_s=10.0, agent_health_misses=3)
    cfg_path.write_text(yaml.safe_dump(cfg))
    port = free_port()
    rank0, rank1 = await spawn_ranks(cfg_path, port, procs)
    await rank0.wait_line("PEARL serving on 2 node(s)", timeout_s=600)
    url = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as http:
        grant = {"gpus": [{"gpu_id": "p0", "node": "node1", "instance_id": "i-node1"}]}
        async with http.post(f"{url}/v1/events/gpus-granted", json=grant, headers=AUTH) as r:
            assert r.status == 202, await r.text()

        def p0_serving(state: dict[str, Any]) -> bool:
            return any("p0" in w["gpus"] and w["status"] == "active" for w in state["workers"])

        await until(http, f"{url}/v1/state", p0_serving)
        nodes = await until(http, f"{url}/v1/nodes",
                            lambda b: any(n["node"] == "node1" and n["workers"] for n in b["nodes"]))
        assert all(n["alive"] for n in nodes["nodes"])
        await progress_until(http, url, "trajectories_completed", 1, timeout_s=300)

        rank1.proc.send_signal(signal.SIGKILL)  # the node vanishes: no notice, no goodbye
        await rank1.exit_code()
        nodes = await until(http, f"{url}/v1/nodes",
                            lambda b: any(n["node"] == "node1" and not n["alive"] for n in b["nodes"]), 120)
        lost = next(n for n in nodes["nodes"] if n["node"] == "node1")
        assert lost["misses"] >= 3 and lost["error"]
        assert next(n for n in nodes["nodes"] if n["node"] == "node0")["alive"]
        # p0 is treated as reclaimed: it leaves the table and no worker holds it
        state = await until(http, f"{url}/v1/state", lambda s: all(g["gpu_id"] != "p0" for g in s["gpus"]), 120)
        assert {g["gpu_id"] for g in state["gpus"]} == {"r0"}
        assert not any("p0" in w["gpus"] for w in state["workers"])
        # rollout goes on over node0 and nothing is lost
        _, before = await get(http, f"{url}/v1/progress")
        after = await progress_until(http, url, "trajectories_completed", before["trajectories_completed"] + 2,
                                     timeout_s=300)
        assert after["trajectories_lost"] == 0, after
    assert any("node node1 marked dead" in ln for ln in rank0.lines)
    rank0.proc.send_signal(signal.SIGTERM)
    assert await rank0.exit_code(timeout_s=300) == 0, "\n".join(rank0.lines[-30:])
