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

Wire details reproduced (each pinned by ``tests/contract`` against SGLang's own app): ``/generate``
non-streaming returns ``{text, output_ids, meta_info}``; streaming (``stream: true``) sends SSE
``data: {...}`` events, cumulative by default and only the new tokens and logprobs with
``--incremental-streaming-output`` (``meta_info.completion_tokens`` counts all), then
``data: [DONE]``. ``output_token_logprobs`` entries are ``[logprob, token_id, null]``. An aborted
running request decodes one more token before the abort applies (so its last token may be a stop
token) and ends with ``finish_reason {"type": "abort", "message", "status_code"}``; a waiting or
retracted one (``/pause_generation {mode: retract}``) is echoed, in incremental mode repeating the
last token with every logprob. A decode server whose KV never arrives aborts with ``status_code``
500 inside an HTTP 200 stream. Refusals: a prompt of ``--context-length`` tokens or more is an
error event with ``code`` 400; one of ``--max-total-tokens`` or more an abort with ``status_code``
400 that still carries one token; a request that finds ``--max-queued-requests`` others an abort
with 503 and no output. An error inside a stream is a ``data: {"error": {...}}`` event followed by
``[DONE]``. While paused (``/pause_generation``) a new ``/generate`` waits, as SGLang's tokenizer
does; a release does not pause (a request reaching a released server is refused with 500 here:
SGLang would run it on freed memory), and without ``--enable-weights-cpu-backup`` it loses the
weights (outputs change until a load). ``/update_weights_from_distributed`` is refused outside a
``/begin_weight_update`` ... ``/end_weight_update`` session. ``/abort_request {rid}`` matches the
exact rid (SGLang's tokenizer drops an unknown one). ``/health`` runs a generation (SGLang waits
for it: the fake waits ``health_delay_s``); ``/ping`` is the flag check. ``/model_info`` reports
``weight_version``.
``/pd_role_switch`` needs ``--enable-pd-role-switch``, a transfer backend whose KV manager supports
it (mooncake, mori), an idle server, and for a switch to decode ``decode_cuda_graph_memory_gb``;
otherwise it answers 400 ``{success: false, message, safe_to_restore: true}``.
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
    retracted: bool = False  # paused with mode retract: back in the waiting queue
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
    transfer_backend: str = "mooncake"
    incremental: bool = False
    health_delay_s: float = 1.0
    #: refuses every role switch as SGLang does after a failed one (``_pd_role_switch_unhealthy``)
    role_switch_unhealthy: bool = False
    weight_version: str = "default"
    #: ``--enable-weights-cpu-backup``: a release keeps the weights; without it they are lost
    weights_cpu_backup: bool = False
    #: ``--context-length`` (0: none): a longer prompt is refused by the tokenizer (an error event)
    context_length: int = 0
    #: ``--max-total-tokens`` (0: none): a prompt this long is refused by the scheduler (an abort
    #: with status 400 that still carries one sampled token)
    max_total_tokens: int = 0
    #: ``--max-queued-requests`` (0: none): a request that finds this many others is refused with 503
    max_queued_requests: int = 0
    session: bool = False  # a weight-update session is open (``/begin_weight_update``)
    seed: int = 0
    paused: asyncio.Event = field(default_factory=asyncio.Event)  # set = generation may run
    resumed: asyncio.Event = field(default_factory=asyncio.Event)  # set on continue / resume memory
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
        r.add_post("/begin_weight_update", self.begin_weight_update)
        r.add_post("/end_weight_update", self.end_weight_update)
        r.add_post("/release_memory_occupation", self.release_memory)
        r.add_post("/resume_memory_occupation", self.resume_memory)
        r.add_post("/flush_cache", self.flush_cache)
        r.add_post("/pd_role_switch", self.pd_role_switch)
        r.add_get("/health", self.health)
        r.add_get("/ping", self.ping)
        r.add_get("/server_info", self.server_info)
        r.add_get("/model_info", self.model_info)
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
        """SGLang's ``/health`` generates one token and looks for an answer after 1 s; a paused or
        released server never answers within its wait."""
        await asyncio.sleep(self.health_delay_s)
        if not self.paused.is_set() or self.released:
            return web.Response(status=503)
        return web.Response(text="")

    async def ping(self, _: web.Request) -> web.Response:
        return web.Response(text="")

    async def server_info(self, _: web.Request) -> web.Response:
        return web.json_response({"model_path": self.model_path, "disaggregation_mode": self.mode,
                                  "disaggregation_bootstrap_port": self.bootstrap_port,
                                  "weight_version": self.weight_version, "version": "0.5.23-fake"})

    async def model_info(self, _: web.Request) -> web.Response:
        return web.json_response({"model_path": self.model_path, "weight_version": self.weight_version,
                                  "disaggregation_mode": self.mode, "is_generation": True})

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        ids = body.get("input_ids")
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) for t in ids):
            return web.json_response({"error": {"message": "input_ids must be a non-empty list of ints"}}, status=400)
        if self.context_length and len(ids) >= self.context_length:
            error = {"message": f"The input ({len(ids)} tokens) is longer than the model's context length "
                     f"({self.context_length} tokens).", "type": "invalid_request_error", "code": 400,
                     "retryable": False}
            if body.get("stream"):
                return await self._send_events(request, [{"error": error}])
            return web.json_response({"error": error}, status=400)
        while not self.paused.is_set():  # SGLang's tokenizer waits on its pause condition
            self.resumed.clear()
            await self.resumed.wait()
        sp = body.get("sampling_params") or {}
        max_new = int(sp.get("max_new_tokens", 128))
        stops = set(sp.get("stop_token_ids") or [])
        rid = str(body.get("rid") or f"fake-{id(body)}")
        req = _Req(rid, list(ids))
        refusal = self._refusal(req)
        if refusal is not None:
            if body.get("stream"):
                return await self._send_events(request, [self._payload(req, refusal, body)])
            return web.json_response(self._payload(req, refusal, body))
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
                    finish = {"type": "abort", "message": err, "status_code": 500, "err_type": None}
                    if body.get("stream"):
                        return await self._send_events(request, [self._payload(req, finish, body)])
                    return web.json_response(self._payload(req, finish, body))
            if body.get("stream"):
                return await self._generate_stream(request, req, body, max_new, stops)
            finish = await self._decode(req, max_new, stops)
            return web.json_response(self._payload(req, finish, body))
        finally:
            self.reqs.pop(rid, None)

    def _refusal(self, req: _Req) -> dict[str, Any] | None:
        """The scheduler's refusals: a prompt past ``max_total_tokens`` (``validate_input_length`` ->
        ``set_finish_with_abort``: status 400, and the refused request, run on the input ``[0]``,
        still samples one token, without logprobs) or a full queue (``_abort_on_queued_limit``:
        503, no output). A released server has no weights to run on: the fake refuses with 500."""
        if self.released:
            return {"type": "abort", "message": "fake: generate on a released server (SGLang would run it on "
                    "freed memory)", "status_code": 500, "err_type": "InternalServerError"}
        if self.max_total_tokens and len(req.input_ids) >= self.max_total_tokens:
            req.out.append(next_token(self.seed, [0])[0])
            return {"type": "abort", "message": f"Input length ({len(req.input_ids)} tokens) exceeds the maximum "
                    f"allowed length ({self.max_total_tokens} tokens). Use a shorter input or enable "
                    "--allow-auto-truncate.", "status_code": 400, "err_type": "BadRequestError"}
        if self.max_queued_requests and len(self.reqs) >= self.max_queued_requests:
            return {"type": "abort", "message": "The request queue is full.", "status_code": 503, "err_type": None}
        return None

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

    def _sample(self, req: _Req) -> None:
        tok, lp = next_token(self.seed, req.input_ids + req.out)
        req.out.append(tok)
        req.lps.append(lp)

    async def _step(self, req: _Req) -> None:
        await self._gate(req)
        if self.token_delay_s > 0 and req.aborted is None:
            await asyncio.sleep(self.token_delay_s)
        await self._gate(req)
        if req.aborted is None:
            self._sample(req)

    def _running(self, req: _Req) -> bool:
        """In the running batch (not waiting, not retracted): an abort lets it run one more step."""
        return bool(req.out) and not req.retracted

    async def _decode(self, req: _Req, max_new: int, stops: set[int]) -> dict[str, Any]:
        while True:
            if req.aborted is None:
                await self._step(req)
            if req.aborted is not None:
                # a running request's abort is applied after one more decode step and before the
                # stop check (``Req.update_finish_state``): its last token may be a stop token
                if self._running(req):
                    self._sample(req)
                return {"type": "abort", "message": req.aborted, "status_code": None, "err_type": None}
            if req.out[-1] in stops:
                return {"type": "stop", "matched": req.out[-1]}
            if len(req.out) >= max_new:
                return {"type": "length", "length": max_new}

    async def _send_events(self, request: web.Request, events: list[dict[str, Any]]) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for ev in events:
            await resp.write(f"data: {json.dumps(ev)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

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
                    await resp.write(f"data: {json.dumps(self._payload(req, None, body, sent))}\n\n".encode())
                    sent = len(req.out)
            finish = task.result()
            if finish["type"] == "abort" and self.incremental and not self._running(req):
                # a waiting or retracted request's abort echo (``_handle_abort_req``) repeats the last
                # token and carries every logprob
                last = self._payload(req, finish, body, max(len(req.out) - 1, 0))
                if body.get("return_logprob"):
                    last["meta_info"]["output_token_logprobs"] = self._payload(req, finish, body)["meta_info"][
                        "output_token_logprobs"]
            else:
                last = self._payload(req, finish, body, sent)
            await resp.write(f"data: {json.dumps(last)}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        return resp

    def _payload(self, req: _Req, finish: dict[str, Any] | None, body: dict[str, Any],
                 sent: int = 0) -> dict[str, Any]:
        """One reply or event; an incremental stream event carries the tokens from ``sent`` on."""
        start = sent if self.incremental and body.get("stream") else 0
        meta: dict[str, Any] = {
            "id": req.rid, "finish_reason": finish, "prompt_tokens": len(req.input_ids),
            "completion_tokens": len(req.out), "cached_tokens": 0, "weight_version": self.weight_version,
        }
        if body.get("return_logprob"):  # a refused request's token has no logprob (``return_logprob`` off)
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(req.lps[start:], req.out[start:],
                                                                             strict=False)]
        return {"text": "", "output_ids": list(req.out[start:]), "meta_info": meta}

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
        if mode == "retract":
            for r in self.reqs.values():
                r.retracted = bool(r.out)
        if mode == "abort":
            for r in self.reqs.values():
                r.abort("Abort by pause_generation")
        return web.json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(self, _: web.Request) -> web.Response:
        for r in self.reqs.values():
            r.retracted = False
        self.paused.set()
        self.resumed.set()
        return web.json_response({"message": "Generation continued successfully.", "status": "ok"})

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

    async def begin_weight_update(self, _: web.Request) -> web.Response:
        if self.session:
            return web.json_response({"success": False, "message": "a weight-update session is already open; "
                                      "call end_weight_update() first"}, status=400)
        self.session = True
        return web.json_response({"success": True, "message": "Success"})

    async def end_weight_update(self, _: web.Request) -> web.Response:
        if not self.session:
            return web.json_response({"success": False, "message": "no weight-update session is open; call "
                                      "begin_weight_update() first"}, status=400)
        self.session = False
        return web.json_response({"success": True, "message": "Success"})

    async def update_weights_from_distributed(self, request: web.Request) -> web.Response:
        body = await request.json()
        if not self.session:
            return web.json_response({"success": False, "message": "update_weights_from_distributed must run "
                                      "between begin_weight_update() and end_weight_update()"}, status=400)
        group = str(body.get("group_name", "weight_update_group"))
        if group not in self.groups:
            return web.json_response({"success": False, "message": f"Failed to receive weights: Group {group} not "
                                      f"in {sorted(self.groups)}. Please call `init_weights_update_group` first."},
                                     status=400)
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
        if not self.weights_cpu_backup:  # only buffers survive: the parameters come back as garbage
            self.seed = zlib.crc32(f"released|{self.seed}".encode())
        return web.Response(text="")

    async def resume_memory(self, _: web.Request) -> web.Response:
        self.released = False
        self.resumed.set()
        return web.Response(text="")

    async def flush_cache(self, _: web.Request) -> web.Response:
        return web.Response(text="Cache flushed.")

    async def pd_role_switch(self, request: web.Request) -> web.Response:
        body = await request.json()
        role = body.get("new_role")

        def refuse(message: str) -> web.Response:
            return web.json_response({"success": False, "message": message, "old_role": self.mode,
                                      "new_role": role, "safe_to_restore": True}, status=400)
        if not self.enable_role_switch:
            return refuse("--enable-pd-role-switch is not set on this instance")
        if self.role_switch_unhealthy:
            return web.json_response({"success": False, "message": "instance is unhealthy after a failed role "
                                      "switch; restart required", "old_role": self.mode, "new_role": role,
                                      "safe_to_restore": False}, status=400)
        if role not in ("prefill", "decode"):
            return refuse(f"invalid new_role={role!r}")
        if self.mode == "null":
            return refuse("instance is not running in PD disaggregation mode")
        if self.transfer_backend not in ("mooncake", "mori"):
            return refuse(f"transfer backend {self.transfer_backend!r} does not support runtime role switch")
        if role == self.mode:
            return web.json_response({"success": True, "message": "already in target role", "old_role": role,
                                      "new_role": role, "safe_to_restore": False})
        if self.reqs:
            return refuse("instance is not idle; drain all requests before switching")
        if role == "decode" and body.get("decode_cuda_graph_memory_gb") is None:
            return refuse("decode_cuda_graph_memory_gb is required before capturing decode graphs")
        old, self.mode = self.mode, role
        return web.json_response({"success": True, "message": "ok", "old_role": old, "new_role": role,
                                  "safe_to_restore": False})


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
    ap.add_argument("--disaggregation-transfer-backend", default="mooncake")
    ap.add_argument("--incremental-streaming-output", action="store_true")
    ap.add_argument("--health-delay-s", type=float, default=1.0)
    ap.add_argument("--role-switch-unhealthy", action="store_true")
    ap.add_argument("--enable-memory-saver", action="store_true")
    ap.add_argument("--enable-weights-cpu-backup", action="store_true")
    ap.add_argument("--context-length", type=int, default=0)
    ap.add_argument("--max-total-tokens", type=int, default=0)
    ap.add_argument("--max-queued-requests", type=int, default=0)
    args, _unknown = ap.parse_known_args(argv)

    async def run() -> None:
        fake = FakeSglang(host=args.host, port=args.port, mode=args.disaggregation_mode,
                          bootstrap_port=args.disaggregation_bootstrap_port, token_delay_s=args.token_delay_s,
                          model_path=args.model_path, enable_role_switch=args.enable_pd_role_switch,
                          weight_version=args.weight_version, transfer_backend=args.disaggregation_transfer_backend,
                          incremental=args.incremental_streaming_output, health_delay_s=args.health_delay_s,
                          role_switch_unhealthy=args.role_switch_unhealthy,
                          enable_memory_saver=args.enable_memory_saver,
                          weights_cpu_backup=args.enable_weights_cpu_backup, context_length=args.context_length,
                          max_total_tokens=args.max_total_tokens, max_queued_requests=args.max_queued_requests)
        await fake.start()
        print(f"fake sglang listening on {args.host}:{fake.port} mode={fake.mode}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(run())


if __name__ == "__main__":
    main()
