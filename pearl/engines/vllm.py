"""``VllmEngine``: the ``InferenceEngine`` contract over real vLLM servers (CPU here, GPUs alike).

Life cycle: ``engine = VllmEngine(run_dir, settings)``; ``await engine.launch(spec)`` per worker
(child process, see ``vllm_server``); requests through ``generate`` / ``generate_pd``; weights
through ``load_weights`` (disk) or ``broadcast_weights`` (gloo); ``await engine.close()`` stops every
server. Server logs are ``<run_dir>/logs/<worker_id>-<ms>.log``.

Requests are streamed from ``POST /v1/completions`` with token-id prompts (``return_token_ids``,
``logprobs: 0``): tokens received before an abort, a stop or a server death are kept, so an
interrupted request returns (or its error carries) a partial ``GenerateResult`` that
``pearl.engines.resume`` continues elsewhere. Each stream races the server's death event, so a
killed server raises ``EngineDeadError`` at once instead of hanging.

Disaggregation (``generate_pd``) follows vLLM's NixlConnector protocol: the prefill server gets
the prompt with ``max_tokens: 1`` and ``kv_transfer_params: {do_remote_decode: true}``; its reply's
``kv_transfer_params`` (engine id, block ids, host, port) go to the decode server with the full
request, which pulls the KV over NIXL and generates every output token (the prefill's own sampled
token is discarded, so PD output equals colocated output at temperature 0).

Telemetry per request (``RequestTimings``), measured from the client side:
``prefill_s`` = time to the first streamed token (colocated; includes queueing, so ``queue_s`` = 0)
or the prefill request's duration (PD); ``transfer_s`` = decode request start -> its first token
minus one decode step (PD only; the KV pull and the first step are not separable from outside, so
one mean inter-token time is subtracted); ``decode_s`` = first token -> last token;
``decode_concurrency`` = mean in-flight requests on the decoding server, sampled at each token.

Role change: with ``kv_mode="per_role"`` (default) colocated servers run without a connector,
prefill servers as ``kv_producer`` and decode servers as ``kv_consumer``; ``set_role`` relaunches
the server (cost = stop + start, measured in ``last_role_change_s``). With ``kv_mode="both"`` every
server is launched ``kv_both`` and ``set_role`` is bookkeeping only (vLLM decides per request from
``kv_transfer_params``); vLLM marks ``kv_both`` deprecated for NixlConnector, hence not the default.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import aiohttp

from pearl.core.state import Role
from pearl.core.trajectory import MISSING_LOGPROB
from pearl.dtypes import dtype_on_this_host
from pearl.engines.base import (
    EngineCapabilities,
    EngineDeadError,
    EngineError,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    KVTransferError,
    PauseMode,
    RequestTimings,
    ServerSpec,
)
from pearl.engines.child_server import race_death
from pearl.engines.http_engine import HttpEngine, StreamState
from pearl.engines.vllm_broadcast import GlooBroadcaster, bucketize
from pearl.engines.vllm_server import SERVED_MODEL_NAME, VllmServer, VllmSettings

KvMode = Literal["per_role", "both"]
CONTROL_TIMEOUT_S = 120.0


def kv_role_for(role: Role, kv_mode: KvMode) -> str | None:
    if kv_mode == "both":
        return "kv_both"
    return {Role.COLOCATED: None, Role.PREFILL: "kv_producer", Role.DECODE: "kv_consumer"}[role]


@dataclass
class _Stream(StreamState):
    """A completion stream so far, with the prefill reply's ``kv_transfer_params`` (PD)."""

    kv_params: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class BroadcastTiming:
    connect_s: float
    transfer_s: float
    bytes: int


class VllmEngine(HttpEngine[VllmServer, VllmSettings]):
    """Real vLLM servers as child processes; see the module docstring."""

    def __init__(self, run_dir: str | Path, settings: VllmSettings | None = None, kv_mode: KvMode = "per_role"):
        super().__init__(run_dir, settings or VllmSettings())
        self.kv_mode: KvMode = kv_mode

    @property
    def capabilities(self) -> EngineCapabilities:
        """PD halves across nodes (NIXL), the gloo weight broadcast, vLLM's three pause modes; a role
        change is in place only with ``kv_mode="both"`` (``per_role`` relaunches)."""
        return EngineCapabilities(split_pd=True, in_place_role_switch=self.kv_mode == "both", weight_broadcast=True,
                                  pause_modes=frozenset({PauseMode.KEEP, PauseMode.ABORT, PauseMode.WAIT}))

    @staticmethod
    def from_config(spec: Any, run_dir: str | Path, kv_mode: KvMode = "per_role") -> VllmEngine:
        """From ``pearl.config.EngineSpec`` (max_model_len, kv_cache_gib, threads_per_server,
        start_timeout_s, request_timeout_s, nice, extra_args, nixl_progress_delay_us, dtype: ``auto``
        resolved by ``pearl.dtypes.choose_dtype`` on this host)."""
        return VllmEngine(run_dir, VllmSettings(
            max_model_len=spec.max_model_len, kv_cache_gib=spec.kv_cache_gib,
            threads_per_server=spec.threads_per_server, start_timeout_s=spec.start_timeout_s, nice=spec.nice,
            request_timeout_s=spec.request_timeout_s, extra_args=tuple(spec.extra_args),
            nixl_progress_delay_us=spec.nixl_progress_delay_us, dtype=dtype_on_this_host(getattr(spec, "dtype", "auto"))), kv_mode)

    # ------------------------------------------------------------------------------ servers
    async def launch(self, spec: ServerSpec) -> None:
        srv = VllmServer(spec=spec, log_dir=self.run_dir / "logs", start_timeout_s=self.settings.start_timeout_s,
                         nice=self.settings.nice, weight_version=spec.weight_version, settings=self.settings,
                         kv_role=kv_role_for(spec.role, self.kv_mode))
        await self._start(srv)
        await self._post(srv, "/update_weight_version", {"new_version": str(spec.weight_version)})

    def ready_seconds(self, worker_id: str) -> float:
        """Start-to-ready wall time of the worker's current server process."""
        return self.server(worker_id).ready_s

    # ------------------------------------------------------------------------------ control
    async def _post(self, srv: VllmServer, path: str, body: Mapping[str, Any] | None = None,
                    params: Mapping[str, str] | None = None) -> Any:
        """A control call that fails fast with ``EngineDeadError`` if the server dies meanwhile."""
        text = await self._fetch(srv, "POST", path, CONTROL_TIMEOUT_S, dict(body or {}), params)
        return json.loads(text) if text.strip() else None

    async def abort(self, worker_id: str, rid: str | None = None) -> None:
        srv = self._alive(worker_id)
        ids = [] if rid is None else [f"cmpl-{rid}-0", f"cmpl-{rid}"]
        await self._post(srv, "/abort_requests", {"request_ids": ids})

    async def pause(self, worker_id: str, mode: PauseMode = PauseMode.KEEP) -> None:
        """``keep``: freeze in-flight requests until ``resume``; ``abort``: end them (partial outputs
        return with ``finish_reason=abort``); ``wait``: let them finish first."""
        m = self.capabilities.check_pause(worker_id, mode)
        await self._post(self._alive(worker_id), "/pause", params={"mode": m.value})

    async def resume(self, worker_id: str) -> None:
        await self._post(self._alive(worker_id), "/resume")

    async def release_memory(self, worker_id: str) -> None:
        """vLLM's ``/sleep``; on CPU it frees nothing (ENGINES.md), on GPUs it needs
        ``--enable-sleep-mode`` in ``extra_args``. In-flight requests are aborted first."""
        srv = self._alive(worker_id)
        await self._post(srv, "/pause", params={"mode": "abort"})
        await self._post(srv, "/sleep", params={"level": "1"})

    async def resume_memory(self, worker_id: str) -> None:
        srv = self._alive(worker_id)
        await self._post(srv, "/wake_up")
        await self._post(srv, "/resume")

    # ------------------------------------------------------------------------------ weights
    async def weight_version(self, worker_id: str) -> int:
        """The version the server itself reports (``GET /weight_info``)."""
        srv = self._alive(worker_id)

        async def call() -> int:
            async with self._session().get(f"{srv.url}/weight_info",
                                           timeout=aiohttp.ClientTimeout(total=CONTROL_TIMEOUT_S)) as r:
                return int((await r.json())["weight_version"])
        return int(await race_death(srv, call(), "GET /weight_info"))

    async def load_weights(self, worker_id: str, path: str, version: int) -> None:
        """Pause (aborting in-flight requests: they return partial with the old version), reload
        ``path`` in place, set the reported version, resume."""
        srv = self._alive(worker_id)
        if not (Path(path) / "config.json").is_file():
            raise EngineError(worker_id, f"snapshot folder {path} has no config.json")
        await self._post(srv, "/pause", params={"mode": "abort"})
        try:
            await self._post(srv, "/collective_rpc", {"method": "reload_weights",
                                                      "kwargs": {"weights_path": str(path)}})
            await self._post(srv, "/update_weight_version", {"new_version": str(version)})
            srv.weight_version = version
        finally:
            if srv.alive:
                await self._post(srv, "/resume")

    async def broadcast_weights(self, worker_ids: Sequence[str], state: Mapping[str, Any], version: int,
                                host: str = "127.0.0.1") -> BroadcastTiming:
        """Send ``state`` (name -> tensor, checkpoint names) from this process to every worker over a
        fresh gloo group (this process is rank 0), apply it, and set ``version``. In-flight requests
        are aborted first, as in ``load_weights``."""
        servers = [self._alive(w) for w in worker_ids]
        layout, flats = bucketize(state)
        b = GlooBroadcaster(host, world_size=len(servers) + 1)
        await asyncio.gather(*(self._post(s, "/pause", params={"mode": "abort"}) for s in servers))
        try:
            t0 = time.perf_counter()
            joins = [self._post(s, "/collective_rpc", {"method": "pearl_join_group", "kwargs": {
                "host": host, "port": b.port, "rank": i + 1, "world_size": len(servers) + 1}})
                for i, s in enumerate(servers)]
            await asyncio.gather(asyncio.to_thread(b.connect), *joins)
            t1 = time.perf_counter()
            recvs = [self._post(s, "/collective_rpc", {"method": "pearl_receive", "kwargs": {"layout": layout}})
                     for s in servers]
            await asyncio.gather(asyncio.to_thread(b.send, flats), *recvs)
            t2 = time.perf_counter()
            for s in servers:
                await self._post(s, "/collective_rpc", {"method": "pearl_leave_group"})
                await self._post(s, "/update_weight_version", {"new_version": str(version)})
                s.weight_version = version
        finally:
            b.close()
            await asyncio.gather(*(self._post(s, "/resume") for s in servers if s.alive),
                                 return_exceptions=True)
        nbytes = sum(int(f.numel()) * int(f.element_size()) for f in flats)
        return BroadcastTiming(connect_s=t1 - t0, transfer_s=t2 - t1, bytes=nbytes)

    # ------------------------------------------------------------------------------ roles
    async def set_role(self, worker_id: str, role: Role) -> None:
        """``kv_mode="both"``: bookkeeping only. ``per_role``: relaunch with the role's KV role
        (in-flight requests end with ``finish_reason=abort``); the cost is in ``last_role_change_s``."""
        srv = self.server(worker_id)
        t0 = time.monotonic()
        if srv.spec.role == role:
            return
        if self.kv_mode == "both" or kv_role_for(role, self.kv_mode) == srv.kv_role:
            srv.spec = replace(srv.spec, role=role)
        else:
            await srv.stop()
            spec = replace(srv.spec, role=role, weights=srv.spec.weights, weight_version=srv.weight_version)
            await self.launch(spec)
        self.last_role_change_s = time.monotonic() - t0

    # ------------------------------------------------------------------------------ generation
    def _body(self, req: GenerateRequest, max_tokens: int, kv_params: dict[str, Any] | None,
              rid: str = "") -> dict[str, Any]:
        """The completion body; ``rid`` overrides the request's wire id (the prefill half's ``<rid>.p``)."""
        s = req.sampling
        body: dict[str, Any] = {
            "model": SERVED_MODEL_NAME, "prompt": list(req.input_ids), "max_tokens": max_tokens,
            "temperature": s.temperature, "top_p": s.top_p, "stream": True,
            "stream_options": {"include_usage": True}, "return_token_ids": True, "request_id": rid or req.rid,
            "skip_special_tokens": False, "include_stop_str_in_output": True,
        }
        if req.return_logprobs:
            body["logprobs"] = 0
        if s.stop_token_ids:
            body["stop_token_ids"] = list(s.stop_token_ids)
        if s.seed is not None:
            body["seed"] = s.seed
        if kv_params is not None:
            body["kv_transfer_params"] = kv_params
        return body

    async def _stream(self, srv: VllmServer, body: dict[str, Any], st: _Stream) -> None:
        """Read the SSE stream of one completion into ``st`` (kept as it grows). A non-streaming
        body (the PD prefill: vLLM returns ``kv_transfer_params`` only in a full response) is read
        in one piece."""
        def event(msg: dict[str, Any]) -> None:
            if "error" in msg:
                raise EngineError(srv.spec.worker_id, f"stream error: {msg['error']}")
            self._absorb(srv, msg, st)
        await self._post_stream(srv, "/v1/completions", body, lambda msg: self._absorb(srv, msg, st), event)

    @staticmethod
    def _absorb(srv: VllmServer, msg: dict[str, Any], st: _Stream) -> None:
        if msg.get("kv_transfer_params"):
            st.kv_params = msg["kv_transfer_params"]
        usage = msg.get("usage")
        if usage:
            st.prompt_tokens = int(usage.get("prompt_tokens") or st.prompt_tokens)
            details = usage.get("prompt_tokens_details") or {}
            st.cached_tokens = int(details.get("cached_tokens") or 0)
        for ch in msg.get("choices", []):
            if ch.get("prompt_token_ids"):
                st.prompt_tokens = len(ch["prompt_token_ids"])
            ids = ch.get("token_ids") or []
            if ids:
                st.arrived(srv.inflight)
                st.tokens.extend(int(t) for t in ids)
                lp = (ch.get("logprobs") or {}).get("token_logprobs") or []
                st.logprobs.extend(float(x) if x is not None else MISSING_LOGPROB for x in lp)
                st.grew.set()
            if ch.get("finish_reason"):
                st.finish = ch["finish_reason"]

    async def _run(self, srv: VllmServer, body: dict[str, Any], st: _Stream) -> bool:
        """Stream into ``st``; True if the stream ended normally, False if the engine was stopped.

        Raises ``EngineDeadError`` (with nothing in ``partial``; callers attach it) on death and
        ``EngineError`` on other failures. Cancellation aborts the remote request first."""
        def abort() -> Awaitable[Any]:
            return self._post(srv, "/abort_requests", {"request_ids": [f"cmpl-{body['request_id']}-0"]})
        return await self._follow(srv, str(body["request_id"]), st, self._stream(srv, body, st), abort)

    def streaming(self, rid: str) -> bool:
        """Whether request ``rid``'s stream is open (started and not ended)."""
        return rid in self._live

    def _result(self, req: GenerateRequest, st: _Stream, srv: VllmServer, timings: RequestTimings,
                prefill_id: str = "") -> GenerateResult:
        finish = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH}.get(st.finish or "", FinishReason.ABORT)
        return GenerateResult(
            rid=req.rid, output_ids=tuple(st.tokens), logprobs=st.output_logprobs(), finish_reason=finish,
            weight_version=srv.weight_version, prompt_tokens=st.prompt_tokens or len(req.input_ids),
            cached_tokens=st.cached_tokens, timings=timings, worker_id=prefill_id or srv.spec.worker_id,
            decode_worker_id=srv.spec.worker_id)

    async def generate(self, worker_id: str, req: GenerateRequest) -> GenerateResult:
        srv = self._alive(worker_id)
        if req.sampling.max_new_tokens < 1:
            raise EngineError(worker_id, f"request {req.rid}: max_new_tokens must be >= 1")
        st = _Stream()
        version = srv.weight_version
        t0 = time.perf_counter()
        try:
            await self._run(srv, self._body(req, req.sampling.max_new_tokens, None), st)
        except EngineDeadError as exc:
            exc.partial = replace(self._result(req, st, srv, RequestTimings()), weight_version=version,
                                  finish_reason=FinishReason.ABORT)
            raise
        decode_s, _ = st.decode_timings()
        prefill_s = (st.t_first - t0) if st.t_first is not None else time.perf_counter() - t0
        timings = RequestTimings(prefill_s=prefill_s, decode_s=decode_s, decode_concurrency=st.concurrency())
        res = self._result(req, st, srv, timings)
        return res if res.finish_reason is not FinishReason.ABORT else replace(res, weight_version=version)

    async def generate_pd(self, prefill_id: str, decode_id: str, req: GenerateRequest) -> GenerateResult:
        p, d = self._alive(prefill_id), self._alive(decode_id)
        if req.sampling.max_new_tokens < 1:
            raise EngineError(decode_id, f"request {req.rid}: max_new_tokens must be >= 1")
        empty = replace(self._result(req, _Stream(), d, RequestTimings(), prefill_id), finish_reason=FinishReason.ABORT)
        try:
            handle = await self.pd_prefill(p.spec.worker_id, req)
        except (EngineDeadError, KVTransferError) as exc:
            exc.partial = empty
            raise
        if handle is None:
            return empty  # the prefill was aborted: nothing generated yet
        return await self.pd_decode(decode_id, req, handle, prefill_id)

    async def pd_prefill(self, prefill_id: str, req: GenerateRequest) -> dict[str, Any] | None:
        """The prefill half of ``generate_pd``: ``{"kv_transfer_params", "prefill_s"}`` for
        ``pd_decode`` on any decode server that reaches this one over NIXL (another node's too: the
        node agents run the halves of a cross-node pair, ``pearl.runtime.node.agent``), or None if
        the prefill was aborted (nothing generated). Errors carry no partial (the caller's pair
        knows the decode side)."""
        p = self._alive(prefill_id)
        if req.sampling.max_new_tokens < 1:
            raise EngineError(prefill_id, f"request {req.rid}: max_new_tokens must be >= 1")
        pst = _Stream()
        t0 = time.perf_counter()
        pbody = self._body(replace(req, return_logprobs=False), 1,
                           {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                            "remote_block_ids": None, "remote_host": None, "remote_port": None}, rid=f"{req.rid}.p")
        pbody["stream"] = False
        del pbody["stream_options"]
        normal = await self._run(p, pbody, pst)
        if not normal or pst.finish not in ("stop", "length"):
            return None
        if not pst.kv_params:
            raise KVTransferError(prefill_id, f"request {req.rid}: prefill server returned no kv_transfer_params; "
                                  "is it launched with the NixlConnector (role prefill)?")
        return {"kv_transfer_params": pst.kv_params, "prefill_s": time.perf_counter() - t0}

    async def pd_decode(self, decode_id: str, req: GenerateRequest, handle: Mapping[str, Any],
                        prefill_id: str = "") -> GenerateResult:
        """The decode half: the full request with the prefill's ``kv_transfer_params``; the decode
        server pulls the KV over NIXL and generates every output token."""
        d = self._alive(decode_id)
        t1 = time.perf_counter()
        st = _Stream()
        version = d.weight_version
        try:
            await self._run(d, self._body(req, req.sampling.max_new_tokens, dict(handle["kv_transfer_params"])), st)
        except EngineDeadError as exc:
            exc.partial = replace(self._result(req, st, d, RequestTimings(), prefill_id), weight_version=version,
                                  finish_reason=FinishReason.ABORT)
            raise
        decode_s, step_s = st.decode_timings()
        first = (st.t_first - t1) if st.t_first is not None else time.perf_counter() - t1
        timings = RequestTimings(prefill_s=float(handle.get("prefill_s", 0.0)), transfer_s=max(first - step_s, 0.0),
                                 decode_s=decode_s, decode_concurrency=st.concurrency())
        res = self._result(req, st, d, timings, prefill_id)
        if res.finish_reason is FinishReason.ABORT:
            res = replace(res, weight_version=version)
        return res
