"""A server handle never signals init, a group <= 1 or our own process group.

``ChildServer._kill_group`` (what ``stop()`` sends SIGTERM / SIGKILL through) is given handles whose
pid is 0, 1, or a process of our own group: the real ``os.killpg`` must not be reached (here it is
replaced by a recorder, since reaching it would signal this test's own group). A real child in its
own session is then killed through the same call with the real ``os.killpg``."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pearl.core.state import Role
from pearl.engines.base import ServerSpec
from pearl.engines.child_server import ChildServer


@dataclass(kw_only=True)
class SleepServer(ChildServer):
    def command(self) -> list[str]:
        return [sys.executable, "-c", "import time; time.sleep(600)"]


@dataclass
class Handle:
    pid: int


def server(pid: int, pgid: int) -> SleepServer:
    """A handle as ``start`` leaves it: the process and the group id recorded at spawn."""
    srv = SleepServer(spec=ServerSpec("w0", ("0",), Role.COLOCATED, "x"), log_dir=Path("."))
    srv.proc = Handle(pid)  # type: ignore[assignment]
    srv.pgid = pgid
    return srv


@pytest.mark.parametrize("pid", ["zero", "one", "own_group"])
def test_never_signals_init_or_our_own_group(pid: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "killpg", lambda p, s: calls.append((p, s)))
    value, group = {"zero": (0, 0), "one": (1, 1), "own_group": (os.getpid(), os.getpgrp())}[pid]
    server(value, group)._kill_group(signal.SIGTERM)
    assert calls == []


async def test_a_child_in_its_own_session_is_signalled() -> None:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", "import time; time.sleep(600)",
                                                start_new_session=True)
    srv: Any = server(proc.pid, proc.pid)  # a new session's leader: its pid is its group's id
    srv.proc = proc
    srv._kill_group(signal.SIGKILL)
    assert await proc.wait() == -signal.SIGKILL
