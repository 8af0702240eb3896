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
  Servers run with ``--incremental-streaming-output``: each event carries only its new ``output_ids``
  and ``meta_info.output_token_logprobs`` (``[logprob, id, text]``) while ``completion_tokens`` counts
  all so far (SGLang's default cumulative events grow with the output; a 16K-token response makes
  one line past aiohttp's 512 KiB limit). An abort's last event repeats the last token and carries
  every logprob; ``sglang_events.absorb`` tells the kinds of event apart by ``completion_tokens``. A
  partial output survives an abort (``finish_reason.type == "abort"``) or a death; a decode-side KV
  failure is an abort event with ``status_code`` 500 and becomes ``KVTransferError``; an abort with
  a 4xx status (or an error event with ``code`` 4xx) is ``RequestRejectedError``, one with 503 and
  no output is asked again (``CAPACITY_RETRIES``). Errors inside a stream arrive as
  ``data: {"error": ...}`` events before ``[DONE]``.
- ``/abort_request {rid | abort_all}``, ``/pause_generation {mode: abort|retract|in_place}``,
  ``/continue_generation``, ``/update_weights_from_disk {model_path, weight_version}``,
  ``/init_weights_update_group`` + ``/begin_weight_update``, ``/update_weights_from_distributed
  {names, dtypes, shapes, group_name, weight_version}``, ``/end_weight_update`` (the trainer runs
  rank 0 of that group; ``pearl.engines.sglang_weights``),
  ``/release_memory_occupation`` / ``/resume_memory_occupation`` (``--enable-memory-saver``, with
  ``--enable-weights-cpu-backup`` so the weights survive),
  ``/pd_role_switch {new_role, decode_cuda_graph_memory_gb}`` (``--enable-pd-role-switch``),
  ``GET /model_info`` (its ``weight_version`` is the live version), ``GET /ping`` (liveness: a flag
  check that stays 200 while paused; ``/health`` runs a one-token generation after a 1 s sleep).
- Abort: SGLang's tokenizer aborts an exact ``rid`` (its scheduler by prefix); the prefill half of a
  PD request is ``<rid>.p``, so ``abort(prefill, rid)`` aborts both names.
- Weight loads pause with ``mode=abort`` first: an update sent to a running server waits on
  SGLang's writer lock behind every in-flight generation.

Role change: prefill <-> decode in place through ``/pd_role_switch`` when
``settings.enable_pd_role_switch`` and the transfer backend supports it (``mooncake``, ``mori``:
SGLang's ``nixl`` KV manager refuses, so a nixl server relaunches without asking): the server is
drained first (pause with abort, then continue: SGLang switches only an idle server), a switch to
decode sends ``settings.decode_cuda_graph_memory_gb``; a refused switch (``RoleSwitchError``)
falls back to a relaunch. Anything involving the colocated mode (``--disaggregation-mode null``)
relaunches the server. Telemetry is measured client-side as in ``pearl.engines.vllm``; in PD the
prefill half replies only once its KV has been sent, so ``prefill_s`` includes the transfer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.http_exceptions import LineTooLong

from pearl.core.state import Role
from pearl.engines.base import (
    EngineCapabilities,
    EngineDeadError,
    EngineError,
    EngineProtocolError,
    EngineStartError,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    KVTransferError,
    PauseMode,
    RequestRejectedError,
    RequestTimings,
    ResponseTooLargeError,
    RoleSwitchError,
    ServerSpec,
    StreamCutError,
    WeightUpdateError,
    WeightVersionError,
)
from pearl.engines.child_server import race_death
from pearl.engines.http_engine import ABORT_TIMEOUT_S, HttpEngine
from pearl.engines.sglang_events import FINISH, absorb, model_eos_ids, no_room, refused, request_seed
from pearl.engines.sglang_events import SglangStream as _Stream
from pearl.engines.sglang_server import MODE_OF_ROLE, ROLE_SWITCH_BACKENDS, SglangServer, SglangSettings
from pearl.engines.sglang_weights import SendWeights, distributed_update

# the server's settings and process live in ``sglang_server``; importing them from here keeps working
__all__ = ["CAPACITY_BACKOFF_S", "CAPACITY_RETRIES", "CONTROL_TIMEOUT_S", "NO_WEIGHTS", "ROLE_SWITCH_BACKENDS",
           "SglangEngine", "SglangServer", "SglangSettings"]

log = logging.getLogger("pearl.engines.sglang")
CONTROL_TIMEOUT_S = 300.0
#: ``weight_version`` of a server whose weights were released without a CPU backup and not loaded since
NO_WEIGHTS = -1
#: a 503 abort without output is SGLang saying it has no room now (a full waiting queue, a decode
#: server that could not reclaim KV): resent up to this many times, ``CAPACITY_BACKOFF_S * 2**i`` apart
CAPACITY_RETRIES = 3
CAPACITY_BACKOFF_S = 0.5
#: ``/pause_generation``'s word for each ``PauseMode`` SGLang has
_PAUSE_WORD = {PauseMode.KEEP: "in_place", PauseMode.RETRACT: "retract", PauseMode.ABORT: "abort"}


class SglangEngine(HttpEngine[SglangServer, SglangSettings]):
    """SGLang servers as child processes; see the module docstring."""

    live_path = "/ping"

    def __init__(self, run_dir: str | Path, settings: SglangSettings | None = None):
        super().__init__(run_dir, settings or SglangSettings())
        self._prefills: set[asyncio.Task[None]] = set()  # background halves of ``pd_prefill``

    @property
    def capabilities(self) -> EngineCapabilities:
        """PD halves across nodes (bootstrap room), the trainer's broadcast group, SGLang's pause
        modes; an in-place role switch where ``/pd_role_switch`` is enabled for a backend that has it."""
        s = self.settings
        return EngineCapabilities(
            split_pd=True, weight_broadcast=True,
            in_place_role_switch=s.enable_pd_role_switch and s.transfer_backend in ROLE_SWITCH_BACKENDS,
            pause_modes=frozenset(_PAUSE_WORD))

    # ------------------------------------------------------------------------------ servers
    async def launch(self, spec: ServerSpec) -> None:
        if spec.role is Role.PREFILL and self.settings.transfer_backend == "fake":
            raise EngineStartError(spec.worker_id, "SGLang's prefill server does not support the 'fake' transfer "
                                   "backend; use mooncake, nixl or mori")
        await self._start(SglangServer(
            spec=spec, log_dir=self.run_dir / "logs", start_timeout_s=self.settings.start_timeout_s,
            weight_version=spec.weight_version, settings=self.settings, eos_ids=model_eos_ids(spec.weights)))

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
        """Abort ``rid`` (every request if None). SGLang's tokenizer matches the exact ``rid``, so on
        a prefill server the prefill half ``<rid>.p`` is aborted too."""
        srv = self._alive(worker_id)
        if rid is None:
            await self._call(srv, "POST", "/abort_request", {"abort_all": True})
            return
        for name in ([rid, f"{rid}.p"] if srv.mode == "prefill" and not rid.endswith(".p") else [rid]):
            await self._call(srv, "POST", "/abort_request", {"rid": name})

    async def pause(self, worker_id: str, mode: PauseMode = PauseMode.KEEP) -> None:
        m = self.capabilities.check_pause(worker_id, mode)
        await self._call(self._alive(worker_id), "POST", "/pause_generation", {"mode": _PAUSE_WORD[m]})

    async def resume(self, worker_id: str) -> None:
        await self._call(self._alive(worker_id), "POST", "/continue_generation", {})

    async def release_memory(self, worker_id: str) -> None:
        """Abort in-flight requests, then free weights + KV (the process stays). A released server
        does not hold new requests (SGLang's release does not pause): nothing may be sent to it
        until ``resume_memory``. Without ``settings.weights_cpu_backup`` the weights are gone
        (``release_memory_occupation`` keeps only buffers) and ``weight_version`` reports
        ``NO_WEIGHTS`` until a load."""
        srv = self._alive(worker_id)
        await self._call(srv, "POST", "/pause_generation", {"mode": "abort"})
        await self._call(srv, "POST", "/release_memory_occupation", {})
        if not (self.settings.enable_memory_saver and self.settings.weights_cpu_backup):
            srv.weights_lost = True

    async def resume_memory(self, worker_id: str) -> None:
        srv = self._alive(worker_id)
        await self._call(srv, "POST", "/resume_memory_occupation", {})
        await self._call(srv, "POST", "/continue_generation", {})

    # ------------------------------------------------------------------------------ weights
    async def weight_version(self, worker_id: str) -> int:
        """The live version: ``weight_version`` of ``GET /model_info`` (a string on SGLang's side),
        or ``NO_WEIGHTS`` for a server released without a CPU backup and not loaded since (SGLang
        still reports the version it had)."""
        srv = self._alive(worker_id)
        if srv.weights_lost:
            return NO_WEIGHTS
        data = await self._call(srv, "GET", "/model_info")
        version = data.get("weight_version") if isinstance(data, dict) else None
        if not isinstance(version, str | int) or not str(version).lstrip("-").isdigit():
            raise WeightVersionError(worker_id, f"GET /model_info has no integer weight_version "
                                     f"(got {str(data)[:200]!r}); was the server launched by SglangEngine?")
        return int(version)

    async def _check_version(self, srv: SglangServer, version: int, what: str) -> None:
        live = await self.weight_version(srv.spec.worker_id)
        if live != version:
            raise WeightVersionError(srv.spec.worker_id, f"{what} reported success but the server reports "
                                     f"weight_version {live}, not {version}")

    async def load_weights(self, worker_id: str, path: str, version: int) -> None:
        srv = self._alive(worker_id)
        await self._call(srv, "POST", "/pause_generation", {"mode": "abort"})
        try:
            await self._call(srv, "POST", "/update_weights_from_disk",
                             {"model_path": str(path), "weight_version": str(version)})
            srv.weights_lost = False
            await self._check_version(srv, version, "update_weights_from_disk")
            srv.weight_version = version
        finally:
            if srv.alive:
                await self._call(srv, "POST", "/continue_generation", {})

    async def init_weights_group(self, worker_id: str, master_address: str, master_port: int, rank_offset: int,
                                 world_size: int, group_name: str = "weight_update_group",
                                 backend: str = "gloo") -> None:
        """Join the trainer's broadcast group (the trainer is rank 0; this server's TP ranks start at
        ``rank_offset``). Call on every server concurrently with the trainer's own group init;
        ``backend`` must be the trainer's (``TrainerClient.init_broadcast``, gloo by default on
        both sides: members of different backends never meet)."""
        if backend not in ("gloo", "nccl"):
            raise EngineError(worker_id, f"unknown weight-group backend {backend!r}; use the trainer's: "
                              "'gloo' (CPU) or 'nccl' (GPUs)")
        await self._call(self._alive(worker_id), "POST", "/init_weights_update_group", {
            "master_address": master_address, "master_port": master_port, "rank_offset": rank_offset,
            "world_size": world_size, "group_name": group_name, "backend": backend})

    async def update_weights_from_distributed(self, worker_ids: str | Sequence[str], names: Sequence[str],
                                              dtypes: Sequence[str], shapes: Sequence[Sequence[int]], version: int,
                                              group_name: str = "weight_update_group", bucketed: bool = False,
                                              send: SendWeights | None = None) -> Any:
        """Receive one update of ``names`` on every server of ``worker_ids`` while ``send()`` (the
        trainer's broadcast, ``pearl.train.broadcast``) runs; returns what ``send`` returned.
        ``bucketed`` False is SGLang's default format (one broadcast per name, in order, each of its
        own dtype and shape: ``send_weights`` of a per-tensor layout); True is its
        ``flattened_bucket`` format (one uint8 broadcast of the tensors' bytes back to back).

        The calls run inside SGLang's weight-update session (``pearl.engines.sglang_weights``:
        pause, begin, update beside ``send()``, end, continue); ``send`` starts only once every
        session is open, and an update refused while it runs cancels it (its cancellation must
        abort the broadcast) instead of leaving the trainer to wait for the group timeout. A
        refusal or failure is a ``WeightUpdateError`` carrying SGLang's message."""
        srvs = [self._alive(w) for w in ([worker_ids] if isinstance(worker_ids, str) else worker_ids)]
        body: dict[str, Any] = {
            "names": list(names), "dtypes": list(dtypes), "shapes": [list(s) for s in shapes],
            "group_name": group_name, "weight_version": str(version), "flush_cache": True,
            "abort_all_requests": True}
        if bucketed:
            body["load_format"] = "flattened_bucket"
        sent = await distributed_update(srvs, body, send, self._control, self._session_call)
        for s in srvs:
            s.weight_version, s.weights_lost = version, False
        return sent

    async def _control(self, srv: SglangServer, path: str, body: Mapping[str, Any] | None = None) -> Any:
        return await self._call(srv, "POST", path, body or {})

    async def _session_call(self, srv: SglangServer, path: str, body: Mapping[str, Any] | None = None) -> str:
        """One call of SGLang's weight-update session (``/begin_weight_update``,
        ``/update_weights_from_distributed``, ``/end_weight_update``): it answers 400 with
        ``{success: false, message}``, which becomes a ``WeightUpdateError`` with that message."""
        text = await self._fetch_any(srv, "POST", path, dict(body or {}))
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None
        if not isinstance(data, dict) or "success" not in data:
            raise WeightUpdateError(srv.spec.worker_id, f"POST {path} answered {text[:300]!r}")
        if not data["success"]:
            raise WeightUpdateError(srv.spec.worker_id, f"POST {path} refused: {data.get('message')}")
        return str(data.get("message") or "")

    # ------------------------------------------------------------------------------ roles
    async def set_role(self, worker_id: str, role: Role) -> None:
        srv = self.server(worker_id)
        t0 = time.monotonic()
        if srv.spec.role == role:
            return
        if self._switchable(srv, role):
            try:
                await self._switch_in_place(srv, role)
                self.last_role_change_s = time.monotonic() - t0
                return
            except RoleSwitchError as exc:
                log.warning("in-place role switch of %s refused, relaunching: %s", worker_id, exc)
        await srv.stop()
        await self.launch(replace(srv.spec, role=role, weight_version=srv.weight_version))
        self.last_role_change_s = time.monotonic() - t0

    def _switchable(self, srv: SglangServer, role: Role) -> bool:
        """An in-place switch is worth asking for: enabled, a backend whose KV manager supports it,
        prefill <-> decode, and for a switch to decode the graph footprint SGLang needs."""
        s = self.settings
        return (s.enable_pd_role_switch and s.transfer_backend in ROLE_SWITCH_BACKENDS and srv.alive
                and {srv.spec.role, role} == {Role.PREFILL, Role.DECODE}
                and (role is not Role.DECODE or s.decode_cuda_graph_memory_gb is not None))

    async def _switch_in_place(self, srv: SglangServer, role: Role) -> None:
        """Drain (SGLang switches only an idle server), then ``/pd_role_switch``. A refusal is a
        ``RoleSwitchError``; the server is resumed in its old role when it says that is safe."""
        await self._call(srv, "POST", "/pause_generation", {"mode": "abort"})
        await self._call(srv, "POST", "/continue_generation", {})
        body: dict[str, Any] = {"new_role": MODE_OF_ROLE[role]}
        if role is Role.DECODE:
            body["decode_cuda_graph_memory_gb"] = self.settings.decode_cuda_graph_memory_gb
        text = await self._fetch_any(srv, "POST", "/pd_role_switch", body)
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None
        if not isinstance(data, dict) or "success" not in data:
            raise RoleSwitchError(srv.spec.worker_id, f"/pd_role_switch answered {text[:300]!r}", safe_to_restore=False)
        if not data["success"]:
            raise RoleSwitchError(srv.spec.worker_id, f"/pd_role_switch to {body['new_role']} refused: "
                                  f"{data.get('message')}", safe_to_restore=bool(data.get("safe_to_restore")))
        srv.spec = replace(srv.spec, role=role)

    async def _fetch_any(self, srv: SglangServer, method: str, path: str, body: Any) -> str:
        """A control call whose reply is read whatever its status (SGLang answers 400 with a body)."""
        async def call() -> str:
            async with self._session().request(method, f"{srv.url}{path}", json=body,
                                               timeout=aiohttp.ClientTimeout(total=CONTROL_TIMEOUT_S)) as r:
                return await r.text()
        text: str = await race_death(srv, call(), f"{method} {path}")
        return text

    # ------------------------------------------------------------------------------ generation
    def _body(self, req: GenerateRequest, stream: bool, pd: Mapping[str, Any] | None = None,
              rid: str = "") -> dict[str, Any]:
        """The ``/generate`` body (``rid``: a wire id other than the request's, the prefill half's ``<rid>.p``). Under ``--enable-deterministic-inference`` SGLang samples an
        unseeded request with seed 42 (``sampling_batch_info.py``), so every member of a GRPO group
        would draw the same tokens: an unseeded request gets ``request_seed(rid)`` instead."""
        s = req.sampling
        sp: dict[str, Any] = {"max_new_tokens": s.max_new_tokens, "temperature": s.temperature, "top_p": s.top_p}
        if s.stop_token_ids:
            sp["stop_token_ids"] = list(s.stop_token_ids)
        if s.seed is not None:
            sp["sampling_seed"] = s.seed
        elif self.settings.deterministic_inference:
            sp["sampling_seed"] = request_seed(rid or req.rid)
        body: dict[str, Any] = {"input_ids": list(req.input_ids), "sampling_params": sp,
                                "return_logprob": req.return_logprobs, "rid": rid or req.rid, "stream": stream}
        if pd:
            body.update(pd)
        return body

    async def _read(self, srv: SglangServer, body: dict[str, Any], st: _Stream) -> None:
        await self._post_stream(srv, "/generate", body, lambda msg: absorb(srv.spec.worker_id, srv.inflight, msg, st))
        st.ended = True

    async def _run(self, srv: SglangServer, body: dict[str, Any], st: _Stream) -> bool:
        """True if the stream ended normally, False if the engine stopped the server meanwhile.
        A stream cut before ``[DONE]``, an event past the line limit or one of an unknown shape
        aborts the remote request and raises the named ``EngineProtocolError``."""
        rid = str(body["rid"])

        def abort() -> Awaitable[Any]:
            return self._call(srv, "POST", "/abort_request", {"rid": rid})
        try:
            return await self._follow(srv, rid, st, self._read(srv, body, st), abort)
        except EngineDeadError:
            raise
        except (EngineProtocolError, LineTooLong, EngineError) as exc:
            err: EngineError
            if isinstance(exc, LineTooLong):
                err = ResponseTooLargeError(srv.spec.worker_id, f"request {rid}: one stream event exceeded aiohttp's "
                                            f"line limit ({exc.args[1]} bytes); SGLang streams incrementally only "
                                            f"with --incremental-streaming-output")
            elif isinstance(exc, EngineProtocolError):
                err = exc
            elif not st.ended and isinstance(exc.__cause__, aiohttp.ClientPayloadError):
                err = StreamCutError(srv.spec.worker_id, f"request {rid}: stream closed before [DONE] "
                                     f"after {len(st.tokens)} tokens ({exc.__cause__!r})")
            else:
                raise
            if srv.alive:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(abort(), ABORT_TIMEOUT_S)
            raise err from exc

    def _result(self, req: GenerateRequest, st: _Stream, srv: SglangServer, timings: RequestTimings,
                version: int, prefill_id: str = "") -> GenerateResult:
        """The result of ``st``. An abort whose last token is a stop token of the request or an EOS
        id of the model is a ``STOP``: SGLang applies an abort before its stop check
        (``Req.update_finish_state``), so the token that ended the turn can arrive as an abort."""
        finish = FINISH.get(st.finish or "", FinishReason.ABORT)
        if st.version is not None and st.version.lstrip("-").isdigit() and finish is not FinishReason.ABORT:
            version = int(st.version)
        if finish is FinishReason.ABORT and st.tokens and (st.tokens[-1] in req.sampling.stop_token_ids
                                                          or st.tokens[-1] in srv.eos_ids):
            finish = FinishReason.STOP
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
        """One request; a refusal is a ``RequestRejectedError`` and a server with no room is asked
        again ``CAPACITY_RETRIES`` times, ``CAPACITY_BACKOFF_S * 2**i`` apart, then an ``EngineError``."""
        srv = self._alive(worker_id)
        if req.sampling.max_new_tokens < 1:
            raise EngineError(worker_id, f"request {req.rid}: max_new_tokens must be >= 1")
        body = self._body(req, stream=True)
        for attempt in range(CAPACITY_RETRIES + 1):
            st, version, t0 = _Stream(), srv.weight_version, time.perf_counter()
            try:
                await self._run(srv, body, st)
            except (EngineDeadError, EngineProtocolError) as exc:
                exc.partial = self._result(req, replace(st, finish="abort"), srv, RequestTimings(), version)
                raise
            refused(srv.spec.worker_id, req, st)
            if not no_room(st):
                return self._result(req, st, srv, self._timings(st, t0), version)
            if attempt < CAPACITY_RETRIES:
                delay = CAPACITY_BACKOFF_S * 2 ** attempt
                log.warning("request %s: %s has no room (%s); asking again in %.1f s", req.rid, worker_id,
                            st.abort_message, delay)
                await asyncio.sleep(delay)
        raise EngineError(worker_id, f"request {req.rid}: no room on the server after {CAPACITY_RETRIES + 1} "
                          f"attempts (503: {st.abort_message})")

    async def generate_pd(self, prefill_id: str, decode_id: str, req: GenerateRequest) -> GenerateResult:
        p = self._alive(prefill_id)
        self._alive(decode_id)
        if req.sampling.max_new_tokens < 1:
            raise EngineError(decode_id, f"request {req.rid}: max_new_tokens must be >= 1")
        pd = self._bootstrap(p)
        t0 = time.perf_counter()
        prefill_done: list[float] = []

        async def prefill() -> None:
            await self._run(p, self._body(req, stream=False, pd=pd, rid=f"{req.rid}.p"), _Stream())
            prefill_done.append(time.perf_counter() - t0)

        ptask = asyncio.create_task(prefill())
        try:
            st, d, version = await self._decode_half(decode_id, req, pd, prefill_id)
        except BaseException:
            ptask.cancel()  # its _follow aborts <rid>.p on the prefill server
            with contextlib.suppress(asyncio.CancelledError, EngineError):
                await ptask
            raise
        with contextlib.suppress(asyncio.CancelledError, EngineError, TimeoutError):
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
        except (EngineDeadError, EngineProtocolError) as exc:
            exc.partial = self._result(req, replace(st, finish="abort"), d, RequestTimings(), version, prefill_id)
            raise
        except RequestRejectedError:
            raise  # the decode server refused the request itself (an error event with a 4xx code)
        except EngineError as exc:
            raise KVTransferError(decode_id, f"request {req.rid}: decode failed ({exc}); is prefill "
                                  f"{prefill_id or pd['bootstrap_host']} reachable on its bootstrap port?",
                                  partial=self._result(req, replace(st, finish="abort"), d, RequestTimings(),
                                                       version, prefill_id)) from exc
        refused(decode_id, req, st)
        if no_room(st):
            raise EngineError(decode_id, f"request {req.rid}: decode server has no room (503: {st.abort_message})")
        if st.finish == "abort" and st.abort_status is not None and st.abort_status >= 500:
            # SGLang's decode server reports a failed KV transfer / bootstrap as an abort event
            # with status_code 500 (``disaggregation/decode.py``: ``prepare_abort``), then [DONE]
            raise KVTransferError(decode_id, f"request {req.rid}: decode server aborted it with status "
                                  f"{st.abort_status}: {st.abort_message}",
                                  partial=self._result(req, st, d, RequestTimings(), version, prefill_id))
        return st, d, version

    async def pd_prefill(self, prefill_id: str, req: GenerateRequest) -> dict[str, Any] | None:
        """The prefill half, for a decode server on another node (the node agents run the halves of
        a cross-node pair, ``pearl.runtime.node.agent``). SGLang's PD protocol sends both halves at
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
        body = self._body(req, stream=False, pd=pd, rid=rid)

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
