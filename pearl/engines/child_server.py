"""Inference servers as child processes: ``ChildServer``, the life cycle every HTTP engine's
servers share (vLLM's ``VllmServer``, SGLang's ``SglangServer``).

Life cycle::

    srv = <ChildServer subclass>(spec=..., log_dir=..., ...)
    await srv.start()               # spawn in its own process group, poll ``health_path`` until 200;
                                    # raises EngineStartError (exit code + log tail) on exit/timeout
    ... srv.died (an asyncio.Event set by the watcher task when the process exits) ...
    await srv.stop()                # SIGTERM the group, SIGKILL after a grace period; idempotent

A subclass gives ``command()`` (its server's command line) and ``env()``. The server is started
with ``start_new_session=True`` so that it and its children (vLLM's engine core and workers,
SGLang's scheduler and detokenizer) form one process group: when the server dies (e.g. SIGKILL)
the watcher kills the rest of the group so no orphan keeps a core busy. The group is signalled by
the id recorded at spawn (``pgid``, the leader's pid): once the leader has exited and been reaped
its pid names nothing, but the group lives on as long as one member does (vLLM's engine core and
workers, which ignore SIGTERM, SGLang's scheduler). After the leader exits the watcher waits until
the group has no live member (``group_members``: zombies waiting for a parent that never reaps
them do not count), sending SIGKILL after ``ORPHAN_GRACE_S`` (a stop) or at once (a crash), and
only then ends the reaper. stdout/stderr go to a log file under the run directory; errors quote
its tail. Each server is spawned with
``PR_SET_PDEATHSIG=SIGTERM``, and beside it runs a reaper (``pearl.reaper``, in its own session):
if the owning process dies without ``stop()`` (a ``kill -9``), the reaper kills the server's group
(SIGTERM, then SIGKILL after ``reaper_grace_s``). The death signal alone is not enough: a vLLM
server still starting up does not exit on it, and its engine core outlives even a SIGKILL of the
API server.

``race_death(srv, coro, what)`` awaits a request unless the server dies first (then
``EngineDeadError``); ``lower_priority`` renices a ready server's process group.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from pearl.engines.base import EngineDeadError, EngineError, EngineStartError, ServerSpec
from pearl.procutil import die_with_parent, free_port

HEALTH_POLL_S = 0.5  # readiness poll period; each poll also races the process-exit event
STOP_GRACE_S = 10.0
ORPHAN_GRACE_S = 2.0  # once a stopped server's leader has exited, its group's rest gets this before SIGKILL
GROUP_EXIT_S = 5.0  # after SIGKILL, how long the watcher waits for the group's members to go
GROUP_POLL_S = 0.05
DEATH_GRACE_S = 5.0  # after a dropped connection, how long to wait for the process exit to be seen
REAPER_EXIT_S = 5.0  # a reaper polls every second and exits once its server's group is gone


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group ``pgid``, read from ``/proc``; where there
    is no ``/proc``, ``[pgid]`` while ``killpg(pgid, 0)`` finds the group, else ``[]``."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [pgid]
    members: list[int] = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # ``pid (comm) state ppid pgrp ...``: comm may hold spaces and parentheses, so split after
        # its last ``)``
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) >= 3 and fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def lower_priority(pid: int, nice: int) -> None:
    """Give a running server (the process group and session ``pid`` leads: the API server, its
    engine core and workers) the CPU niceness ``nice``.

    Applied once the server is *ready*: a starting server (an expansion in preparation) keeps full
    priority, so a trainer busy on the same cores does not stretch its start-up. Both knobs are set
    because with Linux autogroup scheduling (``sched_autogroup_enabled=1``, the default on most
    kernels) CPU is shared between *sessions* first and a task's nice only ranks it inside its own
    session, and every server leads a new session (``start_new_session``). Not fatal where the
    platform lacks either knob."""
    if nice <= 0:
        return
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PGRP, pid, nice)
    with contextlib.suppress(OSError), open(f"/proc/{pid}/autogroup", "w") as f:
        f.write(str(nice))

@dataclass(kw_only=True)
class ChildServer(ABC):
    """Mutable handle of one inference server child process (owned by an engine). Subclasses give
    ``command()`` and ``env()``; this class spawns, polls readiness, watches and stops."""

    spec: ServerSpec
    log_dir: Path
    start_timeout_s: float = 300.0
    nice: int = 0
    port: int = 0
    log_path: Path = field(default=Path())
    proc: asyncio.subprocess.Process | None = None
    pgid: int = 0  # the server's process group (its leader's pid, recorded at spawn)
    died: asyncio.Event = field(default_factory=asyncio.Event)
    exit_code: int | None = None
    stopping: bool = False
    ready_s: float = float("nan")
    weight_version: int = 0
    inflight: int = 0
    _watcher: asyncio.Task[None] | None = None
    _reaper: asyncio.subprocess.Process | None = None  # ``pearl.reaper`` for this server's group
    _term_deadline: float = 0.0  # when a stop's SIGTERM grace ends (``time.monotonic``)
    kind = "server"
    health_path = "/health"
    health_timeout_s = 5.0  # one readiness poll's client timeout
    reaper_grace_s = STOP_GRACE_S  # the reaper's SIGTERM -> SIGKILL wait

    @property
    def url(self) -> str:
        return f"http://{self.spec.host}:{self.port}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and not self.died.is_set()

    @abstractmethod
    def command(self) -> list[str]:
        """The server's command line (each engine's server class gives its own)."""

    def env(self) -> dict[str, str]:
        return dict(os.environ)

    def allocate_ports(self) -> None:
        self.port = self.spec.port or free_port(self.spec.host)

    def log_tail(self, n: int = 25) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    async def start(self) -> None:
        """Spawn and wait until ``GET /health`` answers 200, or raise ``EngineStartError``."""
        self.allocate_ports()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.log_dir / f"{self.spec.worker_id}-{int(time.time() * 1000)}.log"
        self.died = asyncio.Event()
        self.exit_code = None
        self.stopping = False
        t0 = time.monotonic()
        with self.log_path.open("wb") as log:
            log.write((" ".join(self.command()) + "\n").encode())
            log.flush()
            self.proc = await asyncio.create_subprocess_exec(
                *self.command(), stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=asyncio.subprocess.STDOUT,
                env=self.env(), start_new_session=True, preexec_fn=die_with_parent)
        self.pgid = self.proc.pid  # ``start_new_session``: the leader's pid is its group's id
        # a vLLM server starting up ignores the death signal: a reaper kills its group if we die
        self._reaper = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "pearl.reaper", "--owner", str(os.getpid()), "--pgid", str(self.proc.pid),
            "--grace", str(self.reaper_grace_s),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True)
        self._watcher = asyncio.create_task(self._watch(), name=f"watch-{self.spec.worker_id}")
        try:
            await asyncio.wait_for(self._wait_ready(), timeout=self.start_timeout_s)
        except TimeoutError:
            await self.stop()
            raise EngineStartError(self.spec.worker_id,
                                   f"{self.kind} not ready after {self.start_timeout_s:.0f} s "
                                   f"(log {self.log_path}); raise engine.start_timeout_s or check CPU load",
                                   exit_code=self.exit_code, log_tail=self.log_tail()) from None
        except BaseException:
            await self.stop()
            raise
        self.ready_s = time.monotonic() - t0
        lower_priority(self.proc.pid, self.nice)

    async def _wait_ready(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.health_timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            while True:
                if self.died.is_set():
                    raise EngineStartError(self.spec.worker_id,
                                           f"{self.kind} exited during start-up (log {self.log_path})",
                                           exit_code=self.exit_code, log_tail=self.log_tail())
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with http.get(f"{self.url}{self.health_path}") as r:
                        if r.status == 200:
                            return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.died.wait(), timeout=HEALTH_POLL_S)

    async def _watch(self) -> None:
        assert self.proc is not None
        self.exit_code = await self.proc.wait()
        self.died.set()
        await self._empty_group()
        await self._end_reaper()

    async def _empty_group(self) -> None:
        """The leader has exited: what is left of its group (engine core, workers, scheduler) goes
        too. A stop already sent SIGTERM, so the rest gets ``ORPHAN_GRACE_S`` (at most what is left
        of ``STOP_GRACE_S``) before SIGKILL; a leader that died on its own leaves orphans, which get
        SIGKILL at once. Returns
        once no live member is left, or ``GROUP_EXIT_S`` after the SIGKILL."""
        if not self._signalable():
            return
        if self.stopping:
            await self._wait_group_empty(min(self._term_deadline - time.monotonic(), ORPHAN_GRACE_S))
        if group_members(self.pgid):
            self._kill_group(signal.SIGKILL)
            await self._wait_group_empty(GROUP_EXIT_S)

    async def _wait_group_empty(self, timeout_s: float) -> bool:
        end = time.monotonic() + max(timeout_s, 0.0)
        while group_members(self.pgid):
            if time.monotonic() >= end:
                return False
            await asyncio.sleep(GROUP_POLL_S)
        return True

    async def _end_reaper(self) -> None:
        """The reaper exits on its own once the group is gone (within its 1 s poll); wait for it
        (no zombie, no unclosed transport), or kill it if it has not."""
        reaper, self._reaper = self._reaper, None
        if reaper is None:
            return
        try:
            await asyncio.wait_for(reaper.wait(), timeout=REAPER_EXIT_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                reaper.kill()
            await reaper.wait()

    def _signalable(self) -> bool:
        """A group id we may signal: recorded, > 1 (``killpg`` of 0 or 1 would hit our own group
        or init) and not our own group."""
        return self.pgid > 1 and self.pgid != os.getpgrp()

    def _kill_group(self, sig: int) -> None:
        """Signal the server's process group by its recorded id (it was started with
        ``start_new_session``), whether or not its leader still lives."""
        if not self._signalable():
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, sig)

    async def stop(self) -> None:
        """SIGTERM the process group, SIGKILL after ``STOP_GRACE_S``; returns once the group has no
        live member (or ``GROUP_EXIT_S`` after the SIGKILL) and the reaper has ended; idempotent."""
        if self.proc is None:
            return
        if not self.stopping:
            self._term_deadline = time.monotonic() + STOP_GRACE_S
        self.stopping = True
        if not self.died.is_set():
            self._kill_group(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.died.wait(), timeout=STOP_GRACE_S)
            except TimeoutError:
                self._kill_group(signal.SIGKILL)
                await self.died.wait()
        if self._watcher is not None:
            await self._watcher
            self._watcher = None

async def race_death(srv: ChildServer, coro: Any, what: str) -> Any:
    """Await ``coro`` unless ``srv`` dies first: then cancel it and raise ``EngineDeadError`` (exit
    code + log tail). Connection errors while the server is alive become ``EngineError``."""
    task = asyncio.ensure_future(coro)
    death = asyncio.ensure_future(srv.died.wait())
    try:
        await asyncio.wait({task, death}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        death.cancel()
        if not task.done():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await death
    if task.done() and not task.cancelled():
        try:
            return task.result()
        except (aiohttp.ClientError, TimeoutError) as exc:
            # a dropped connection usually means the process is exiting: give the watcher a moment
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(srv.died.wait(), timeout=DEATH_GRACE_S)
            if not srv.alive:
                raise dead_error(srv, what) from exc
            raise EngineError(srv.spec.worker_id, f"{what} failed: {exc!r}") from exc
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    raise dead_error(srv, what)


def dead_error(srv: ChildServer, what: str) -> EngineDeadError:
    return EngineDeadError(srv.spec.worker_id, f"{srv.kind} died during {what}", exit_code=srv.exit_code,
                           log_tail=srv.log_tail())
