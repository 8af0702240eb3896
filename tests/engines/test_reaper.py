"""A server outlives no owner: after a ``kill -9`` of the process that launched it, the reaper
(``pearl.reaper``) kills the server's whole process group - here a server that ignores SIGTERM
(as a vLLM server still starting up does) with a child of its own (as vLLM's engine core)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pearl.reaper import group_alive, main

ROOT = Path(__file__).resolve().parents[2]

# a server that ignores SIGTERM, starts a grandchild in its group and answers GET /health
SERVER = textwrap.dedent('''
    import http.server, signal, subprocess, sys
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen(["sleep", "600"])
    print("child", child.pid, flush=True)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
        def log_message(self, *a): pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
''')

# the owner: launches that server through ChildServer, prints its pid, then waits to be killed
OWNER = textwrap.dedent('''
    import asyncio, sys
    from pathlib import Path
    from pearl.engines.base import Role, ServerSpec
    from pearl.engines.child_server import ChildServer

    class Fake(ChildServer):
        kind = "fake server"
        reaper_grace_s = 1.0
        def command(self):
            return [sys.executable, sys.argv[2], str(self.port)]

    async def run():
        srv = Fake(spec=ServerSpec("w0", ("0",), Role.COLOCATED, "none"), log_dir=Path(sys.argv[1]),
                   start_timeout_s=60)
        await srv.start()
        print("server", srv.proc.pid, flush=True)
        await asyncio.sleep(600)
    asyncio.run(run())
''')


def _wait_gone(pgid: int, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if not group_alive(pgid):
            return True
        time.sleep(0.2)
    return False


def test_kill_9_of_the_owner_takes_the_server_group_with_it(tmp_path: Path) -> None:
    (tmp_path / "server.py").write_text(SERVER)
    (tmp_path / "owner.py").write_text(OWNER)
    owner = subprocess.Popen([sys.executable, str(tmp_path / "owner.py"), str(tmp_path / "logs"),
                              str(tmp_path / "server.py")], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        line = owner.stdout.readline()
        assert line.startswith("server "), line
        pgid = int(line.split()[1])
        assert group_alive(pgid)
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
        # SIGTERM is ignored by the server, so the group goes at SIGKILL after the 1 s grace
        assert _wait_gone(pgid, 15), f"server group {pgid} outlived its owner"
        log = next((tmp_path / "logs").glob("w0-*.log")).read_text()
        grandchild = int(next(ln for ln in log.splitlines() if ln.startswith("child")).split()[1])
        with pytest.raises(ProcessLookupError):
            os.kill(grandchild, 0)
    finally:
        owner.kill()
        owner.wait()
        if owner.stdout is not None:
            owner.stdout.close()


def test_reaper_exits_quietly_when_the_group_is_gone_first() -> None:
    srv = subprocess.Popen(["sleep", "600"], start_new_session=True)
    reaper = subprocess.Popen([sys.executable, "-m", "pearl.reaper", "--owner", str(os.getpid()),
                               "--pgid", str(srv.pid), "--poll", "0.1"], cwd=ROOT, start_new_session=True)
    try:
        time.sleep(0.5)
        assert reaper.poll() is None  # owner (us) alive, group alive: it waits
        srv.kill()
        srv.wait()
        assert reaper.wait(timeout=10) == 0
    finally:
        srv.kill()
        reaper.kill()
        srv.wait()
        reaper.wait()


def test_reaper_needs_its_arguments() -> None:
    with pytest.raises(SystemExit):
        main([])


async def test_a_normal_stop_ends_the_reaper_too(tmp_path: Path) -> None:
    from pearl.engines.base import Role, ServerSpec
    from pearl.engines.child_server import ChildServer

    # this one exits on SIGTERM, as a server that has finished starting does
    (tmp_path / "server.py").write_text(SERVER.replace("signal.signal(signal.SIGTERM, signal.SIG_IGN)", ""))

    class Fake(ChildServer):
        kind = "fake server"
        reaper_grace_s = 1.0

        def command(self) -> list[str]:
            return [sys.executable, str(tmp_path / "server.py"), str(self.port)]

    srv = Fake(spec=ServerSpec("w0", ("0",), Role.COLOCATED, "none"), log_dir=tmp_path / "logs", start_timeout_s=60)
    await srv.start()
    reaper = srv._reaper
    assert reaper is not None and reaper.returncode is None
    await srv.stop()
    assert srv._reaper is None and reaper.returncode == 0
    assert not group_alive(srv.proc.pid)  # type: ignore[union-attr]
    await asyncio.sleep(0)


# a server whose engine child ignores SIGTERM (as vLLM's engine core does) and survives its API process
ENGINE_TREE = textwrap.dedent('''
    import http.server, subprocess, sys
    child = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
    print("child", child.pid, flush=True)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
        def log_message(self, *a): pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
''')


async def _tree_server(tmp_path: Path) -> tuple[object, int]:
    from pearl.engines.base import Role, ServerSpec
    from pearl.engines.child_server import ChildServer

    (tmp_path / "server.py").write_text(ENGINE_TREE)

    class Tree(ChildServer):
        kind = "fake server"
        reaper_grace_s = 1.0

        def command(self) -> list[str]:
            return [sys.executable, str(tmp_path / "server.py"), str(self.port)]

    srv = Tree(spec=ServerSpec("w0", ("0",), Role.COLOCATED, "none"), log_dir=tmp_path / "logs", start_timeout_s=60)
    await srv.start()
    child = int(next(ln for ln in srv.log_tail().splitlines() if ln.startswith("child")).split()[1])
    return srv, child


def _group(pgid: int) -> list[int]:
    """The live members of process group ``pgid`` (read from ``/proc``, zombies left out)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if fields[0] != "Z" and int(fields[2]) == pgid:
                out.append(int(stat.parent.name))
    return out


def _live(pid: int) -> bool:
    """``pid`` runs (a zombie nobody reaps counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


async def test_a_server_whose_api_process_dies_first_leaves_no_process_behind(tmp_path: Path) -> None:
    from pearl.engines.child_server import ChildServer

    srv, child = await _tree_server(tmp_path)
    assert isinstance(srv, ChildServer) and srv.proc is not None
    pgid = srv.proc.pid
    assert _live(child) and set(_group(pgid)) == {pgid, child}
    reaper = srv._reaper
    os.kill(pgid, signal.SIGKILL)  # the API process dies on its own; its engine child does not
    await srv.died.wait()
    await srv.stop()
    try:
        assert not _live(child), "the engine child outlived its server"
        assert _group(pgid) == []
        assert srv._reaper is None and reaper is not None and reaper.returncode is not None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


async def test_a_stop_ends_an_engine_child_that_ignores_sigterm(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from pearl.engines import child_server
    from pearl.engines.child_server import ChildServer

    monkeypatch.setattr(child_server, "STOP_GRACE_S", 1.0)

    srv, child = await _tree_server(tmp_path)
    assert isinstance(srv, ChildServer) and srv.proc is not None
    pgid = srv.proc.pid
    try:
        await srv.stop()  # the API process exits on SIGTERM; the child needs the SIGKILL after the grace
        assert not _live(child), "the engine child outlived a stop"
        assert _group(pgid) == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
