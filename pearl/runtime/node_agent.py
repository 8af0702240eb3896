"""Node agent: one per node (torchrun rank); runs that node's engine servers and trainer ranks on the
controller's command and reports their health. ``RemoteEngine`` is the controller's side.

Wire protocol (HTTP + JSON, aiohttp; every route needs ``Authorization: Bearer <internal token>``,
a per-run secret rank 0 publishes through the torch.distributed store)::

    GET  /agent/v1/health                   {"node", "rank", "workers": {id: healthy}, "children": {...}}
    POST /agent/v1/engine/<method>          one InferenceEngine call: launch, stop, healthy, generate,
                                            generate_pd, abort, pause, resume, load_weights,
                                            weight_version, release_memory, resume_memory, set_role
                                            -> {"ok": true, "result": ...} or
                                               {"ok": false, "error": {"type", "worker_id", "message", ...}}
    POST /agent/v1/children/<name>/start    {"module": "pearl.train.trainer", "args": [...], "env": {...},
                                             "first_line_timeout_s": 300}  -> {"pid", "first": <its first
                                            reply line, e.g. the trainer rank's setup report> | null}
    POST /agent/v1/children/<name>/send     {"line": {...}} -> {"reply": {...}}  (one JSON line each way:
                                            the trainer rank's stdin/stdout protocol, pearl.train.trainer)
    POST /agent/v1/children/<name>/stop     terminate (SIGTERM, then SIGKILL after 10 s)
    POST /agent/v1/shutdown                 stop every server and child; the rank's process then exits

Only modules in ``CHILD_MODULES`` may be started: the agent never runs an arbitrary command.

Life cycle: ``NodeAgent.start()`` serves on ``host:port`` (0: a free port) and returns; ``close()``
stops every engine server (``engine.close()``) and child, then the HTTP server. ``shutdown_requested``
is set by ``/shutdown``. Engine errors cross the wire by type (``EngineError``, ``EngineDeadError``,
``EngineStartError``, ``KVTransferError``) with their partial output, so the controller's recovery
logic sees what it would see locally. A cancelled ``RemoteEngine.generate`` aborts the remote
request before re-raising (the ``InferenceEngine`` contract).

Placement: ``RemoteEngine`` routes a worker to the agent of the node its first device lies on
(``node_of(device)``, from the cluster table); ``generate_pd`` needs both workers on one node
(cross-node KV transfer is the real engines' business: NIXL / Mooncake between their servers).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
from aiohttp import web

from pearl.admin.security import token_matches
from pearl.core.state import Role
from pearl.engines.base import (
    EngineDeadError,
    EngineError,
    EngineStartError,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    InferenceEngine,
    KVTransferError,
    RequestTimings,
    SamplingParams,
    ServerSpec,
)

log = logging.getLogger("pearl.agent")

CHILD_MODULES = frozenset({"pearl.train.trainer"})
_STOP_GRACE_S = 10.0


# ------------------------------------------------------------------------------ (de)serialisation
def spec_to_dict(spec: ServerSpec) -> dict[str, Any]:
    return {**dataclasses.asdict(spec), "devices": list(spec.devices), "role": spec.role.value}


def spec_from_dict(d: Mapping[str, Any]) -> ServerSpec:
    return ServerSpec(
        worker_id=str(d["worker_id"]), devices=tuple(str(x) for x in d["devices"]), role=Role(d["role"]),
        weights=str(d["weights"]), weight_version=int(d.get("weight_version", 0)), port=int(d.get("port", 0)),
        host=str(d.get("host", "127.0.0.1")), extra={str(k): str(v) for k, v in dict(d.get("extra", {})).items()},
    )


def request_to_dict(req: GenerateRequest) -> dict[str, Any]:
    s = req.sampling
    return {
        "rid": req.rid, "input_ids": list(req.input_ids), "return_logprobs": req.return_logprobs,
        "sampling": {"max_new_tokens": s.max_new_tokens, "temperature": s.temperature, "top_p": s.top_p,
                     "stop_token_ids": list(s.stop_token_ids), "seed": s.seed},
    }


def request_from_dict(d: Mapping[str, Any]) -> GenerateRequest:
    s = d["sampling"]
    return GenerateRequest(
        rid=str(d["rid"]), input_ids=tuple(int(x) for x in d["input_ids"]),
        sampling=SamplingParams(int(s["max_new_tokens"]), float(s.get("temperature", 1.0)),
                                float(s.get("top_p", 1.0)), tuple(int(x) for x in s.get("stop_token_ids", ())),
                                None if s.get("seed") is None else int(s["seed"])),
        return_logprobs=bool(d.get("return_logprobs", True)),
    )


def result_to_dict(r: GenerateResult) -> dict[str, Any]:
    return {**dataclasses.asdict(r), "output_ids": list(r.output_ids), "logprobs": list(r.logprobs),
            "finish_reason": r.finish_reason.value}


def result_from_dict(d: Mapping[str, Any]) -> GenerateResult:
    return GenerateResult(
        rid=str(d["rid"]), output_ids=tuple(int(x) for x in d["output_ids"]),
        logprobs=tuple(float(x) for x in d["logprobs"]), finish_reason=FinishReason(d["finish_reason"]),
        weight_version=int(d["weight_version"]), prompt_tokens=int(d["prompt_tokens"]),
        cached_tokens=int(d.get("cached_tokens", 0)), timings=RequestTimings(**dict(d.get("timings", {}))),
        worker_id=str(d.get("worker_id", "")), decode_worker_id=str(d.get("decode_worker_id", "")),
    )


def error_to_dict(e: EngineError) -> dict[str, Any]:
    out: dict[str, Any] = {"type": type(e).__name__, "worker_id": e.worker_id,
                           "message": str(e).removeprefix(f"worker {e.worker_id}: ")}
    partial = getattr(e, "partial", None)
    out["partial"] = None if partial is None else result_to_dict(partial)
    if isinstance(e, EngineDeadError):
        out["exit_code"], out["log_tail"] = e.exit_code, e.log_tail
        out["message"] = out["message"].split(" (exit code")[0].split("; last log lines:")[0]
    return out


def error_from_dict(d: Mapping[str, Any]) -> EngineError:
    wid, msg = str(d.get("worker_id", "")), str(d.get("message", ""))
    partial = None if d.get("partial") is None else result_from_dict(d["partial"])
    kind = d.get("type")
    if kind in ("EngineDeadError", "EngineStartError"):
        cls = EngineStartError if kind == "EngineStartError" else EngineDeadError
        return cls(wid, msg, d.get("exit_code"), str(d.get("log_tail", "")), partial)
    if kind == "KVTransferError":
        return KVTransferError(wid, msg, partial)
    return EngineError(wid, msg)


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
    "weight_version", "release_memory", "resume_memory", "set_role",
})


class NodeAgent:
    def __init__(self, node: str, rank: int, engine: InferenceEngine, token: str, host: str = "127.0.0.1",
                 port: int = 0, log_dir: str | None = None) -> None:
        self.node = node
        self.rank = rank
        self.engine = engine
        self._token = token
        self.host = host
        self.port = port
        self.log_dir = log_dir
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

    async def close(self) -> None:
        """Stop every child and engine server, then the HTTP server."""
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
        health = {}
        for wid in sorted(self.workers):
            try:
                health[wid] = await self.engine.healthy(wid)
            except EngineError:
                health[wid] = False
        children = {n: {"pid": c.proc.pid, "returncode": c.proc.returncode} for n, c in self.children.items()}
        return web.json_response({"node": self.node, "rank": self.rank, "workers": health, "children": children})

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
        if method == "abort":
            return await e.abort(a["worker_id"], a.get("rid"))
        if method == "load_weights":
            return await e.load_weights(a["worker_id"], a["path"], int(a["version"]))
        if method == "set_role":
            return await e.set_role(a["worker_id"], Role(a["role"]))
        return await getattr(e, method)(a["worker_id"])  # healthy, pause, resume, weight_version, memory

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
        wid = str(args.get("worker_id", args.get("prefill_id", "?")))
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
    """``InferenceEngine`` whose servers live on node agents (see the module docstring)."""

    def __init__(self, agents: Mapping[str, AgentClient], node_of: Callable[[str], str]) -> None:
        self.agents = dict(agents)
        self._node_of = node_of
        self._where: dict[str, AgentClient] = {}

    def _agent(self, worker_id: str) -> AgentClient:
        try:
            return self._where[worker_id]
        except KeyError:
            raise EngineError(worker_id, "not launched through this RemoteEngine") from None

    async def launch(self, spec: ServerSpec) -> None:
        node = self._node_of(spec.devices[0])
        agent = self.agents.get(node)
        if agent is None:
            raise EngineStartError(spec.worker_id, f"no node agent for node {node!r} (known: {sorted(self.agents)})")
        await agent.call("launch", spec=spec_to_dict(spec))
        self._where[spec.worker_id] = agent

    async def stop(self, worker_id: str) -> None:
        agent = self._where.pop(worker_id, None)
        if agent is not None:
            await agent.call("stop", worker_id=worker_id)

    async def healthy(self, worker_id: str) -> bool:
        return bool(await self._agent(worker_id).call("healthy", worker_id=worker_id))

    async def generate(self, worker_id: str, req: GenerateRequest) -> GenerateResult:
        agent = self._agent(worker_id)
        try:
            return result_from_dict(await agent.call("generate", worker_id=worker_id, req=request_to_dict(req)))
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await asyncio.shield(agent.call("abort", worker_id=worker_id, rid=req.rid))
            raise

    async def generate_pd(self, prefill_id: str, decode_id: str, req: GenerateRequest) -> GenerateResult:
        agent = self._agent(prefill_id)
        if self._agent(decode_id) is not agent:
            raise KVTransferError(decode_id, f"prefill {prefill_id} and decode {decode_id} are on different nodes; "
                                             "this engine hands KV over within a node only")
        try:
            raw = await agent.call("generate_pd", prefill_id=prefill_id, decode_id=decode_id, req=request_to_dict(req))
            return result_from_dict(raw)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await asyncio.shield(agent.call("abort", worker_id=prefill_id, rid=req.rid))
                await asyncio.shield(agent.call("abort", worker_id=decode_id, rid=req.rid))
            raise

    async def abort(self, worker_id: str, rid: str | None = None) -> None:
        await self._agent(worker_id).call("abort", worker_id=worker_id, rid=rid)

    async def pause(self, worker_id: str) -> None:
        await self._agent(worker_id).call("pause", worker_id=worker_id)

    async def resume(self, worker_id: str) -> None:
        await self._agent(worker_id).call("resume", worker_id=worker_id)

    async def load_weights(self, worker_id: str, path: str, version: int) -> None:
        await self._agent(worker_id).call("load_weights", worker_id=worker_id, path=path, version=version)

    async def weight_version(self, worker_id: str) -> int:
        return int(await self._agent(worker_id).call("weight_version", worker_id=worker_id))

    async def release_memory(self, worker_id: str) -> None:
        await self._agent(worker_id).call("release_memory", worker_id=worker_id)

    async def resume_memory(self, worker_id: str) -> None:
        await self._agent(worker_id).call("resume_memory", worker_id=worker_id)

    async def set_role(self, worker_id: str, role: Role) -> None:
        await self._agent(worker_id).call("set_role", worker_id=worker_id, role=role.value)

    async def close(self) -> None:
        for wid in list(self._where):
            with contextlib.suppress(EngineError, aiohttp.ClientError):
                await self.stop(wid)
