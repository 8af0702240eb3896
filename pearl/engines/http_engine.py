"""``HttpEngine``: what the vLLM and SGLang adapters share, a registry of child HTTP servers.

Both adapters (``pearl.engines.vllm``, ``pearl.engines.sglang``) run one ``ChildServer`` per worker
and talk to it over one pooled aiohttp session. This base holds what is the same in both and
nothing of either wire format (routes, bodies and replies stay in each adapter's module):

- the registry: ``_start`` (from each adapter's ``launch``) registers a server and starts it;
  ``server`` / ``_alive`` look one up (``EngineError`` if none was launched, ``EngineDeadError``
  with its exit code and log tail if its process is gone); ``stop``; ``healthy`` (``GET /health``);
  ``close`` stops every server, then closes the session;
- ``_fetch``: one control call (HTTP 200 or ``EngineError``) raced against the server's death;
- ``_post_stream``: one generation request, its reply read whole or as SSE events up to
  ``[DONE]`` (a body that ends before ``[DONE]`` is a dropped connection, not a finished request);
- ``_follow``: the bookkeeping around one generation stream (in-flight count, the streams that
  ``wait_tokens`` watches, and the remote abort when the caller cancels);
- ``StreamState``: what one stream has produced so far, kept on abort or death.

Life cycle: an adapter subclasses ``HttpEngine[ServerT, SettingsT]`` with its server class and
settings; ``launch`` builds the server and calls ``_start``; ``close`` ends everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import aiohttp

from pearl.engines.base import EngineDeadError, EngineError
from pearl.engines.child_server import ChildServer, race_death

# idle pooled connections are dropped before uvicorn closes them (its keep-alive is 5 s); a
# request written into a connection the server is closing fails with "closing transport"
KEEPALIVE_S = 2.0
HEALTH_TIMEOUT_S = 5.0
ABORT_TIMEOUT_S = 5.0  # the remote abort of a cancelled request


def _read_outcome(task: asyncio.Future[Any]) -> None:
    """Mark a detached remote call's outcome as read (its caller has moved on)."""
    if not task.cancelled():
        task.exception()


class EngineSettings(Protocol):
    """What the base reads of an adapter's settings."""

    @property
    def request_timeout_s(self) -> float: ...


ServerT = TypeVar("ServerT", bound=ChildServer)
SettingsT = TypeVar("SettingsT", bound=EngineSettings)
Message = Callable[[Any], None]


@dataclass
class StreamState:
    """What one streamed request has produced so far (kept on abort / death). Each adapter adds
    the fields of its own wire format."""

    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    t_first: float | None = None
    t_last: float | None = None
    conc_sum: float = 0.0
    conc_n: int = 0
    grew: asyncio.Event = field(default_factory=asyncio.Event)

    def arrived(self, inflight: int) -> None:
        """New tokens arrived now, with ``inflight`` requests running on the server."""
        now = time.perf_counter()
        self.t_first = self.t_first if self.t_first is not None else now
        self.t_last = now
        self.conc_sum += inflight
        self.conc_n += 1

    def decode_timings(self) -> tuple[float, float]:
        """``(decode_s, step_s)``: ``decode_s = t_last - t_first`` (0 before any token) and the mean
        inter-token time ``step_s = decode_s / max(n - 1, 1)`` over the ``n`` tokens."""
        if self.t_first is None or self.t_last is None:
            return 0.0, 0.0
        decode = self.t_last - self.t_first
        return decode, decode / max(len(self.tokens) - 1, 1)

    def concurrency(self) -> float:
        """Mean in-flight requests on the server, sampled at each token arrival (1 if none)."""
        return self.conc_sum / self.conc_n if self.conc_n else 1.0

    def output_logprobs(self) -> tuple[float, ...]:
        """One logprob per output token, or none if fewer arrived than tokens."""
        n = len(self.tokens)
        return tuple(self.logprobs[:n]) if len(self.logprobs) >= n else ()


class HttpEngine(Generic[ServerT, SettingsT]):
    """Child HTTP servers of one adapter, one per worker; see the module docstring."""

    def __init__(self, run_dir: str | Path, settings: SettingsT) -> None:
        self.run_dir = Path(run_dir)
        self.settings = settings
        self._servers: dict[str, ServerT] = {}
        self._http: aiohttp.ClientSession | None = None
        self._live: dict[str, StreamState] = {}  # rid -> stream in progress (for ``wait_tokens``)
        self._live_changed = asyncio.Event()
        self.last_role_change_s = float("nan")

    # ------------------------------------------------------------------------------ servers
    def _session(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_read=self.settings.request_timeout_s),
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S))
        return self._http

    def server(self, worker_id: str) -> ServerT:
        try:
            return self._servers[worker_id]
        except KeyError:
            raise EngineError(worker_id, f"no server launched for this worker (known: {sorted(self._servers)})") \
                from None

    def _alive(self, worker_id: str) -> ServerT:
        srv = self.server(worker_id)
        if not srv.alive:
            raise EngineDeadError(worker_id, f"{srv.kind} is not running", exit_code=srv.exit_code,
                                  log_tail=srv.log_tail())
        return srv

    async def _start(self, srv: ServerT) -> None:
        """Register ``srv`` as its worker's server and start it (``EngineStartError`` on failure).
        A worker whose server still runs is an ``EngineError``."""
        worker_id = srv.spec.worker_id
        if worker_id in self._servers and self._servers[worker_id].alive:
            raise EngineError(worker_id, "already running; stop it or set_role instead of launching twice")
        self._servers[worker_id] = srv
        await srv.start()

    async def stop(self, worker_id: str) -> None:
        srv = self._servers.get(worker_id)
        if srv is not None:
            await srv.stop()

    #: the liveness probe ``healthy`` sends (an adapter whose ``/health`` runs a generation names a
    #: cheaper route)
    live_path = "/health"

    async def healthy(self, worker_id: str) -> bool:
        srv = self._servers.get(worker_id)
        if srv is None or not srv.alive:
            return False
        try:
            async with self._session().get(f"{srv.url}{self.live_path}",
                                           timeout=aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_S)) as r:
                return r.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def close(self) -> None:
        await asyncio.gather(*(s.stop() for s in self._servers.values()))
        if self._http is not None:
            await self._http.close()
            self._http = None

    # ------------------------------------------------------------------------------ calls
    async def _fetch(self, srv: ServerT, method: str, path: str, timeout_s: float, body: Any = None,
                     params: Mapping[str, str] | None = None) -> str:
        """One control call's reply text. Any status but 200 is an ``EngineError`` naming the call;
        the server's death meanwhile is an ``EngineDeadError`` at once (``race_death``)."""
        async def call() -> str:
            async with self._session().request(method, f"{srv.url}{path}", json=body, params=params,
                                               timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                text = await r.text()
                if r.status != 200:
                    raise EngineError(srv.spec.worker_id, f"{method} {path} -> HTTP {r.status}: {text[:500]}")
                return text
        text: str = await race_death(srv, call(), f"{method} {path}")
        return text

    async def _post_stream(self, srv: ServerT, path: str, body: dict[str, Any], on_reply: Message,
                           on_event: Message | None = None) -> None:
        """POST a generation ``body`` to ``path``. A non-streaming body (``stream`` false) has its
        JSON reply given whole to ``on_reply``; a streaming one has each SSE ``data:`` event given
        to ``on_event`` (default ``on_reply``) up to ``data: [DONE]``. A body that closes without
        ``[DONE]`` raises ``aiohttp.ClientPayloadError``: the connection dropped (a killed server can
        close it cleanly between events), and ``race_death`` waits for the exit and says so."""
        async with self._session().post(f"{srv.url}{path}", json=body) as r:
            if r.status != 200:
                text = await r.text()
                raise EngineError(srv.spec.worker_id, f"{path} -> HTTP {r.status}: {text[:500]}")
            if not body.get("stream"):
                on_reply(await r.json())
                return
            each = on_event or on_reply
            async for raw in r.content:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                each(json.loads(data))
            raise aiohttp.ClientPayloadError(f"{srv.spec.worker_id}: stream closed before [DONE]")

    async def _follow(self, srv: ServerT, rid: str, st: StreamState, read: Coroutine[Any, Any, None],
                      abort: Callable[[], Awaitable[Any]]) -> bool:
        """Await ``read`` (request ``rid`` streaming into ``st``) raced against ``srv``'s death; True
        if the stream ended normally, False if the engine stopped the server meanwhile.

        Raises ``EngineDeadError`` (with nothing in ``partial``; callers attach it) on death and
        ``EngineError`` on other failures. Cancellation runs ``abort`` (the remote abort, at most
        ``ABORT_TIMEOUT_S``) first, then re-raises."""
        srv.inflight += 1
        self._live[rid] = st
        self._live_changed.set()
        try:
            await race_death(srv, read, "generation")
            return True
        except EngineDeadError:
            if srv.stopping:
                return False
            raise
        except asyncio.CancelledError:
            if srv.alive:
                # the abort outlives a second cancellation of this task (shield); its outcome is
                # then read by the callback, so a server that dies meanwhile is not reported as a
                # "Task exception was never retrieved" traceback
                remote = asyncio.ensure_future(asyncio.wait_for(abort(), ABORT_TIMEOUT_S))
                remote.add_done_callback(_read_outcome)
                with contextlib.suppress(Exception):
                    await asyncio.shield(remote)
            raise
        finally:
            srv.inflight -= 1
            self._live.pop(rid, None)
            st.grew.set()

    async def wait_tokens(self, rid: str, n: int) -> int:
        """Wait until request ``rid`` has streamed ``n`` tokens or its stream ended; returns the count
        so far. A request not started yet is waited for (wrap in ``asyncio.wait_for``). For a PD
        request this follows its decode part."""
        while True:
            st = self._live.get(rid)
            if st is None:
                self._live_changed.clear()
                await self._live_changed.wait()
                continue
            if len(st.tokens) >= n or rid not in self._live:
                return len(st.tokens)
            st.grew.clear()
            await st.grew.wait()
            if rid not in self._live:
                return len(st.tokens)
