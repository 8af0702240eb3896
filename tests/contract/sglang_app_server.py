"""SGLang's real HTTP server with only its engine side replaced, as a child process.

``python -m tests.contract.sglang_app_server <sglang.launch_server argv>`` parses the argv with
SGLang's own ``prepare_server_args`` and serves SGLang's own FastAPI ``app``
(``srt/entrypoints/http_server.py``: its routes, request dataclasses from
``srt/managers/io_struct.py``, the ``/generate`` API contract gate, the SSE framing with
``data: [DONE]``, error events, ``/health``'s generate-and-wait, ``/ping``, ``/model_info``) under
uvicorn. The seam is the tokenizer manager, the one object those routes call:
``EngineSide`` stands where ``TokenizerManager`` + scheduler stand, and produces what they produce
(the rules read from ``srt/managers/tokenizer_manager.py``: ``_handle_batch_output`` for
incremental and cumulative events, ``_handle_abort_req`` for an abort's last event, the pause
condition new requests wait on, exact-rid aborts; from ``srt/disaggregation/decode.py``: a failed
KV transfer aborts with ``status_code`` 500; from ``srt/disaggregation/role_switch.py``: the
switch's refusal table; from ``srt/managers/scheduler_components/weight_updater.py``: the
weight-update session an update must run in). Its "model" is ``pearl.engines.sglang_fake.next_token``.
``tests/contract/sglang_tm_server.py`` goes one layer deeper, with SGLang's own tokenizer manager.

Requests whose rid starts with ``cut-`` (the stream breaks off), ``shape-`` (an event of an unknown
shape) or ``valueerror-`` (the engine raises ``ValueError``) drive the failure paths;
``/update_weights_from_disk`` with a ``model_path`` ending in ``stale`` succeeds without moving the
version. ``GET /pearl_test/state`` reports the aborts asked for, the requests they reached and the
bodies received.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pearl.engines.sglang_fake import next_token
from tests.contract.sglang_env import MISSING, use_sglang

TOKEN_DELAY_S = 0.001
CUMULATIVE_EVERY = 512  # tokens per event in cumulative mode (SGLang coalesces queued outputs)
INCREMENTAL_EVERY = 64


class _ModelConfig:
    is_image_understandable_model = False
    is_audio_understandable_model = False

    class hf_config:
        model_type = "llama"
        architectures = ("LlamaForCausalLM",)


class _State:
    def __init__(self) -> None:
        self.out: list[int] = []
        self.lps: list[float] = []
        self.aborted: str | None = None


class EngineSide:
    """What SGLang's routes call on ``_global_state.tokenizer_manager`` (module docstring)."""

    def __init__(self, server_args: Any, status_up: Any) -> None:
        self.server_args = server_args
        self.model_path = server_args.model_path
        self.served_model_name = server_args.model_path
        self.model_config = _ModelConfig()
        self.is_generation = True
        self.gracefully_exit = False
        self.server_status = status_up
        self.last_receive_tstamp = 0.0
        self.rid_to_state: dict[str, _State] = {}
        self.weight_version = server_args.weight_version
        self.load_format = server_args.load_format
        self.disaggregation_mode = server_args.disaggregation_mode
        self.incremental = server_args.incremental_streaming_output
        self.is_pause = False
        self.is_pause_cond = asyncio.Condition()
        self.aborted: list[str] = []  # requests an abort reached while they ran
        self.abort_calls: list[str] = []  # every abort asked for
        self.bodies: list[dict[str, Any]] = []
        self.groups: set[str] = set()
        self.session = False  # ``scheduler_components/weight_updater.py``: begin / end

    # ------------------------------------------------------------------ status
    def is_healthy(self) -> bool:
        return not self.gracefully_exit

    def config_value(self, name: str) -> Any:
        return getattr(self, name, None)

    def _record(self, route: str, obj: Any) -> None:
        import msgspec

        body = ({f: msgspec.to_builtins(getattr(obj, f)) for f in obj.__struct_fields__}
                if isinstance(obj, msgspec.Struct) else _dataclass_dict(obj))
        self.bodies.append({"route": route, "type": type(obj).__name__, "body": body})

    # ------------------------------------------------------------------ generation
    def create_abort_task(self, obj: Any) -> Any:
        from sglang.srt.managers.tokenizer_manager import TokenizerManager

        return TokenizerManager.create_abort_task(self, obj)  # SGLang's own: aborts on client disconnect

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        """The tokenizer matches the exact rid and drops an unknown one."""
        self.abort_calls.append("*" if abort_all else rid)
        targets = list(self.rid_to_state) if abort_all else [rid] if rid in self.rid_to_state else []
        for r in targets:
            self.rid_to_state[r].aborted = "Abort in waiting queue" if not self.rid_to_state[r].out else \
                "Aborted by AbortReq"
            self.aborted.append(r)

    async def generate_request(self, obj: Any, request: Any = None) -> Any:
        if obj.rid is not None and str(obj.rid).startswith("HEALTH_CHECK"):
            self.last_receive_tstamp = time.time()
            yield {"text": "", "output_ids": [0], "meta_info": {"id": obj.rid}}
            return
        obj.normalize_batch_and_arguments()  # what TokenizerManager.generate_request does first
        self._record("/generate", obj)
        async with self.is_pause_cond:
            await self.is_pause_cond.wait_for(lambda: not self.is_pause)
        rid = str(obj.rid)
        if rid.startswith("valueerror-"):
            raise ValueError("The input_ids 0 is out of range for the vocabulary")
        sp = obj.sampling_params or {}
        max_new, stops = int(sp.get("max_new_tokens", 128)), set(sp.get("stop_token_ids") or [])
        st = _State()
        self.rid_to_state[rid] = st
        stream, logprob = bool(obj.stream), bool(obj.return_logprob)
        incremental = stream and self.incremental
        every = INCREMENTAL_EVERY if incremental else CUMULATIVE_EVERY
        sent = 0
        try:
            if self.disaggregation_mode == "decode" and not _reachable(obj.bootstrap_host, obj.bootstrap_port):
                # disaggregation/decode.py: prepare_abort(req, msg, status_code=INTERNAL_SERVER_ERROR)
                finish = {"type": "abort", "message": f"KVTransferError(bootstrap_room={obj.bootstrap_room}): "
                          f"failed to get kvcache from prefill", "status_code": 500, "err_type": None}
                yield self._event(rid, st, finish, logprob, 0, incremental)
                return
            ctx = list(obj.input_ids)
            while True:
                if st.aborted is not None:
                    yield self._abort_event(rid, st, logprob, incremental)
                    return
                finish: dict[str, Any] | None = None
                if len(st.out) >= max_new:
                    finish = {"type": "length", "length": max_new}
                elif st.out and st.out[-1] in stops:
                    finish = {"type": "stop", "matched": st.out[-1]}
                if finish is not None:
                    yield self._event(rid, st, finish, logprob, sent if incremental else 0, incremental)
                    return
                if rid.startswith("cut-") and len(st.out) >= 3:
                    raise RuntimeError("connection to the scheduler lost")
                if rid.startswith("shape-") and len(st.out) >= 3:
                    yield {"unexpected": "shape"}
                await asyncio.sleep(TOKEN_DELAY_S)
                tok, lp = next_token(0, ctx + st.out)
                st.out.append(tok)
                st.lps.append(float(struct.unpack("f", struct.pack("f", lp))[0]))  # float32, as SGLang's
                if stream and len(st.out) - sent >= every:
                    yield self._event(rid, st, None, logprob, sent if incremental else 0, incremental)
                    sent = len(st.out)
        finally:
            self.rid_to_state.pop(rid, None)

    def _meta(self, rid: str, st: _State, finish: Any) -> dict[str, Any]:
        return {"id": rid, "finish_reason": finish, "prompt_tokens": 0, "weight_version": self.weight_version,
                "num_retractions": 0, "reasoning_tokens": 0, "completion_tokens": len(st.out), "cached_tokens": 0}

    def _event(self, rid: str, st: _State, finish: Any, logprob: bool, start: int, incremental: bool) -> dict:
        """``_handle_batch_output``: an incremental event carries the tokens and logprobs from
        ``start`` on (``_slice_streaming_output_meta_info``), a cumulative one all of them."""
        meta = self._meta(rid, st, finish)
        if logprob:
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(st.lps[start:], st.out[start:],
                                                                             strict=True)]
        return {"text": "", "output_ids": list(st.out[start:]), "meta_info": meta}

    def _abort_event(self, rid: str, st: _State, logprob: bool, incremental: bool) -> dict[str, Any]:
        """``_handle_abort_req``: every logprob, and in incremental mode only the last token."""
        meta = {"id": rid, "finish_reason": {"type": "abort", "message": st.aborted},
                "weight_version": self.weight_version, "e2e_latency": 0.0, "completion_tokens": len(st.out)}
        if logprob:
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(st.lps, st.out, strict=True)]
        ids = ([st.out[-1]] if st.out else []) if incremental else list(st.out)
        return {"text": "", "output_ids": ids, "meta_info": meta}

    # ------------------------------------------------------------------ control
    async def pause_generation(self, obj: Any) -> None:
        self._record("/pause_generation", obj)
        async with self.is_pause_cond:
            self.is_pause = True
            if obj.mode == "abort":
                self.abort_request(abort_all=True)

    async def continue_generation(self, obj: Any) -> None:
        self._record("/continue_generation", obj)
        async with self.is_pause_cond:
            self.is_pause = False
            self.is_pause_cond.notify_all()

    async def update_weights_from_disk(self, obj: Any, request: Any = None) -> tuple[bool, str, int]:
        self._record("/update_weights_from_disk", obj)
        if not str(obj.model_path).endswith("stale"):
            self.model_path = obj.model_path
            if obj.weight_version is not None:
                self.weight_version = obj.weight_version
        return True, "Succeeded to update model weights.", 0

    async def init_weights_update_group(self, obj: Any, request: Any = None) -> tuple[bool, str]:
        self._record("/init_weights_update_group", obj)
        self.groups.add(obj.group_name)
        return True, "Succeeded to initialize custom process group."

    async def begin_weight_update(self, obj: Any, request: Any = None) -> tuple[bool, str]:
        self._record("/begin_weight_update", obj)
        if self.session:
            return False, "a weight-update session is already open; call end_weight_update() first"
        self.session = True
        return True, "Success"

    async def end_weight_update(self, obj: Any, request: Any = None) -> tuple[bool, str]:
        self._record("/end_weight_update", obj)
        if not self.session:
            return False, "no weight-update session is open; call begin_weight_update() first"
        self.session = False
        return True, "Success"

    async def update_weights_from_distributed(self, obj: Any, request: Any = None) -> tuple[bool, str]:
        self._record("/update_weights_from_distributed", obj)
        if not self.session:
            return False, ("update_weights_from_distributed must run between begin_weight_update() and "
                           "end_weight_update()")
        if obj.group_name not in self.groups:
            return False, f"Group {obj.group_name} not in {sorted(self.groups)}."
        if obj.weight_version is not None:
            self.weight_version = obj.weight_version
        return True, "Succeeded to update parameter online."

    async def release_memory_occupation(self, obj: Any, request: Any = None) -> None:
        self._record("/release_memory_occupation", obj)
        async with self.is_pause_cond:
            self.is_pause = True

    async def resume_memory_occupation(self, obj: Any, request: Any = None) -> None:
        self._record("/resume_memory_occupation", obj)
        async with self.is_pause_cond:
            self.is_pause = False
            self.is_pause_cond.notify_all()

    async def pd_role_switch(self, obj: Any, request: Any = None) -> Any:
        """``role_switch._reject_reason`` and the idle / graph-memory checks, in their order."""
        from sglang.srt.managers.io_struct import PdRoleSwitchReqOutput

        self._record("/pd_role_switch", obj)
        sa, old = self.server_args, self.disaggregation_mode

        def fail(msg: str) -> Any:
            return PdRoleSwitchReqOutput(success=False, message=msg, old_role=old, new_role=obj.new_role,
                                         safe_to_restore=True)
        if not sa.enable_pd_role_switch:
            return fail("--enable-pd-role-switch is not set on this server")
        if obj.new_role not in ("prefill", "decode"):
            return fail(f"invalid new_role={obj.new_role!r}")
        if old == "null":
            return fail("instance is not running in PD disaggregation mode")
        if sa.disaggregation_transfer_backend not in ("mooncake", "mori"):
            return fail(f"transfer backend {sa.disaggregation_transfer_backend!r} does not support runtime role switch")
        if obj.new_role == old:
            return PdRoleSwitchReqOutput(success=True, message="already in target role", old_role=old,
                                         new_role=obj.new_role)
        if self.rid_to_state:
            return fail("instance is not idle; drain all requests before switching")
        if obj.new_role == "decode" and obj.decode_cuda_graph_memory_gb is None:
            return fail("decode_cuda_graph_memory_gb is required before capturing decode graphs")
        self.disaggregation_mode = obj.new_role
        return PdRoleSwitchReqOutput(success=True, message="ok", old_role=old, new_role=obj.new_role)


def _dataclass_dict(obj: Any) -> dict[str, Any]:
    import dataclasses

    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.name in (
        "rid", "input_ids", "sampling_params", "return_logprob", "stream", "bootstrap_host", "bootstrap_port",
        "bootstrap_room")}


def _reachable(host: Any, port: Any) -> bool:
    if host is None or port is None:
        return False
    try:
        with socket.create_connection((str(host), int(port)), timeout=1):
            return True
    except OSError:
        return False


def main() -> None:
    if not use_sglang():
        raise SystemExit(MISSING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import uvicorn
        from fastapi.responses import JSONResponse
        from sglang.srt.entrypoints import http_server as hs
        from sglang.srt.managers.tokenizer_manager import ServerStatus
        from sglang.srt.runtime_context import publish
        from sglang.srt.server_args import prepare_server_args

        # this host has no accelerator: resolve the configuration for the CPU device
        args = prepare_server_args([*sys.argv[1:], "--device", "cpu"])
        publish(args, role="tokenizer")
    side = EngineSide(args, ServerStatus.Up)
    hs.set_global_state(hs._GlobalState(tokenizer_manager=side, template_manager=None, scheduler_info={}))

    @hs.app.get("/pearl_test/state")
    async def state() -> JSONResponse:
        return JSONResponse({"aborted": side.aborted, "abort_calls": side.abort_calls, "bodies": side.bodies, "mode": side.disaggregation_mode})

    print(f"SGLang {hs.__version__} app on {args.host}:{args.port}", flush=True)
    uvicorn.run(hs.app, host=args.host, port=args.port, lifespan="off", log_level="warning")


if __name__ == "__main__":
    main()
