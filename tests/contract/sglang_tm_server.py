"""SGLang's real HTTP app over its real ``TokenizerManager``, with only the scheduler and detokenizer
processes behind its ZMQ sockets replaced, as a child process.

``python -m tests.contract.sglang_tm_server <sglang.launch_server argv>`` parses the argv with
SGLang's own ``prepare_server_args``, builds SGLang's own ``TokenizerManager`` (model config and
tokenizer of ``--model-path``) and serves SGLang's ``http_server.app`` over it under uvicorn.
Everything from the HTTP route down to the ZMQ sockets is SGLang's: the pause condition and the
model-update lock, ``abort_request``, ``_handle_batch_output``, ``_handle_abort_req``,
``_coalesce_streaming_chunks``, ``_handle_abort_finish_reason``, the control communicators.

``FakeScheduler`` stands where the scheduler and detokenizer processes stand: it reads what the
tokenizer manager sends (``TokenizedGenerateReqInput``, ``AbortReq``, pause / continue, the
weight-update and memory requests) from ``scheduler_input_ipc_name`` and answers on
``tokenizer_ipc_name`` with what those processes send (``BatchStrOutput`` per decode step,
``AbortReq`` echoes, control outputs). Its rules are read from ``srt/managers/scheduler.py``: an
aborted running request runs one more decode step before the abort applies
(``Req.update_finish_state``: the abort before the stop check); a waiting or retracted one is
echoed (``send_abort_output``); a prompt of ``max_req_input_len`` tokens or more is refused with
``set_finish_with_abort`` (status 400, run on the input ``[0]``: one sampled token); a request that
finds ``--max-queued-requests`` others is refused with 503. Weight-update and memory requests are
served by SGLang's own ``SchedulerWeightUpdaterManager``
(``scheduler_components/weight_updater.py``: the session gate, ``release_memory_occupation``'s
static-state export); below it, the model runner is a small torch module whose bytes seed the
"model" ``pearl.engines.sglang_fake.next_token``, and the memory saver follows
torch_memory_saver's rule (a region without CPU backup comes back with undefined contents).

A request whose rid starts with ``coalesce-`` is retracted after 3 tokens and its next chunk and
abort echo are sent back to back (what a client slower than the scheduler sees coalesced); one
whose rid starts with ``abort-at-5-`` is aborted while its 5th token is decoded.
``GET /pearl_test/state`` reports what the scheduler received and how often the tokenizer
manager coalesced chunks.
"""

from __future__ import annotations

import asyncio
import struct
import sys
import tempfile
import time
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pearl.engines.sglang_fake import next_token
from tests.contract.sglang_env import MISSING, use_sglang

STEP_S = 0.005  # one decode step


@dataclass
class _Req:
    rid: str
    input_ids: list[int]
    max_new: int
    stops: set[int]
    logprob: bool
    out: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)
    to_finish: dict[str, Any] | None = None  # an abort waiting for the next decode step
    retracted: bool = False


class _Model:
    """The model runner's weights: a module with one parameter and one buffer (what
    ``_export_static_state`` keeps across a release is the buffers)."""

    def __init__(self, torch: Any, model_path: str) -> None:
        self.torch = torch
        self.net = torch.nn.Linear(4, 4, bias=False)
        self.net.register_buffer("rope", torch.arange(4, dtype=torch.float32))
        self.load(model_path)

    def load(self, key: str) -> None:
        g = self.torch.Generator().manual_seed(zlib.crc32(key.encode()))
        with self.torch.no_grad():
            self.net.weight.copy_(self.torch.randn(4, 4, generator=g))

    def seed(self) -> int:
        data = b"".join(t.detach().numpy().tobytes() for t in (*self.net.parameters(), *self.net.buffers()))
        return zlib.crc32(data)


class _MemorySaver:
    """torch_memory_saver's rule for the ``weights`` region: paused and resumed without CPU backup,
    its tensors come back with undefined contents (here: NaN); with backup, as they were."""

    def __init__(self, model: _Model, cpu_backup: bool) -> None:
        self.model, self.cpu_backup, self.saved = model, cpu_backup, None
        self.calls: list[str] = []

    def pause(self, tag: str) -> None:
        self.calls.append(f"pause:{tag}")
        if tag == "weights":
            tensors = [*self.model.net.parameters(), *self.model.net.buffers()]
            self.saved = [t.detach().clone() for t in tensors] if self.cpu_backup else None
            with self.model.torch.no_grad():
                for t in tensors:
                    t.fill_(float("nan"))  # the physical memory is gone

    def resume(self, tag: str) -> None:
        self.calls.append(f"resume:{tag}")
        if tag == "weights" and self.saved is not None:
            with self.model.torch.no_grad():
                for t, s in zip([*self.model.net.parameters(), *self.model.net.buffers()], self.saved, strict=True):
                    t.copy_(s)


class _RunnerWeights:
    """The model runner's weight updater, below SGLang's gate (the receive itself is pinned by
    ``test_sglang_broadcast``): it asserts the group as SGLang's does and loads what it got."""

    def __init__(self, model: _Model, groups: set[str]) -> None:
        self.model, self.groups = model, groups

    def begin_weight_update(self) -> None:
        return None

    def end_weight_update(self, run_post_load: bool) -> None:
        return None

    def receive_weights_from_distributed(self, *, names: Any, dtypes: Any, shapes: Any, group_name: str,
                                         load_format: Any = None) -> list[tuple[str, Any]]:
        assert group_name in self.groups, (f"Group {group_name} not in {sorted(self.groups)}. "
                                           "Please call `init_weights_update_group` first.")
        return [("|".join(names), None)]

    def load_weights_from_distributed(self, weights: list[tuple[str, Any]]) -> tuple[bool, str]:
        self.model.load(weights[0][0])
        return True, "Succeeded to update parameter online."

    def update_weights_from_disk(self, model_path: str, load_format: Any, recapture_cuda_graph: Any = None
                                 ) -> tuple[bool, str]:
        self.model.load(model_path)
        return True, "Succeeded to update model weights."


class FakeScheduler:
    """The scheduler + detokenizer behind the tokenizer manager's sockets (module docstring)."""

    def __init__(self, tm: Any, port_args: Any, server_args: Any) -> None:
        import torch
        import zmq
        import zmq.asyncio
        from sglang.srt.disaggregation.utils import DisaggregationMode
        from sglang.srt.managers.scheduler_components import weight_updater as wu
        from sglang.srt.runtime_context import get_exec
        from sglang.srt.utils.network import get_zmq_socket

        self.tm = tm
        ctx = zmq.asyncio.Context(2)
        self.recv = get_zmq_socket(ctx, zmq.PULL, port_args.scheduler_input_ipc_name, False)
        self.send = get_zmq_socket(ctx, zmq.PUSH, port_args.tokenizer_ipc_name, False)
        self.max_req_input_len = tm.max_req_input_len
        self.max_queued = getattr(server_args, "max_queued_requests", None)
        self.reqs: dict[str, _Req] = {}
        self.paused: str | None = None  # "in_place" / "retract"
        self.received: list[dict[str, Any]] = []
        self.model = _Model(torch, str(server_args.model_path))
        self.groups: set[str] = set()
        self.saver = _MemorySaver(self.model, bool(get_exec().features.enable_weights_cpu_backup))
        runner = SimpleNamespace(weight_updater=_RunnerWeights(self.model, self.groups), model=self.model.net)
        worker = SimpleNamespace(model_runner=runner, weight_update_runners=lambda: [("target", runner)],
                                 init_weights_update_group=self._init_group)
        scheduler = SimpleNamespace(disaggregation_mode=DisaggregationMode.NULL, _engine_paused=False,
                                    record_weight_version_change=lambda new_version: None)
        if not torch.distributed.is_initialized():  # the TP group SGLang's barriers run on (one rank)
            torch.distributed.init_process_group("gloo", init_method=f"file://{tempfile.mktemp()}", rank=0,
                                                 world_size=1)
        wu.get_parallel = lambda: SimpleNamespace(tp_group=SimpleNamespace(cpu_group=torch.distributed.group.WORLD))
        self.updater = wu.SchedulerWeightUpdaterManager(
            tp_worker=worker, draft_worker=None, memory_saver_adapter=self.saver,
            flush_cache=lambda **_: True, is_fully_idle=lambda **_: True, scheduler=scheduler)

    def _init_group(self, recv_req: Any) -> tuple[bool, str]:
        self.groups.add(recv_req.group_name)
        return True, "Succeeded to initialize custom process group."

    # ------------------------------------------------------------------ the loop
    async def run(self) -> None:
        from sglang.srt.managers.io_struct import async_sock_recv

        tasks: set[asyncio.Task[None]] = set()
        while True:
            obj = await async_sock_recv(self.recv)
            task = asyncio.ensure_future(self._handle(obj))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    def _out(self, obj: Any) -> None:
        from sglang.srt.managers.io_struct import sock_send

        sock_send(self.send, obj)

    async def _handle(self, obj: Any) -> None:
        from sglang.srt.managers import io_struct as io

        name = type(obj).__name__
        self.received.append({"type": name, "rid": getattr(obj, "rid", None)})
        if isinstance(obj, io.TokenizedGenerateReqInput):
            sp = obj.sampling_params
            self.received[-1]["sampling_seed"] = getattr(sp, "sampling_seed", None)
            await self._generate(_Req(str(obj.rid), list(obj.input_ids), int(sp.max_new_tokens or 128),
                                      set(sp.stop_token_ids or ()), bool(obj.return_logprob)))
        elif isinstance(obj, io.AbortReq):
            self._abort(obj)
        elif isinstance(obj, io.PauseGenerationReqInput):
            self.paused = obj.mode
            for r in self.reqs.values():
                r.retracted = obj.mode == "retract" and bool(r.out)
        elif isinstance(obj, io.ContinueGenerationReqInput):
            self.paused = None
            for r in self.reqs.values():
                r.retracted = False
        else:
            self._out(self._control(obj))

    def _control(self, obj: Any) -> Any:
        from sglang.srt.managers import io_struct as io

        u = self.updater
        handlers = {
            io.BeginWeightUpdateReqInput: u.begin_weight_update,
            io.EndWeightUpdateReqInput: u.end_weight_update,
            io.UpdateWeightsFromDistributedReqInput: u.update_weights_from_distributed,
            io.InitWeightsUpdateGroupReqInput: u.init_weights_update_group,
            io.UpdateWeightFromDiskReqInput: u.update_weights_from_disk,
            io.ReleaseMemoryOccupationReqInput: u.release_memory_occupation,
            io.ResumeMemoryOccupationReqInput: u.resume_memory_occupation,
        }
        handler = handlers.get(type(obj))
        if handler is None:
            raise RuntimeError(f"the fake scheduler has no rule for {type(obj).__name__}")
        return handler(obj)

    # ------------------------------------------------------------------ generation
    def _abort(self, obj: Any) -> None:
        """``Scheduler.abort_request``: a waiting or retracted request is echoed at once
        (``send_abort_output``); a running one finishes after one more decode step."""
        from sglang.srt.managers.io_struct import AbortReq

        for r in [r for rid, r in self.reqs.items() if obj.abort_all or rid.startswith(obj.rid)]:
            if r.out and not r.retracted:
                r.to_finish = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
            else:
                del self.reqs[r.rid]
                self._out(AbortReq(rid=r.rid, finished_reason=obj.finished_reason))

    async def _generate(self, r: _Req) -> None:
        from sglang.srt.managers.io_struct import AbortReq

        if r.rid.startswith("HEALTH_CHECK"):
            self._out(self._batch(r, [0], [None], {"type": "length", "length": 1}))
            return
        if self.max_queued is not None and len(self.reqs) >= self.max_queued:  # ``_abort_on_queued_limit``
            self._out(AbortReq(rid=r.rid, finished_reason={"type": "abort", "status_code": 503,
                                                           "message": "The request queue is full."}))
            return
        if self.max_req_input_len is not None and len(r.input_ids) >= self.max_req_input_len:
            # ``validate_input_length`` -> ``set_finish_with_abort``: run on the input [0], no logprobs
            tok, _ = next_token(self.model.seed(), [0])
            msg = (f"Input length ({len(r.input_ids)} tokens) exceeds the maximum allowed length "
                   f"({self.max_req_input_len} tokens). Use a shorter input or enable --allow-auto-truncate.")
            self._out(self._batch(r, [tok], [None], {"type": "abort", "message": msg, "status_code": 400,
                                                     "err_type": "BadRequestError"}))
            return
        self.reqs[r.rid] = r
        try:
            while r.rid in self.reqs:
                await asyncio.sleep(STEP_S)
                if r.rid not in self.reqs:
                    return  # echoed while waiting / retracted
                if self.paused is not None and r.to_finish is None:
                    continue
                tok, lp = next_token(self.model.seed(), r.input_ids + r.out)
                lp = struct.unpack("f", struct.pack("f", lp))[0]  # float32, as SGLang's
                r.out.append(tok)
                r.lps.append(lp)
                finish = r.to_finish  # ``update_finish_state``: the abort before the stop check
                if finish is None and tok in r.stops:
                    finish = {"type": "stop", "matched": tok}
                if finish is None and len(r.out) >= r.max_new:
                    finish = {"type": "length", "length": r.max_new}
                if r.rid.startswith("abort-at-5-") and len(r.out) == 5:  # an abort arrives during step 5
                    r.to_finish = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
                if r.rid.startswith("coalesce-") and len(r.out) == 3 and finish is None:
                    # the chunk of this step and the echo of its abort, back to back
                    r.retracted = True
                    del self.reqs[r.rid]
                    self._out(self._batch(r, [tok], [lp], None))
                    self._out(AbortReq(rid=r.rid))
                    # hold the tokenizer's loop until both have arrived, as a loop busy with other
                    # work would: its handle_loop then reads them in one pass, before the client
                    time.sleep(0.05)
                    return
                self._out(self._batch(r, [tok], [lp], finish))
                if finish is not None:
                    return
        finally:
            self.reqs.pop(r.rid, None)

    def _batch(self, r: _Req, ids: list[int], lps: list[float | None], finish: Any) -> Any:
        """The detokenizer's ``BatchStrOutput`` for one request's new tokens (deltas, as the
        scheduler sends them)."""
        from array import array

        from sglang.srt.managers.io_struct import BatchStrOutput

        n = len(r.out) if r.out else len(ids)
        logprob = r.logprob and all(v is not None for v in lps)
        return BatchStrOutput(
            rids=[r.rid], finished_reasons=[finish], output_strs=[""], output_ids=[array("q", ids)],
            prompt_tokens=[len(r.input_ids)], completion_tokens=[n], reasoning_tokens=[0], cached_tokens=[0],
            input_token_logprobs_val=[None], input_token_logprobs_idx=[None],
            output_token_logprobs_val=[list(lps) if logprob else None],
            output_token_logprobs_idx=[list(ids) if logprob else None],
            input_top_logprobs_val=[None], input_top_logprobs_idx=[None], output_top_logprobs_val=[None],
            output_top_logprobs_idx=[None], input_token_ids_logprobs_val=[None],
            input_token_ids_logprobs_idx=[None], output_token_ids_logprobs_val=[None],
            output_token_ids_logprobs_idx=[None], output_token_entropy_val=None, output_token_sampling_mask=None,
            output_hidden_states=None, routed_experts=None, indexer_topk=None, placeholder_tokens_idx=None,
            placeholder_tokens_val=None, retraction_counts=[0])


def main() -> None:
    if not use_sglang():
        raise SystemExit(MISSING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import uvicorn
        from fastapi.responses import JSONResponse
        from sglang.srt.entrypoints import http_server as hs
        from sglang.srt.managers.tokenizer_manager import ServerStatus, TokenizerManager
        from sglang.srt.runtime_context import publish
        from sglang.srt.server_args import PortArgs, prepare_server_args

        args = prepare_server_args([*sys.argv[1:], "--device", "cpu"])  # this host has no accelerator
        publish(args, role="tokenizer")
        port_args = PortArgs.init_new(args)
        tm = TokenizerManager(args, port_args)
    tm.max_req_input_len = int(getattr(args, "max_total_tokens", None) or tm.context_len - 1)
    tm.server_status = ServerStatus.Up  # ``--skip-server-warmup``
    coalesced: list[str] = []
    real = TokenizerManager._coalesce_streaming_chunks

    def counted(self: Any, out_list: list, rid: str, customized_info_keys: Any = None) -> dict:
        coalesced.append(rid)
        return real(self, out_list, rid, customized_info_keys)
    TokenizerManager._coalesce_streaming_chunks = counted  # type: ignore[method-assign]
    hs.set_global_state(hs._GlobalState(tokenizer_manager=tm, template_manager=None, scheduler_info={}))

    async def serve() -> None:
        sched = FakeScheduler(tm, port_args, args)

        @hs.app.get("/pearl_test/state")
        async def state() -> JSONResponse:
            return JSONResponse({"received": sched.received, "coalesced": coalesced, "saver": sched.saver.calls,
                                 "session": sched.updater._session is not None})
        task = asyncio.create_task(sched.run())
        print(f"SGLang {hs.__version__} app + TokenizerManager on {args.host}:{args.port}", flush=True)
        server = uvicorn.Server(uvicorn.Config(hs.app, host=args.host, port=args.port, lifespan="off",
                                               log_level="warning"))
        try:
            await server.serve()
        finally:
            task.cancel()
    asyncio.run(serve())


if __name__ == "__main__":
    main()
