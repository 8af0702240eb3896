"""Node agent: one per node (torchrun rank); runs that node's engine servers and trainer ranks on the
controller's command and reports their health. ``RemoteEngine`` is the controller's side.

Wire protocol (HTTP + JSON, aiohttp; every route needs ``Authorization: Bearer <internal token>``,
a per-run secret rank 0 publishes through the torch.distributed store)::

    GET  /agent/v1/health                   {"node", "rank", "workers": {id: healthy}, "children": {...},
                                             "split_pd": engine runs PD halves (cross-node pairs),
                                             "capabilities": the engine's EngineCapabilities,
                                             "cloud": the cloud watch's view, with ``cloud_watch`` on}
    POST /agent/v1/engine/<method>          one InferenceEngine call: launch, stop, healthy, generate,
                                            generate_pd, abort, pause, resume, load_weights,
                                            weight_version, release_memory, resume_memory, set_role,
                                            pd_prefill (-> KV handle | null), pd_decode (with the handle)
                                            -> {"ok": true, "result": ...} or
                                               {"ok": false, "error": {"type", "worker_id", "message", ...}}
    POST /agent/v1/children/<name>/start    {"module": "pearl.train.trainer", "args": [...], "env": {...},
                                             "first_line_timeout_s": 300}  -> {"pid", "first": <its first
                                            reply line, e.g. the trainer rank's setup report> | null}
    POST /agent/v1/children/<name>/send     {"line": {...}} -> {"reply": {...}}  (one JSON line each way:
                                            the trainer rank's stdin/stdout protocol, pearl.train.trainer)
    POST /agent/v1/children/<name>/stop     terminate (SIGTERM, then SIGKILL after 10 s)
    POST /agent/v1/free-port                {"port": a free TCP port on this node}
    POST /agent/v1/shutdown                 stop every server and child; the rank's process then exits

Only modules in ``CHILD_MODULES`` may be started: the agent never runs an arbitrary command.

Life cycle: ``NodeAgent.start()`` serves on ``host:port`` (0: a free port) and returns; ``close()``
stops every engine server (``engine.close()``) and child, then the HTTP server. ``shutdown_requested``
is set by ``/shutdown``. Engine errors cross the wire by type (``EngineError``, ``EngineDeadError``,
``EngineStartError``, ``KVTransferError``) with their partial output, so the controller's recovery
logic sees what it would see locally. A cancelled ``RemoteEngine.generate`` aborts the remote
request before re-raising (the ``InferenceEngine`` contract).

Placement: ``RemoteEngine`` routes a worker to the agent of the node its first device lies on
(``node_of(device)``, from the cluster table). A PD pair on one node runs ``generate_pd`` on its
agent; a pair across nodes runs ``pd_prefill`` on the prefill node's agent and ``pd_decode`` with
the returned KV handle on the decode node's (the KV itself moves server to server: NIXL for vLLM);
engines without that split answer ``KVTransferError``. ``GET /health`` says ``split_pd``.
``POST /agent/v1/free-port`` returns a free port on the node (the trainer group's rendezvous).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
from aiohttp import web

from pearl.access import is_loopback, token_matches
from pearl.core.state import Role
from pearl.engines.base import (
    EngineCapabilities,
    EngineDeadError,
    EngineError,
    EngineStartError,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    InferenceEngine,
    KVTransferError,
    PauseMode,
    RequestTimings,
    ServerSpec,
)
from pearl.runtime.node.wire import (  # re-exported: the wire format is part of this module's API
    capabilities_from_dict,
    capabilities_to_dict,
    error_from_dict,
    error_to_dict,
    request_from_dict,
    request_to_dict,
    result_from_dict,
    result_to_dict,
    spec_from_dict,
    spec_to_dict,
)

__all__ = ["CHILD_MODULES", "AgentClient", "Child", "NodeAgent", "RemoteEngine", "capabilities_from_dict",
           "capabilities_to_dict", "error_from_dict", "error_to_dict",
           "request_from_dict", "request_to_dict", "result_from_dict", "result_to_dict", "spec_from_dict",
           "spec_to_dict"]

log = logging.getLogger("pearl.agent")

CHILD_MODULES = frozenset({"pearl.train.trainer"})
_STOP_GRACE_S = 10.0


# ------------------------------------------------------------------------------ children
class Child:
    """A supervised child process speaking one JSON line per command on stdin/stdout."""

    def __init__(self, name: str, proc: asyncio.subprocess.Process) -> None:
        self.name = name
        self.proc = proc
        self.lock = asyncio.Lock()

    async def send(self, line: Mapping[str, Any], timeout_s: float) -> dict[str, Any]:
        assert self.proc.stdin is not None
        async with self.lock:
            self.proc.stdin.write((json.dumps(line) + "\n").encode())
            await self.proc.stdin.drain()
            return await self._read(timeout_s)

    async def read_line(self, timeout_s: float) -> dict[str, Any]:
        """One unsolicited line (e.g. the setup report a trainer rank prints first)."""
        async with self.lock:
            return await self._read(timeout_s)

    async def _read(self, timeout_s: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        raw = await asyncio.wait_for(self.proc.stdout.readline(), timeout_s)
        if not raw:
            code = await asyncio.wait_for(self.proc.wait(), 5)
            raise RuntimeError(f"child {self.name!r} closed its stdout (exit code {code})")
        reply: dict[str, Any] = json.loads(raw)
        return reply

    async def stop(self) -> int | None:
        """Close its stdin (a line-protocol child exits on EOF), then SIGTERM, then SIGKILL, each
        after ``_STOP_GRACE_S``; the exit code."""
        if self.proc.stdin is not None and not self.proc.stdin.is_closing():
            self.proc.stdin.close()
        for step in ("eof", "term", "kill"):
            if self.proc.returncode is not None:
                break
            with contextlib.suppress(ProcessLookupError):
                if step == "term":
                    self.proc.send_signal(signal.SIGTERM)
                elif step == "kill":
                    self.proc.kill()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.proc.wait(), _STOP_GRACE_S)
        return await self.proc.wait()


# ------------------------------------------------------------------------------ the agent
_ENGINE_METHODS = frozenset({
    "launch", "stop", "healthy", "generate", "generate_pd", "abort", "pause", "resume", "load_weights",
    "weight_version", "release_memory", "resume_memory", "set_role", "pd_prefill", "pd_decode",
})


class NodeAgent:
    def __init__(self, node: str, rank: int, engine: InferenceEngine, token: str, host: str = "127.0.0.1",
                 port: int = 0, log_dir: str | None = None, server_host: str | None = None,
                 cloud_watch: Any = None) -> None:
        self.node = node
        #: this node's ``pearl.runtime.node.cloud_watch.CloudWatch`` (opt-in); its view rides on /health
        self.cloud_watch = cloud_watch
        self.rank = rank
        self.engine = engine
        self._token = token
        self.host = host
        self.port = port
        self.log_dir = log_dir
        # the address this node's engine servers bind to when the controller asks for loopback: a
        # cross-node PD pair needs the prefill server's KV side channel (NIXL) reachable from the
        # decode node, so on a cluster it is this node's routable host name
        self.server_host = server_host
        self.workers: set[str] = set()
        self.children: dict[str, Child] = {}
        self.shutdown_requested = asyncio.Event()
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[self._auth])
        app.router.add_get("/agent/v1/health", self._health)
        app.router.add_post("/agent/v1/engine/{method}", self._engine_call)
        app.router.add_post("/agent/v1/children/{name}/start", self._child_start)
        app.router.add_post("/agent/v1/children/{name}/send", self._child_send)
        app.router.add_post("/agent/v1/children/{name}/stop", self._child_stop)
        app.router.add_post("/agent/v1/free-port", self._free_port)
        app.router.add_post("/agent/v1/shutdown", self._shutdown)
        return app

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        socks = getattr(site._server, "sockets", None)
        if self.port == 0 and socks:
            self.port = int(socks[0].getsockname()[1])
        log.info("node agent %s (rank %d) listening on %s", self.node, self.rank, self.url)
        if self.cloud_watch is not None:
            self.cloud_watch.start()

    async def close(self) -> None:
        """Stop every child and engine server, then the HTTP server."""
        if self.cloud_watch is not None:
            await self.cloud_watch.close()
        for child in list(self.children.values()):
            await child.stop()
        self.children.clear()
        with contextlib.suppress(Exception):
            await self.engine.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @web.middleware
    async def _auth(self, request: web.Request, handler: Callable[[web.Request], Any]) -> web.StreamResponse:
        if not token_matches(request.headers.get("Authorization"), self._token):
            return web.json_response({"error": "unauthorized"}, status=401)
        resp: web.StreamResponse = await handler(request)
        return resp

    async def _health(self, request: web.Request) -> web.Response:
        """Every worker probed at once (one slow server costs one probe's timeout, not the sum)."""
        async def probe(wid: str) -> bool:
            try:
                return bool(await self.engine.healthy(wid))
            except EngineError:
                return False
        wids = sorted(self.workers)
        health = dict(zip(wids, await asyncio.gather(*(probe(w) for w in wids)), strict=True))
        children = {n: {"pid": c.proc.pid, "returncode": c.proc.returncode} for n, c in self.children.items()}
        doc = {"node": self.node, "rank": self.rank, "workers": health, "children": children,
               "split_pd": self.engine.capabilities.split_pd,
               "capabilities": capabilities_to_dict(self.engine.capabilities)}
        if self.cloud_watch is not None:
            doc["cloud"] = self.cloud_watch.view()
        return web.json_response(doc)

    async def _engine_call(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        if method not in _ENGINE_METHODS:
            return web.json_response({"error": f"unknown engine method {method!r}"}, status=404)
        try:
            args = await request.json()
            result = await self._dispatch(method, args)
        except EngineError as e:
            return web.json_response({"ok": False, "error": error_to_dict(e)})
        except (KeyError, ValueError, TypeError) as e:
            return web.json_response({"error": f"bad arguments for {method}: {e!r}"}, status=400)
        return web.json_response({"ok": True, "result": result})

    async def _dispatch(self, method: str, a: Mapping[str, Any]) -> Any:
        e = self.engine
        if method == "launch":
            spec = spec_from_dict(a["spec"])
            if self.server_host and is_loopback(spec.host):
                spec = dataclasses.replace(spec, host=self.server_host)
            await e.launch(spec)
            self.workers.add(spec.worker_id)
            return None
        if method == "stop":
            await e.stop(a["worker_id"])
            self.workers.discard(a["worker_id"])
            return None
        if method == "generate":
            return result_to_dict(await e.generate(a["worker_id"], request_from_dict(a["req"])))
        if method == "generate_pd":
            return result_to_dict(await e.generate_pd(a["prefill_id"], a["decode_id"], request_from_dict(a["req"])))
        if method in ("pd_prefill", "pd_decode"):
            if not e.capabilities.split_pd:
                wid = a["prefill_id"] if method == "pd_prefill" else a["decode_id"]
                raise KVTransferError(wid, f"node {self.node}'s engine ({type(e).__name__}) "
                                           "hands KV over within one server pair only: keep this pair on one node")
            req = request_from_dict(a["req"])
            if method == "pd_prefill":
                return await e.pd_prefill(a["prefill_id"], req)  # type: ignore[attr-defined]
            res = await e.pd_decode(a["decode_id"], req, a["handle"], a.get("prefill_id", ""))  # type: ignore[attr-defined]
            return result_to_dict(res)
        if method == "abort":
            return await e.abort(a["worker_id"], a.get("rid"))
        if method == "load_weights":
            return await e.load_weights(a["worker_id"], a["path"], int(a["version"]))
        if method == "set_role":
            return await e.set_role(a["worker_id"], Role(a["role"]))
        if method == "pause":
            return await e.pause(a["worker_id"], PauseMode(a.get("mode", PauseMode.KEEP)))
        return await getattr(e, method)(a["worker_id"])  # healthy, resume, weight_version, memory

    async def _child_start(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        body = await request.json()
        module = body.get("module")
        if module not in CHILD_MODULES:
            return web.json_response({"error": f"module {module!r} is not allowed (allowed: {sorted(CHILD_MODULES)})"},
                                     status=403)
        if name in self.children and self.children[name].proc.returncode is None:
            return web.json_response({"error": f"child {name!r} is running"}, status=409)
        env = {**os.environ, **{str(k): str(v) for k, v in dict(body.get("env", {})).items()}}
        args = [str(x) for x in body.get("args", [])]
        stderr: Any = asyncio.subprocess.DEVNULL
        if self.log_dir:
            os.makedirs(self.log_dir, exist_ok=True)
            stderr = open(os.path.join(self.log_dir, f"{name}.log"), "ab")  # noqa: SIM115 - handed to the child
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", module, *args, stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=stderr, env=env, limit=1 << 26,
            )
        finally:
            if stderr is not asyncio.subprocess.DEVNULL:
                stderr.close()
        child = Child(name, proc)
        self.children[name] = child
        first = None
        wait = body.get("first_line_timeout_s")
        if wait is not None:
            try:
                first = await child.read_line(float(wait))
            except (RuntimeError, TimeoutError, ValueError) as e:
                return web.json_response({"pid": proc.pid, "first": None, "error": str(e)}, status=502)
        return web.json_response({"pid": proc.pid, "first": first})

    async def _child_send(self, request: web.Request) -> web.Response:
        child = self.children.get(request.match_info["name"])
        if child is None:
            return web.json_response({"error": "no such child"}, status=404)
        body = await request.json()
        try:
            reply = await child.send(body["line"], float(body.get("timeout_s", 3600)))
        except (RuntimeError, TimeoutError, ValueError) as e:
            return web.json_response({"error": str(e)}, status=502)
        return web.json_response({"reply": reply})

    async def _child_stop(self, request: web.Request) -> web.Response:
        child = self.children.pop(request.match_info["name"], None)
        if child is None:
            return web.json_response({"returncode": None})
        return web.json_response({"returncode": await child.stop()})

    async def _free_port(self, request: web.Request) -> web.Response:
        """A free TCP port on this node (e.g. the trainer group's rendezvous port on rank 0's node)."""
        host = self.server_host or ("127.0.0.1" if is_loopback(self.host) else "0.0.0.0")
        with socket.socket() as sock:
            sock.bind((host, 0))
            return web.json_response({"port": int(sock.getsockname()[1])})

    async def _shutdown(self, request: web.Request) -> web.Response:
        self.shutdown_requested.set()
        return web.json_response({"ok": True})


# ------------------------------------------------------------------------------ controller side
class AgentClient:
    """HTTP client of one node agent."""

    def __init__(self, url: str, token: str, session: aiohttp.ClientSession) -> None:
        self.url = url
        self._headers = {"Authorization": f"Bearer {token}"}
        self._session = session

    async def call(self, method: str, **args: Any) -> Any:
        """One engine call on the agent. An unreachable agent (its node or process is gone) is an
        ``EngineDeadError`` of the worker: the runtime removes the worker, as for a dead server."""
        wid = str(args.get("worker_id") or (args.get("decode_id") if method == "pd_decode" else None)
                  or args.get("prefill_id", "?"))
        try:
            async with self._session.post(f"{self.url}/agent/v1/engine/{method}", json=args,
                                          headers=self._headers) as resp:
                if resp.status != 200:
                    raise EngineError(wid, f"agent {self.url} answered {resp.status} to {method}: {await resp.text()}")
                body = await resp.json()
        except (aiohttp.ClientError, OSError) as e:
            raise EngineDeadError(wid, f"node agent {self.url} unreachable during {method}: "
                                       f"{type(e).__name__}: {e}") from None
        if not body["ok"]:
            raise error_from_dict(body["error"])
        return body["result"]

    async def get(self, path: str) -> dict[str, Any]:
        async with self._session.get(f"{self.url}{path}", headers=self._headers) as resp:
            resp.raise_for_status()
            out: dict[str, Any] = await resp.json()
            return out

    async def post(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        async with self._session.post(f"{self.url}{path}", json=body, headers=self._headers) as resp:
            out: dict[str, Any] = await resp.json()
            if resp.status >= 400:
                raise RuntimeError(f"agent {self.url}{path}: {resp.status} {out}")
            return out

    async def health(self) -> dict[str, Any]:
        return await self.get("/agent/v1/health")

    async def shutdown(self) -> None:
        await self.post("/agent/v1/shutdown", {})


class RemoteEngine:
    """``InferenceEngine`` whose servers live on node agents (see the module docstring).

    Cross-node PD: when the prefill and decode workers sit on two nodes, the prefill half runs on
    the prefill node's agent (``pd_prefill``: the prompt with ``do_remote_decode``; its reply is the
    KV handle, for vLLM the ``kv_transfer_params`` naming the prefill server's NIXL side channel)
    and the decode half on the decode node's agent (``pd_decode`` with that handle: the decode
    server pulls the KV straight from the prefill server over NIXL, server to server; only the
    small handle passes through the controller). SGLang's handle is the prefill server's bootstrap
    address and room: its ``pd_prefill`` starts the prefill request in the background and answers at
    once, and the decode server pulls the KV by room. Engines without the split (the emulated
    engine) answer ``KVTransferError``: keep their pairs on one node.

    Lost nodes: ``mark_node_dead(node, reason)`` (called by ``pearl.runtime.node.watch.AgentWatcher``
    when an agent stops answering ``/health``) fails every in-flight call to that node at once with
    ``EngineDeadError`` and every later one too, so the pipeline resumes the turns elsewhere and
    the controller removes the workers; ``mark_node_alive`` undoes it when the agent answers again.
    The partial output of a request in flight on a lost node is lost with the node (the agent held
    it); the turn restarts from its last completed part.
    """

    def __init__(self, agents: Mapping[str, AgentClient], node_of: Callable[[str], str],
                 capabilities: EngineCapabilities | None = None) -> None:
        self.agents = dict(agents)
        #: what the agents' engines all declare (``wire.common_capabilities`` of their ``/health``);
        #: without it, only what every engine does (no split PD, pause ``keep``)
        self.capabilities = capabilities or EngineCapabilities()
        self._node_of = node_of
        self._where: dict[str, str] = {}  # worker id -> node
        self._dead: dict[str, str] = {}  # node -> why it is considered lost
        self._lost: dict[str, asyncio.Event] = {n: asyncio.Event() for n in self.agents}

    # ------------------------------------------------------------------ nodes
    def workers_on(self, node: str) -> list[str]:
        return sorted(w for w, n in self._where.items() if n == node)

    def node_of_worker(self, worker_id: str) -> str:
        return self._node(worker_id)

    def dead_nodes(self) -> dict[str, str]:
        return dict(self._dead)

    def mark_node_dead(self, node: str, reason: str) -> list[str]:
        """Fail every call to ``node`` from now on (in-flight ones at once); its workers' ids."""
        if node not in self._dead:
            self._dead[node] = reason
            self._lost.setdefault(node, asyncio.Event()).set()
            log.warning("node %s marked dead: %s; its workers %s fail over", node, reason, self.workers_on(node))
        return self.workers_on(node)

    def mark_node_alive(self, node: str) -> None:
        if self._dead.pop(node, None) is not None:
            self._lost[node] = asyncio.Event()
            log.info("node %s answers again: new workers may be placed there", node)

    def _node(self, worker_id: str) -> str:
        try:
            return self._where[worker_id]
        except KeyError:
            raise EngineError(worker_id, "not launched through this RemoteEngine") from None

    async def _call(self, node: str, method: str, wid: str, **args: Any) -> Any:
        """``agent.call`` raced against the node being marked dead."""
        if node in self._dead:
            raise EngineDeadError(wid, f"node {node} is lost ({self._dead[node]}) during {method}")
        lost = self._lost.setdefault(node, asyncio.Event())
        call = asyncio.ensure_future(self.agents[node].call(method, **args))
        waiter = asyncio.ensure_future(lost.wait())
        try:
            await asyncio.wait({call, waiter}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            call.cancel()
            waiter.cancel()
            await asyncio.gather(call, waiter, return_exceptions=True)
            raise
        if call.done():
            waiter.cancel()
            return call.result()
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
        raise EngineDeadError(wid, f"node {node} is lost ({self._dead.get(node, 'agent unreachable')}) during {method}")

    async def _on(self, worker_id: str, method: str, **args: Any) -> Any:
        return await self._call(self._node(worker_id), method, worker_id, worker_id=worker_id, **args)

    # ------------------------------------------------------------------ InferenceEngine
    async def launch(self, spec: ServerSpec) -> None:
        node = self._node_of(spec.devices[0])
        if node not in self.agents:
            raise EngineStartError(spec.worker_id, f"no node agent for node {node!r} (known: {sorted(self.agents)})")
        if node in self._dead:
            raise EngineStartError(spec.worker_id, f"node {node} is lost ({self._dead[node]}): not launching there")
        await self._call(node, "launch", spec.worker_id, spec=spec_to_dict(spec))
        self._where[spec.worker_id] = node

    async def stop(self, worker_id: str) -> None:
        node = self._where.pop(worker_id, None)
        if node is not None and node not in self._dead:  # a lost node's servers went with it
            await self._call(node, "stop", worker_id, worker_id=worker_id)

    async def healthy(self, worker_id: str) -> bool:
        if self._where.get(worker_id) in self._dead:
            return False
        return bool(await self._on(worker_id, "healthy"))

    async def generate(self, worker_id: str, req: GenerateRequest) -> GenerateResult:
        node = self._node(worker_id)
        try:
            return result_from_dict(await self._call(node, "generate", worker_id, worker_id=worker_id,
                                                     req=request_to_dict(req)))
        except asyncio.CancelledError:
            await self._abort_quietly(node, worker_id, req.rid)
            raise

    async def _abort_quietly(self, node: str, worker_id: str, rid: str) -> None:
        if node in self._dead:
            return
        with contextlib.suppress(Exception):
            await asyncio.shield(self.agents[node].call("abort", worker_id=worker_id, rid=rid))

    async def generate_pd(self, prefill_id: str, decode_id: str, req: GenerateRequest) -> GenerateResult:
        pnode, dnode = self._node(prefill_id), self._node(decode_id)
        if pnode == dnode:
            try:
                raw = await self._call(pnode, "generate_pd", prefill_id, prefill_id=prefill_id, decode_id=decode_id,
                                       req=request_to_dict(req))
                return result_from_dict(raw)
            except asyncio.CancelledError:
                await self._abort_quietly(pnode, prefill_id, req.rid)
                await self._abort_quietly(pnode, decode_id, req.rid)
                raise
        return await self._generate_pd_across(prefill_id, pnode, decode_id, dnode, req)

    async def _generate_pd_across(self, prefill_id: str, pnode: str, decode_id: str, dnode: str,
                                  req: GenerateRequest) -> GenerateResult:
        """Prefill on ``pnode``'s agent, decode on ``dnode``'s with the KV handle (class docstring)."""
        empty = GenerateResult(req.rid, (), (), FinishReason.ABORT, 0, len(req.input_ids), 0, RequestTimings(),
                               prefill_id, decode_id)
        wire = request_to_dict(req)
        try:
            handle = await self._call(pnode, "pd_prefill", prefill_id, prefill_id=prefill_id, req=wire)
        except asyncio.CancelledError:
            await self._abort_quietly(pnode, prefill_id, f"{req.rid}.p")
            raise
        except (EngineDeadError, KVTransferError) as e:
            e.partial = empty  # nothing was generated yet: the turn starts over on another pair
            raise
        if handle is None:
            return empty  # the prefill was aborted (evicted, weight sync): nothing generated
        try:
            raw = await self._call(dnode, "pd_decode", decode_id, decode_id=decode_id, prefill_id=prefill_id,
                                   req=wire, handle=handle)
        except asyncio.CancelledError:
            await self._abort_quietly(dnode, decode_id, req.rid)
            raise
        return result_from_dict(raw)

    async def abort(self, worker_id: str, rid: str | None = None) -> None:
        await self._on(worker_id, "abort", rid=rid)

    async def pause(self, worker_id: str, mode: PauseMode = PauseMode.KEEP) -> None:
        await self._on(worker_id, "pause", mode=self.capabilities.check_pause(worker_id, mode).value)

    async def resume(self, worker_id: str) -> None:
        await self._on(worker_id, "resume")

    async def load_weights(self, worker_id: str, path: str, version: int) -> None:
        await self._on(worker_id, "load_weights", path=path, version=version)

    async def weight_version(self, worker_id: str) -> int:
        return int(await self._on(worker_id, "weight_version"))

    async def release_memory(self, worker_id: str) -> None:
        await self._on(worker_id, "release_memory")

    async def resume_memory(self, worker_id: str) -> None:
        await self._on(worker_id, "resume_memory")

    async def set_role(self, worker_id: str, role: Role) -> None:
        await self._on(worker_id, "set_role", role=role.value)

    async def close(self) -> None:
        for wid in list(self._where):
            with contextlib.suppress(EngineError, aiohttp.ClientError):
                await self.stop(wid)
