"""``SglangEngine``: the ``InferenceEngine`` contract over SGLang's HTTP API (the GPU engine).

Life cycle: ``engine = SglangEngine(run_dir, settings)``; ``await engine.launch(spec)`` spawns
``python -m sglang.launch_server`` (``settings.module``; tests point it at
``pearl.engines.sglang_fake``) on the spec's GPUs (``CUDA_VISIBLE_DEVICES``, ``--tp-size`` = number
of GPUs) and polls ``/health``; ``await engine.close()`` stops every server. Logs go to
``<run_dir>/logs``. Routes used (``sglang/srt/entrypoints/http_server.py``):

- ``POST /generate {input_ids, sampling_params{max_new_tokens, temperature, top_p, stop_token_ids},
  return_logprob, rid, stream}``; PD adds ``bootstrap_host, bootstrap_port, bootstrap_room`` and the
  same request goes to the prefill and the decode server concurrently (what ``sglang-router`` does);
  the decode server pulls the KV through the transfer backend (``mooncake`` / ``nixl``). A pair
  across nodes runs as two halves through the node agents: ``pd_prefill`` (the prefill request in
  the background; the handle is the bootstrap address and room) and ``pd_decode`` (with it).
  The stream's ``output_ids`` and ``meta_info.output_token_logprobs`` (``[logprob, id, text]``) are
  cumulative; a partial output survives an abort (``finish_reason.type == "abort"``) or a death.
- ``/abort_request {rid | abort_all}``, ``/pause_generation {mode: abort|retract|in_place}``,
  ``/continue_generation``, ``/update_weights_from_disk {model_path, weight_version}``,
  ``/init_weights_update_group`` + ``/update_weights_from_distributed {names, dtypes, shapes,
  group_name, weight_version}`` (the trainer runs rank 0 of that NCCL group),
  ``/release_memory_occupation`` / ``/resume_memory_occupation`` (``--enable-memory-saver``),
  ``/pd_role_switch {new_role}`` (``--enable-pd-role-switch``), ``GET /get_weight_version``.

Role change: prefill <-> decode in place through ``/pd_role_switch`` when
``settings.enable_pd_role_switch``; anything involving the colocated mode (``--disaggregation-mode
null``) relaunches the server. Telemetry is measured client-side as in ``pearl.engines.vllm``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import sys
import time
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import aiohttp

from pearl.core.state import Role
from pearl.core.trajectory import MISSING_LOGPROB
from pearl.engines.base import (
    EngineDeadError,
    EngineError,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    KVTransferError,
    RequestTimings,
    ServerSpec,
)
from pearl.engines.http_engine import HttpEngine, StreamState
from pearl.engines.vllm_broadcast import free_port
from pearl.engines.vllm_server import ChildServer

log = logging.getLogger("pearl.engines.sglang")
CONTROL_TIMEOUT_S = 300.0
MODE_OF_ROLE = {Role.COLOCATED: "null", Role.PREFILL: "prefill", Role.DECODE: "decode"}


@dataclass(frozen=True, slots=True)
class SglangSettings:
    python: str = sys.executable
    module: str = "sglang.launch_server"
    transfer_backend: Literal["mooncake", "nixl", "fake"] = "nixl"
    mem_fraction_static: float = 0.8
    enable_memory_saver: bool = True
    enable_pd_role_switch: bool = False
    start_timeout_s: float = 600.0
    request_timeout_s: float = 600.0
    #: a cross-node prefill half (``pd_prefill``) not taken by a decode server within this is aborted
    pd_prefill_timeout_s: float = 600.0
    extra_args: tuple[str, ...] = ()
    extra_env: tuple[tuple[str, str], ...] = ()


@dataclass(kw_only=True)
class SglangServer(ChildServer):
    settings: SglangSettings
    bootstrap_port: int = 0
    kind = "SGLang server"

    @property
    def mode(self) -> str:
        return MODE_OF_ROLE[self.spec.role]

    def allocate_ports(self) -> None:
        super().allocate_ports()
        self.bootstrap_port = free_port(self.spec.host)

    def command(self) -> list[str]:
        s = self.settings
        cmd = [s.python, "-m", s.module, "--model-path", self.spec.weights, "--host", self.spec.host,
               "--port", str(self.port), "--tp-size", str(max(len(self.spec.devices), 1)),
               "--mem-fraction-static", str(s.mem_fraction_static), "--skip-server-warmup",
               "--weight-version", str(self.weight_version)]
        if s.enable_memory_saver:
            cmd.append("--enable-memory-saver")
        if self.mode != "null":
            cmd += ["--disaggregation-mode", self.mode, "--disaggregation-transfer-backend", s.transfer_backend,
                    "--disaggregation-bootstrap-port", str(self.bootstrap_port)]
            if s.enable_pd_role_switch:
                cmd.append("--enable-pd-role-switch")
        return cmd + list(s.extra_args)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        gpus = [d for d in self.spec.devices if d.isdigit()]
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        env["PYTHONUNBUFFERED"] = "1"
        env.update(dict(self.settings.extra_env))
        return env


@dataclass
class _Stream(StreamState):
    """A ``/generate`` stream so far, with the weight version the server reports in it."""

    version: str | None = None


FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORT}


class SglangEngine(HttpEngine[SglangServer, SglangSettings]):
    """SGLang servers as child processes; see the module docstring."""

    def __init__(self, run_dir: str | Path, settings: SglangSettings | None = None):
        super().__init__(run_dir, settings or SglangSettings())
        self._prefills: set[asyncio.Task[None]] = set()  # background halves of ``pd_prefill``

    # ------------------------------------------------------------------------------ servers
    async def launch(self, spec: ServerSpec) -> None:
        await self._start(SglangServer(
            spec=spec, log_dir=self.run_dir / "logs", start_timeout_s=self.settings.start_timeout_s,
            weight_version=spec.weight_version, settings=self.settings))

    async def close(self) -> None:
        for t in list(self._prefills):
            t.cancel()
        await asyncio.gather(*self._prefills, return_exceptions=True)
        await super().close()

    # ------------------------------------------------------------------------------ control
    async def _call(self, srv: SglangServer, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        """A control call (fails fast with ``EngineDeadError`` if the server dies meanwhile); a
        reply with ``success: false`` is an ``EngineError``, one that is not JSON comes back as text."""
        text = await self._fetch(srv, method, path, CONTROL_TIMEOUT_S, dict(body) if body is not None else None)
        try:
            data = json.loads(text) if text.strip() else None
        except json.JSONDecodeError:
            return text
        if isinstance(data, dict) and data.get("success") is False:
            raise EngineError(srv.spec.worker_id, f"{method} {path} failed: {data.get('message')}")
        return data

    async def abort(self, worker_id: str, rid: str | None = None) -> None:
        body = {"abort_all": True} if rid is None else {"rid": rid}
        await self._call(self._alive(worker_id), "POST", "/abort_request", body)

    async def pause(self, worker_id: str, mode: Literal["in_place", "retract", "abort"] = "in_place") -> None:
        await self._call(self._alive(worker_id), "POST", "/pause_generation", {"mode": mode})

    async def resume(self, worker_id: str) -> None:
        await self._call(self._alive(worker_id), "POST", "/continue_generation", {})

    async def release_memory(self, worker_id: str) -> None:
        """Abort in-flight requests, then free weights + KV (the process stays)."""
        srv = self._alive(worker_id)
        await self._call(srv, "POST", "/pause_generation", {"mode": "abort"})
        await self._call(srv, "POST", "/release_memory_occupation", {})

    async def resume_memory(self, worker_id: str) -> None:
        srv = self._alive(worker_id)
        await self._call(srv, "POST", "/resume_memory_occupation", {})
        await self._call(srv, "POST", "/continue_generation", {})

    # ------------------------------------------------------------------------------ weights
    async def weight_version(self, worker_id: str) -> int:
        data = await self._call(self._alive(worker_id), "GET", "/get_weight_version")
        return int(data["weight_version"])

    async def load_weights(self, worker_id: str, path: str, version: int) -> None:
        srv = self._alive(worker_id)
        await self._call(srv, "POST", "/pause_generation", {"mode": "abort"})
        try:
            await self._call(srv, "POST", "/update_weights_from_disk",
                             {"model_path": str(path), "weight_version": str(version)})
            srv.weight_version = version
        finally:
            if srv.alive:
                await self._call(srv, "POST", "/continue_generation", {})

    async def init_weights_group(self, worker_id: str, master_address: str, master_port: int, rank_offset: int,
                                 world_size: int, group_name: str = "weight_update_group",
                                 backend: str = "nccl") -> None:
        """Join the trainer's broadcast group (the trainer is rank 0; this server's TP ranks start at
        ``rank_offset``). Call on every server concurrently with the trainer's own group init."""
        await self._call(self._alive(worker_id), "POST", "/init_weights_update_group", {
            "master_address": master_address, "master_port": master_port, "rank_offset": rank_offset,
            "world_size": world_size, "group_name": group_name, "backend": backend})

    async def update_weights_from_distributed(self, worker_id: str, names: Sequence[str], dtypes: Sequence[str],
                                              shapes: Sequence[Sequence[int]], version: int,
                                              group_name: str = "weight_update_group") -> None:
        """Receive one broadcast of ``names`` (the trainer broadcasts the tensors meanwhile)."""
        srv = self._alive(worker_id)
        await self._call(srv, "POST", "/update_weights_from_distributed", {
            "names": list(names), "dtypes": list(dtypes), "shapes": [list(s) for s in shapes],
            "group_name": group_name, "weight_version": str(version), "flush_cache": True})
        srv.weight_version = version

    # ------------------------------------------------------------------------------ roles
    async def set_role(self, worker_id: str, role: Role) -> None:
        srv = self.server(worker_id)
        t0 = time.monotonic()
        if srv.spec.role == role:
            return
        in_place = (self.settings.enable_pd_role_switch and srv.alive
                    and {srv.spec.role, role} == {Role.PREFILL, Role.DECODE})
        if in_place:
            await self._call(srv, "POST", "/pd_role_switch", {"new_role": MODE_OF_ROLE[role]})
            srv.spec = replace(srv.spec, role=role)
        else:
            await srv.stop()
            await self.launch(replace(srv.spec, role=role, weight_version=srv.weight_version))
        self.last_role_change_s = time.monotonic() - t0

    # ------------------------------------------------------------------------------ generation
    @staticmethod
    def _body(req: GenerateRequest, stream: bool, pd: Mapping[str, Any] | None = None) -> dict[str, Any]:
        s = req.sampling
        sp: dict[str, Any] = {"max_new_tokens": s.max_new_tokens, "temperature": s.temperature, "top_p": s.top_p}
        if s.stop_token_ids:
            sp["stop_token_ids"] = list(s.stop_token_ids)
        if s.seed is not None:
            sp["sampling_seed"] = s.seed
        body: dict[str, Any] = {"input_ids": list(req.input_ids), "sampling_params": sp,
                                "return_logprob": req.return_logprobs, "rid": req.rid, "stream": stream}
        if pd:
            body.update(pd)
        return body

    @staticmethod
    def _absorb(srv: SglangServer, msg: dict[str, Any], st: _Stream) -> None:
        if "error" in msg:
            err = msg["error"]
            raise EngineError(srv.spec.worker_id, f"generate error: {err.get('message', err) if isinstance(err, dict) else err}")
        ids = [int(t) for t in msg.get("output_ids") or []]
        meta = msg.get("meta_info") or {}
        if len(ids) > len(st.tokens):
            st.arrived(srv.inflight)
        if len(ids) >= len(st.tokens):
            st.tokens = ids  # cumulative (SGLang's default streaming)
            st.grew.set()
        lps = meta.get("output_token_logprobs")
        if lps is not None and len(lps) >= len(st.logprobs):
            st.logprobs = [float(e[0]) if e[0] is not None else MISSING_LOGPROB for e in lps]
        st.prompt_tokens = int(meta.get("prompt_tokens") or st.prompt_tokens)
        st.cached_tokens = int(meta.get("cached_tokens") or st.cached_tokens)
        if meta.get("weight_version") is not None:
            st.version = str(meta["weight_version"])
        fr = meta.get("finish_reason")
        if fr:
            st.finish = fr.get("type") if isinstance(fr, dict) else str(fr)

    async def _read(self, srv: SglangServer, body: dict[str, Any], st: _Stream) -> None:
        await self._post_stream(srv, "/generate", body, lambda msg: self._absorb(srv, msg, st))

    async def _run(self, srv: SglangServer, body: dict[str, Any], st: _Stream) -> bool:
        """True if the stream ended normally, False if the engine stopped the server meanwhile."""
        def abort() -> Awaitable[Any]:
            return self._call(srv, "POST", "/abort_request", {"rid": body["rid"]})
        return await self._follow(srv, str(body["rid"]), st, self._read(srv, body, st), abort)

    def _result(self, req: GenerateRequest, st: _Stream, srv: SglangServer, timings: RequestTimings,
                version: int, prefill_id: str = "") -> GenerateResult:
        finish = FINISH.get(st.finish or "", FinishReason.ABORT)
        if st.version is not None and st.version.lstrip("-").isdigit() and finish is not FinishReason.ABORT:
            version = int(st.version)
        return GenerateResult(
            rid=req.rid, output_ids=tuple(st.tokens), logprobs=st.output_logprobs(),
            finish_reason=finish, weight_version=version, prompt_tokens=st.prompt_tokens or len(req.input_ids),
            cached_tokens=st.cached_tokens, timings=timings, worker_id=prefill_id or srv.spec.worker_id,
            decode_worker_id=srv.spec.worker_id)

    @staticmethod
    def _timings(st: _Stream, t_start: float, prefill_s: float | None = None) -> RequestTimings:
        first = st.t_first if st.t_first is not None else time.perf_counter()
        decode, step = st.decode_timings()
        conc = st.concurrency()
        if prefill_s is None:
            return RequestTimings(prefill_s=first - t_start, decode_s=decode, decode_concurrency=conc)
        return RequestTimings(prefill_s=prefill_s, transfer_s=max(first - t_start - prefill_s - step, 0.0),
                              decode_s=decode, decode_concurrency=conc)

    async def generate(self, worker_id: str, req: GenerateRequest) -> GenerateResult:
        srv = self._alive(worker_id)
        if req.sampling.max_new_tokens < 1:
            raise EngineError(worker_id, f"request {req.rid}: max_new_tokens must be >= 1")
        st, version, t0 = _Stream(), srv.weight_version, time.perf_counter()
        try:
            await self._run(srv, self._body(req, stream=True), st)
        except EngineDeadError as exc:
            exc.partial = self._result(req, replace(st, finish="abort"), srv, RequestTimings(), version)
            raise
        return self._result(req, st, srv, self._timings(st, t0), version)

    async def generate_pd(self, prefill_id: str, decode_id: str, req: GenerateRequest) -> GenerateResult:
        p = self._alive(prefill_id)
        self._alive(decode_id)
        if req.sampling.max_new_tokens < 1:
            raise EngineError(decode_id, f"request {req.rid}: max_new_tokens must be >= 1")
        pd = self._bootstrap(p)
        t0 = time.perf_counter()
        prefill_done: list[float] = []

        async def prefill() -> None:
            await self._run(p, self._body(replace(req, rid=f"{req.rid}.p"), stream=False, pd=pd), _Stream())
            prefill_done.append(time.perf_counter() - t0)

        ptask = asyncio.create_task(prefill())
        try:
            st, d, version = await self._decode_half(decode_id, req, pd, prefill_id)
        finally:
            with contextlib.suppress(asyncio.CancelledError, EngineError):
                await asyncio.wait_for(ptask, 30)
        return self._result(req, st, d, self._timings(st, t0, prefill_done[0] if prefill_done else 0.0), version,
                            prefill_id)

    @staticmethod
    def _bootstrap(p: SglangServer) -> dict[str, Any]:
        """The PD coordinates both halves of one request carry: the prefill server's bootstrap
        address and a fresh room (SGLang matches the two halves by room)."""
        return {"bootstrap_host": p.spec.host, "bootstrap_port": p.bootstrap_port,
                "bootstrap_room": random.getrandbits(63)}

    async def _decode_half(self, decode_id: str, req: GenerateRequest, pd: Mapping[str, Any],
                           prefill_id: str) -> tuple[_Stream, SglangServer, int]:
        d = self._alive(decode_id)
        st, version = _Stream(), d.weight_version
        try:
            await self._run(d, self._body(req, stream=True, pd=pd), st)
        except EngineDeadError as exc:
            exc.partial = self._result(req, replace(st, finish="abort"), d, RequestTimings(), version, prefill_id)
            raise
        except EngineError as exc:
            raise KVTransferError(decode_id, f"request {req.rid}: decode failed ({exc}); is prefill "
                                  f"{prefill_id or pd['bootstrap_host']} reachable on its bootstrap port?",
                                  partial=self._result(req, replace(st, finish="abort"), d, RequestTimings(),
                                                       version, prefill_id)) from exc
        return st, d, version

    async def pd_prefill(self, prefill_id: str, req: GenerateRequest) -> dict[str, Any] | None:
        """The prefill half, for a decode server on another node (the node agents run the halves of
        a cross-node pair, ``pearl.runtime.node_agent``). SGLang's PD protocol sends both halves at
        once and the decode server pulls the KV from the prefill server by bootstrap room, so this
        half starts the prefill request in the background and returns the coordinates at once: the
        handle ``{bootstrap_host, bootstrap_port, bootstrap_room}`` for ``pd_decode``. The
        background request is bounded by ``settings.pd_prefill_timeout_s`` (then aborted on the
        prefill server); its failure surfaces on the decode side as ``KVTransferError`` (no KV for
        the room), which the pipeline retries. Never None: SGLang has nothing to report before the
        decode half runs."""
        p = self._alive(prefill_id)
        if req.sampling.max_new_tokens < 1:
            raise EngineError(prefill_id, f"request {req.rid}: max_new_tokens must be >= 1")
        pd = self._bootstrap(p)
        rid = f"{req.rid}.p"
        body = self._body(replace(req, rid=rid), stream=False, pd=pd)

        async def prefill() -> None:
            try:
                await asyncio.wait_for(self._run(p, body, _Stream()), self.settings.pd_prefill_timeout_s)
            except TimeoutError:
                with contextlib.suppress(EngineError, aiohttp.ClientError, TimeoutError):
                    await self.abort(prefill_id, rid)
                raise EngineError(prefill_id, f"request {req.rid}: prefill half not taken by a decode server "
                                  f"within {self.settings.pd_prefill_timeout_s:.0f} s; aborted") from None

        task = asyncio.create_task(prefill(), name=f"sglang-prefill-{rid}")
        self._prefills.add(task)
        task.add_done_callback(self._prefill_done)
        return dict(pd)

    def _prefill_done(self, task: asyncio.Task[None]) -> None:
        self._prefills.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("background PD prefill %s failed: %s", task.get_name(), task.exception())

    async def pd_decode(self, decode_id: str, req: GenerateRequest, handle: Mapping[str, Any],
                        prefill_id: str = "") -> GenerateResult:
        """The decode half: the request with ``pd_prefill``'s bootstrap coordinates; the decode
        server pulls the KV from the prefill server and generates every output token.
        ``timings.prefill_s`` is the wait for the first token (prefill and transfer together: the
        prefill's own span is measured on the other node)."""
        self._alive(decode_id)
        if req.sampling.max_new_tokens < 1:
            raise EngineError(decode_id, f"request {req.rid}: max_new_tokens must be >= 1")
        try:
            pd = {k: handle[k] for k in ("bootstrap_host", "bootstrap_port", "bootstrap_room")}
        except KeyError as exc:
            raise KVTransferError(decode_id, f"request {req.rid}: the PD handle lacks {exc.args[0]!r} "
                                  f"(got {sorted(handle)}); was it made by SglangEngine.pd_prefill?") from None
        t0 = time.perf_counter()
        st, d, version = await self._decode_half(decode_id, req, pd, prefill_id)
        return self._result(req, st, d, self._timings(st, t0), version, prefill_id)
