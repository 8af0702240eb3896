"""The service as processes: ``python -m pearl serve`` over a real socket, two ``pearl/main.py``
ranks on loopback (gloo + node agents), and clean shutdown on SIGTERM (exit 0, report written).

The processes run the real controller with the emulated engine in real time; the tests read their
log for readiness and poll the admin API for rollout progress (another process: nothing to await).

Timeouts are upper bounds sized for a loaded machine, not expectations: on the 2-core development
host at a load average of 25-45 (nice 19) a ``pearl/main.py`` process printed nothing for over 120 s
(imports alone), which is how ``test_two_ranks_on_loopback_then_sigterm_rank0`` once failed with a
120 s start-up bound while passing alone in 9 s. Quiet, these tests take seconds."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.admin.conftest import TOKEN

ROOT = Path(__file__).resolve().parents[2]
AUTH = {"Authorization": f"Bearer {TOKEN}"}
pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_config(tmp: Path, policy: dict[str, Any] | None = None, **cluster: int) -> Path:
    cfg = yaml.safe_load((ROOT / "configs/emulated-demo.yaml").read_text())
    cfg["cluster"].update(cluster)
    cfg.setdefault("policy", {}).update(policy or {})
    cfg["admin"]["tensorboard"] = False
    cfg["output_dir"] = str(tmp / "run")
    path = tmp / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


class Proc:
    """A child process whose stderr is read line by line (kept in ``lines``)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self._seen = asyncio.Condition()
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        assert self.proc.stderr is not None
        async for raw in self.proc.stderr:
            async with self._seen:
                self.lines.append(raw.decode(errors="replace").rstrip())
                self._seen.notify_all()

    async def wait_line(self, needle: str, timeout_s: float = 600.0) -> str:
        async def find() -> str:
            async with self._seen:
                while True:
                    for ln in self.lines:
                        if needle in ln:
                            return ln
                    if self._reader.done():
                        raise AssertionError(f"process exited before {needle!r}:\n" + "\n".join(self.lines[-30:]))
                    await self._seen.wait()

        try:
            return await asyncio.wait_for(find(), timeout_s)
        except TimeoutError:
            raise AssertionError(f"no {needle!r} within {timeout_s:.0f} s; the process's last lines:\n"
                                 + "\n".join(self.lines[-40:])) from None

    async def exit_code(self, timeout_s: float = 300.0) -> int:
        try:
            rc = await asyncio.wait_for(self.proc.wait(), timeout_s)
        except TimeoutError:
            raise AssertionError(f"still running {timeout_s:.0f} s after the signal; the process's last lines:\n"
                                 + "\n".join(self.lines[-60:])) from None
        await self._reader
        return rc

    async def kill(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


async def spawn(*args: str, env: dict[str, str]) -> Proc:
    full_env = {**os.environ, "PEARL_ADMIN_TOKEN": TOKEN, **env}
    proc = await asyncio.create_subprocess_exec(*args, cwd=ROOT, env=full_env, stdout=asyncio.subprocess.DEVNULL,
                                                stderr=asyncio.subprocess.PIPE)
    return Proc(proc)


async def spawn_ranks(cfg: Path, port: int, procs: list[Proc], world: int = 2) -> list[Proc]:
    """Start ``world`` ranks of ``pearl/main.py`` on loopback (rank 0 serves the admin API on
    ``port``); each is appended to ``procs`` as it starts, so the caller's cleanup stops them all."""
    env = {"WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    for rank in range(world):
        procs.append(await spawn(sys.executable, "pearl/main.py", "--config", str(cfg), "--port", str(port),
                                 env={**env, "RANK": str(rank), "LOCAL_RANK": "0"}))
    return procs[-world:]


async def get(http: aiohttp.ClientSession, url: str, **kw: Any) -> tuple[int, Any]:
    async with http.get(url, headers=kw.get("headers", AUTH)) as r:
        return r.status, await r.json()


async def progress_until(http: aiohttp.ClientSession, url: str, key: str, at_least: int, timeout_s: float = 300.0):
    t0 = time.monotonic()
    while True:
        _, p = await get(http, f"{url}/v1/progress")
        if p[key] >= at_least:
            return p
        assert time.monotonic() - t0 < timeout_s, p
        await asyncio.sleep(0.25)


@pytest.mark.timeout(1800)
async def test_serve_over_a_socket_then_sigterm(tmp_path: Path, procs: list[Proc]) -> None:
    cfg = write_config(tmp_path)
    port = free_port()
    p = await spawn(sys.executable, "-m", "pearl", "serve", "--config", str(cfg), "--port", str(port), env={})
    procs.append(p)
    await p.wait_line("PEARL serving")
    url = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as http:
        assert (await get(http, f"{url}/v1/state", headers={}))[0] == 401
        status, state = await get(http, f"{url}/v1/state")
        assert status == 200 and {g["gpu_id"] for g in state["gpus"]} == {"r0", "r1", "t0", "t1"}
        status, dec = await get(http, f"{url}/v1/decision")
        assert dec["decision"]["candidates"] and all("predicted_makespan_s" in c for c in dec["decision"]["candidates"])
        grant = {"gpus": [{"gpu_id": "p0", "node": "node0", "instance_id": "i-0abc"}]}
        async with http.post(f"{url}/v1/events/gpus-granted", json=grant, headers=AUTH) as r:
            assert r.status == 202
        doc = {"action": "terminate", "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 60))}
        async with http.post(f"{url}/v1/cloud/aws/instance-action?instance_id=i-0abc", json=doc, headers=AUTH) as r:
            body = await r.json()
            assert r.status == 202 and body["gpu_ids"] == ["p0"]
        async with http.post(f"{url}/v1/cloud/aws/instance-action?instance_id=i-nope", json=doc, headers=AUTH) as r:
            assert r.status == 404
        await progress_until(http, url, "tokens_generated", 1)
    p.proc.send_signal(signal.SIGTERM)
    assert await p.exit_code() == 0, "\n".join(p.lines[-30:])
    assert any("dispatch stopped" in ln for ln in p.lines)
    assert (tmp_path / "run" / "report.md").is_file()
    assert not any(TOKEN in ln for ln in p.lines)
    # the work of in-flight trajectories is in the journal (partial outputs), and a restart resumes it
    from pearl.runtime.journal import Journal

    with Journal(tmp_path / "run" / "journal.sqlite") as j:
        kept = j.counts()
    assert kept["in_flight"] > 0 and kept["partial_tokens"] > 0, kept
    p2 = await spawn(sys.executable, "-m", "pearl", "serve", "--config", str(cfg), "--port", str(port), env={})
    procs.append(p2)
    await p2.wait_line("resuming from journal")
    await p2.wait_line("PEARL serving")
    p2.proc.send_signal(signal.SIGINT)
    assert await p2.exit_code() == 0, "\n".join(p2.lines[-30:])


@pytest.mark.timeout(1200)
async def test_two_ranks_on_loopback_then_sigterm_rank0(tmp_path: Path, procs: list[Proc]) -> None:
    # two reserved GPUs, one per node: r0 on node0 (rank 0), r1 on node1 (rank 1); colocated, since a
    # prefill -> decode pair across nodes needs an engine with a network KV transport (see node_agent)
    cfg = write_config(tmp_path, {"allow_disaggregation": False}, gpus_per_node=1, reserved_gpus=2,
                       training_gpus=0)
    # A starved agent may take seconds to answer /health; with the 5 s default poll timeout the watcher
    # could count misses (and, after 3, declare node1 lost) on a loaded machine. This test is about
    # the two ranks and their shutdown, not the watcher's timing (test_agent_watch / test_node_loss).
    data = yaml.safe_load(cfg.read_text())
    data["admin"]["agent_health_timeout_s"] = 60.0
    cfg.write_text(yaml.safe_dump(data))
    port = free_port()
    rank0, rank1 = await spawn_ranks(cfg, port, procs)
    await rank0.wait_line("PEARL serving on 2 node(s)")
    url = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as http:
        _, nodes = await get(http, f"{url}/v1/nodes")
        by_node = {n["node"]: n for n in nodes["nodes"]}
        assert set(by_node) == {"node0", "node1"} and all(n["healthy"] for n in by_node.values())
        assert by_node["node1"]["rank"] == 1 and len(by_node["node1"]["workers"]) == 1
        _, state = await get(http, f"{url}/v1/state")
        assert {g["gpu_id"]: g["node"] for g in state["gpus"]} == {"r0": "node0", "r1": "node1"}
        await progress_until(http, url, "tokens_generated", 1)
    rank0.proc.send_signal(signal.SIGTERM)
    assert await rank0.exit_code() == 0, "\n".join(rank0.lines[-30:])
    assert await rank1.exit_code() == 0, "\n".join(rank1.lines[-30:])
    assert any("controller asked" in ln for ln in rank1.lines)
