"""A faithful fake SGLang server: real aiohttp HTTP, SGLang's wire format, scripted outputs.

SGLang cannot serve on our CPUs (ENGINES.md), so ``SglangEngine`` is tested against this server.
It speaks the routes and JSON shapes of ``sglang/srt/entrypoints/http_server.py`` /
``srt/managers/io_struct.py`` that PEARL uses; the "model" is a pure function, so outputs are
scripted yet behave like greedy decoding of a real model:

    next_token(ctx) = crc32(seed || ctx[-4:] || len(ctx)) mod vocab
    logprob(ctx)    = -(1 + (crc32(...) mod 1000) / 1000) / 4        (in [-0.5, -0.25))

``seed`` changes with the loaded weights (``update_weights_from_disk`` / ``_distributed``), so a
weight update changes outputs and logprobs; because the next token depends only on the context, a
request resumed from prompt + partial output continues exactly as the uninterrupted one would.
Tokens are emitted every ``token_delay_s`` seconds (the simulated decode step); a stop token in
``stop_token_ids`` ends with ``finish_reason {"type": "stop", "matched": id}``.

Life cycle: ``python -m pearl.engines.sglang_fake --port P [--disaggregation-mode prefill
--disaggregation-bootstrap-port B] [--enable-pd-role-switch] ...`` (the same flags as
``sglang.launch_server`` that PEARL passes; unknown ones are ignored), or in-process with
``FakeSglang(...).start()`` / ``.stop()``. PD: the prefill server registers the "KV" (a digest of
the prompt) for ``bootstrap_room`` on its bootstrap port (``GET /kv/{room}``); the decode server
fetches it from ``bootstrap_host:bootstrap_port`` before decoding and fails the request if the
digest does not match its own prompt (a real hand-off check, like the ``fake`` transfer backend).

Wire details reproduced: ``/generate`` non-streaming returns ``{text, output_ids, meta_info}``;
streaming (``stream: true``) sends SSE ``data: {...}`` chunks whose ``output_ids`` and
``meta_info.output_token_logprobs`` are cumulative (SGLang's default without
``--incremental-streaming-output``), then ``data: [DONE]``. ``output_token_logprobs`` entries are
``[logprob, token_id, null]``. Aborted requests return their partial output with
``finish_reason {"type": "abort", "message": ...}``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

VOCAB = 49152
KV_WAIT_S = 5.0  # how long a decode server waits for its prefill's KV


def next_token(seed: int, ctx: Sequence[int]) -> tuple[int, float]:
    key = f"{seed}|{list(ctx[-4:])}|{len(ctx)}".encode()
    h = zlib.crc32(key)
    return h % VOCAB, -(1.0 + (zlib.crc32(key[::-1]) % 1000) / 1000.0) / 4.0


def kv_digest(input_ids: Sequence[int]) -> str:
    return hashlib.sha1(json.dumps(list(input_ids)).encode()).hexdigest()


@dataclass
class _Req:
    rid: str
    input_ids: list[int]
    out: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)
    aborted: str | None = None
    abort_ev: asyncio.Event = field(default_factory=asyncio.Event)

    def abort(self, message: str) -> None:
        self.aborted = message
        self.abort_ev.set()


@dataclass
class FakeSglang:
    """One fake server. ``mode`` is ``null`` (colocated), ``prefill`` or ``decode``."""

    host: str = "127.0.0.1"
    port: int = 0
    mode: str = "null"
    bootstrap_port: int = 0
    token_delay_s: float = 0.002
    model_path: str = "fake-model"
    enable_role_switch: bool = False
    enable_memory_saver: bool = True
    weight_version: str = "default"
    seed: int = 0
    paused: asyncio.Event = field(default_factory=asyncio.Event)  # set = generation may run
    released: bool = False
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    rooms: dict[int, str] = field(default_factory=dict)
    reqs: dict[str, _Req] = field(default_factory=dict)
    _runners: list[web.AppRunner] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.paused.set()
        self.seed = zlib.crc32(self.model_path.encode())

    # ------------------------------------------------------------------ life cycle
    async def start(self) -> None:
        app = web.Application()
        r = app.router
        r.add_post("/generate", self.generate)
        r.add_post("/abort_request", self.abort_request)
        r.add_post("/pause_generation", self.pause_generation)
        r.add_post("/continue_generation", self.continue_generation)
        r.add_post("/update_weights_from_disk", self.update_weights_from_disk)
        r.add_post("/init_weights_update_group", self.init_weights_update_group)
        r.add_post("/update_weights_from_distributed", self.update_weights_from_distributed)
        r.add_post("/release_memory_occupation", self.release_memory)
        r.add_post("/resume_memory_occupation", self.resume_memory)
        r.add_post("/flush_cache", self.flush_cache)
        r.add_post("/pd_role_switch", self.pd_role_switch)
        r.add_get("/health", self.health)
        r.add_get("/get_server_info", self.server_info)
        r.add_get("/get_weight_version", self.get_weight_version)
        self.port = await self._serve(app, self.port)
        if self.mode == "prefill" or self.enable_role_switch:
            boot = web.Application()
            boot.router.add_get("/kv/{room}", self.kv_room)
            self.bootstrap_port = await self._serve(boot, self.bootstrap_port)

    async def _serve(self, app: web.Application, port: int) -> int:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, port)
        await site.start()
        self._runners.append(runner)
        server = site._server
        assert server is not None
        return int(server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]

    async def stop(self) -> None:
        for runner in self._runners:
            await runner.cleanup()
        self._runners.clear()

    # ------------------------------------------------------------------ routes
    async def health(self, _: web.Request) -> web.Response:
        return web.Response(text="")

    async def server_info(self, _: web.Request) -> web.Response:
        return web.json_response({"model_path": self.model_path, "disaggregation_mode": self.mode,
                                  "disaggregation_bootstrap_port": self.bootstrap_port,
                                  "weight_version": self.weight_version, "version": "0.5.23-fake"})

    async def get_weight_version(self, _: web.Request) -> web.Response:
        return web.json_response({"weight_version": self.weight_version})

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        ids = body.get("input_ids")
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) for t in ids):
            return web.json_response({"error": {"message": "input_ids must be a non-empty list of ints"}}, status=400)
        if self.released:
            return web.json_response({"error": {"message": "memory released; call /resume_memory_occupation"}},
                                     status=503)
        sp = body.get("sampling_params") or {}
        max_new = int(sp.get("max_new_tokens", 128))
        stops = set(sp.get("stop_token_ids") or [])
        rid = str(body.get("rid") or f"fake-{id(body)}")
        req = _Req(rid, list(ids))
        self.reqs[rid] = req
        try:
            room = body.get("bootstrap_room")
            if self.mode == "prefill":
                if room is None:
                    return web.json_response({"error": {"message": "prefill server needs bootstrap_room"}},
                                             status=400)
                self.rooms[int(room)] = kv_digest(ids)
                return web.json_response(self._payload(req, {"type": "length", "length": 0}, body))
            if self.mode == "decode":
                err = await self._pull_kv(body, ids)
                if err:
                    return web.json_response({"error": {"message": err}}, status=500)
            if body.get("stream"):
                return await self._generate_stream(request, req, body, max_new, stops)
            finish = await self._decode(req, max_new, stops)
            return web.json_response(self._payload(req, finish, body))
        finally:
            self.reqs.pop(rid, None)

    async def _pull_kv(self, body: dict[str, Any], ids: list[int]) -> str | None:
        host, port, room = body.get("bootstrap_host"), body.get("bootstrap_port"), body.get("bootstrap_room")
        if host is None or port is None or room is None:
            return "decode server needs bootstrap_host, bootstrap_port and bootstrap_room"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + KV_WAIT_S
        async with aiohttp.ClientSession() as http:
            while loop.time() < deadline:  # the prefill may not have registered the room yet
                try:
                    async with http.get(f"http://{host}:{port}/kv/{room}") as r:
                        if r.status == 200:
                            digest = (await r.json())["digest"]
                            return None if digest == kv_digest(ids) else f"KV digest mismatch for room {room}"
                except aiohttp.ClientError as exc:
                    return f"bootstrap server {host}:{port} unreachable: {exc!r}"
                await asyncio.sleep(0.005)  # the fake's bootstrap poll period
        return f"no KV for bootstrap room {room} at {host}:{port} after {KV_WAIT_S} s"

    async def kv_room(self, request: web.Request) -> web.Response:
        digest = self.rooms.pop(int(request.match_info["room"]), None)
        if digest is None:
            return web.json_response({"error": "unknown room"}, status=404)
        return web.json_response({"digest": digest})

    async def _gate(self, req: _Req) -> None:
        """Wait while generation is paused, unless the request is aborted."""
        while not self.paused.is_set() and req.aborted is None:
            waits = {asyncio.ensure_future(self.paused.wait()), asyncio.ensure_future(req.abort_ev.wait())}
            _, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for w in pending:
                w.cancel()

    async def _step(self, req: _Req) -> None:
        await self._gate(req)
        if self.token_delay_s > 0 and req.aborted is None:
            await asyncio.sleep(self.token_delay_s)
        await self._gate(req)
        if req.aborted is not None:
            return
        tok, lp = next_token(self.seed, req.input_ids + req.out)
        req.out.append(tok)
        req.lps.append(lp)

    async def _decode(self, req: _Req, max_new: int, stops: set[int]) -> dict[str, Any]:
        while True:
            if req.aborted is not None:
                return {"type": "abort", "message": req.aborted}
            if len(req.out) >= max_new:
                return {"type": "length", "length": max_new}
            await self._step(req)
            if req.aborted is not None:
                return {"type": "abort", "message": req.aborted}
            if req.out[-1] in stops:
                return {"type": "stop", "matched": req.out[-1]}

    async def _generate_stream(self, request: web.Request, req: _Req, body: dict[str, Any], max_new: int,
                               stops: set[int]) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        task = asyncio.create_task(self._decode(req, max_new, stops))
        sent = 0
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=self.token_delay_s or 0.001)
                if len(req.out) > sent and not task.done():
                    sent = len(req.out)
                    await resp.write(f"data: {json.dumps(self._payload(req, None, body))}\n\n".encode())
            finish = task.result()
            await resp.write(f"data: {json.dumps(self._payload(req, finish, body))}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        return resp

    def _payload(self, req: _Req, finish: dict[str, Any] | None, body: dict[str, Any]) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "id": req.rid, "finish_reason": finish, "prompt_tokens": len(req.input_ids),
            "completion_tokens": len(req.out), "cached_tokens": 0, "weight_version": self.weight_version,
        }
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(req.lps, req.out, strict=True)]
        return {"text": "", "output_ids": list(req.out), "meta_info": meta}

    async def abort_request(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("abort_all"):
            targets = list(self.reqs.values())
        else:
            targets = [r for rid, r in self.reqs.items() if rid == body.get("rid")]
        for r in targets:
            r.abort("Abort in waiting queue" if not r.out else "Aborted by AbortReq")
        return web.Response(text="")

    async def pause_generation(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else {}
        mode = body.get("mode", "abort")
        if mode not in ("abort", "retract", "in_place"):
            return web.json_response({"error": {"message": f"unknown pause mode {mode!r}"}}, status=400)
        self.paused.clear()  # new and (retract / in_place) running requests wait for /continue_generation
        if mode == "abort":
            for r in self.reqs.values():
                r.abort("Abort by pause_generation")
        return web.json_response({"message": "Generation paused successfully.", "success": True})

    async def continue_generation(self, _: web.Request) -> web.Response:
        self.paused.set()
        return web.json_response({"message": "Generation continued successfully.", "success": True})

    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        body = await request.json()
        path = body.get("model_path")
        if not path:
            return web.json_response({"success": False, "message": "model_path is required"}, status=400)
        self.model_path = str(path)
        self.seed = zlib.crc32(self.model_path.encode())
        if body.get("weight_version") is not None:
            self.weight_version = str(body["weight_version"])
        return web.json_response({"success": True, "message": "Succeeded to update model weights.",
                                  "num_paused_requests": 0})

    async def init_weights_update_group(self, request: web.Request) -> web.Response:
        body = await request.json()
        need = ("master_address", "master_port", "rank_offset", "world_size", "group_name")
        missing = [k for k in need if k not in body]
        if missing:
            return web.json_response({"success": False, "message": f"missing {missing}"}, status=400)
        self.groups[str(body["group_name"])] = body
        return web.json_response({"success": True, "message": "Succeeded to initialize custom process group."})

    async def update_weights_from_distributed(self, request: web.Request) -> web.Response:
        body = await request.json()
        group = str(body.get("group_name", "weight_update_group"))
        if group not in self.groups:
            return web.json_response({"success": False, "message": f"group {group} is not initialized"}, status=400)
        names, dtypes, shapes = body.get("names", []), body.get("dtypes", []), body.get("shapes", [])
        if not (len(names) == len(dtypes) == len(shapes)) or not names:
            return web.json_response({"success": False, "message": "names/dtypes/shapes must be equal-length, "
                                      "non-empty"}, status=400)
        self.seed = zlib.crc32(json.dumps([names, dtypes, shapes, body.get("weight_version")]).encode())
        if body.get("weight_version") is not None:
            self.weight_version = str(body["weight_version"])
        return web.json_response({"success": True, "message": "Succeeded to update parameter online."})

    async def release_memory(self, _: web.Request) -> web.Response:
        if not self.enable_memory_saver:
            return web.json_response({"error": {"message": "needs --enable-memory-saver"}}, status=400)
        self.released = True
        return web.Response(text="")

    async def resume_memory(self, _: web.Request) -> web.Response:
        self.released = False
        return web.Response(text="")

    async def flush_cache(self, _: web.Request) -> web.Response:
        return web.Response(text="Cache flushed.")

    async def pd_role_switch(self, request: web.Request) -> web.Response:
        if not self.enable_role_switch:
            return web.json_response({"error": {"message": "start the server with --enable-pd-role-switch"}},
                                     status=404)
        body = await request.json()
        role = body.get("new_role")
        if role not in ("prefill", "decode"):
            return web.json_response({"success": False, "message": f"bad new_role {role!r}"}, status=400)
        if self.reqs:
            return web.json_response({"success": False, "message": "instance busy; drain first"}, status=400)
        self.mode = role
        return web.json_response({"success": True, "message": f"switched to {role}"})


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m pearl.engines.sglang_fake")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--model-path", default="fake-model")
    ap.add_argument("--disaggregation-mode", default="null", choices=["null", "prefill", "decode"])
    ap.add_argument("--disaggregation-bootstrap-port", type=int, default=0)
    ap.add_argument("--enable-pd-role-switch", action="store_true")
    ap.add_argument("--token-delay-s", type=float, default=0.002)
    ap.add_argument("--weight-version", default="default")
    args, _unknown = ap.parse_known_args(argv)

    async def run() -> None:
        fake = FakeSglang(host=args.host, port=args.port, mode=args.disaggregation_mode,
                          bootstrap_port=args.disaggregation_bootstrap_port, token_delay_s=args.token_delay_s,
                          model_path=args.model_path, enable_role_switch=args.enable_pd_role_switch,
                          weight_version=args.weight_version)
        await fake.start()
        print(f"fake sglang listening on {args.host}:{fake.port} mode={fake.mode}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(run())


if __name__ == "__main__":
    main()
