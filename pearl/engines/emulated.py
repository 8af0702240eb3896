"""The emulated engine: an event-driven cost model of SGLang-style inference servers.

It implements ``InferenceEngine`` so the production runtime (pipeline, schedulers, rebuilder,
toggle manager) drives it exactly as it drives vLLM or SGLang; only time is modelled. It is
deliberately a *different* model from the decision engine's closed-form predictor
(``pearl.core.profile`` / ``makespan``): the predictor sums per-turn costs with fitted linear
coefficients; the emulator runs iteration-level continuous batching per worker.

One server's queues, KV pool, prefix cache, decode batch and driver, and the scheduling choices
they follow (SGLang's defaults: prefill first, KV admission, the prefix cache, mixed chunks off),
are in ``pearl.engines.emulated_server``; this module owns the servers and the engine's API.

Phase counters (``phase_split``): per worker, busy seconds in prefill chunks and decode spans,
prompt tokens computed by prefill, prompt tokens served from the prefix cache, tokens decoded -
the quantities of the paper's Sec. 3.2 observation (prefill 96.68 % of tokens, 26.48 % of time).

The cost model is ``emulator.costs``: ``database`` (default) reads the decode iteration and the
prefill chunk from tables built out of NVIDIA's aiconfigurator kernel database
(``emulated_tables.py``: ``MeasuredCosts``), ``datasheet`` the roofline formulas
(``emulated_costs.py``: ``WorkerCosts``); either gives a decode span's closed-form sum
(``span(n, context, k_max).total(k)`` and its inverse ``within``), the prefill chunk, the KV
transfer and the KV pool.

Reconfiguration times come from ``EmulatorSpec`` (paper Table 3 ranges, sampled uniformly from a
generator seeded by ``(seed, worker, kind, count)``): ``launch`` (preparation), the first
``load_weights`` after launch (finalization: weight sync + admission), ``resume_memory``
(activation), ``release_memory`` (deactivation), later ``load_weights`` (in-place update),
``set_role``. Launch failures can be injected (``fail_next_launch``) to test all-or-nothing
expansion.

Resumed requests (``resume_prefill``): a request with ``attempt > 0``
(``pearl.engines.resume.continuation_request``) resumes an interrupted one; its prompt is the
original prompt plus the tokens already generated, and all of it that the new worker's prefix
cache does not hold is prefilled again - work an uninterrupted request never does. The engine
logs, per resumed request, those prompt tokens computed, the prefill seconds (wall, admission to
first token: it includes other requests' chunks and decode iterations interleaved with it) and the
GPU work of those tokens alone (``_alone_prefill_s``), and per conversation the generation seconds
(prefill + decode of all its requests) for the paper's Table 3 quantity "extra prefill of a
resumed request / the trajectory's generation time". Modelling choice: the paper does not say
which of the two it measured; both are reported (``share`` wall, ``work_share`` GPU work).

Tokens are synthetic but deterministic: position ``q`` of conversation ``c`` gets
``T[(crc32(c) + q) mod vocab]`` with ``T`` a permutation of the vocabulary drawn from
``EmulatorSpec.seed``, and a logprob drawn once per table slot (``-Exp(0.7)``). So a resumed
request continues the very token stream an uninterrupted one would have produced. Counts are
exact.

Public names: ``EmulatedEngine``, ``WorkerCosts`` (re-exported), ``emulator_summary``.
"""

from __future__ import annotations

import asyncio
import random
import zlib
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from pearl.config import EmulatorSpec, HardwareSpec, ModelSpec, RunConfig
from pearl.core.state import Role
from pearl.engines.base import (
    EngineCapabilities,
    EngineDeadError,
    EngineError,
    EngineStartError,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    PauseMode,
    RequestRejectedError,
    RequestTimings,
    ServerSpec,
)
from pearl.engines.emulated_costs import MeasuredCosts, WorkerCosts, worker_costs
from pearl.engines.emulated_overheads import engine_overheads
from pearl.engines.emulated_physics import EmulatorPhysics, load_physics
from pearl.engines.emulated_server import EmulatedRequest, EmulatedServer, IterationLoop, ServerStatus, Stage
from pearl.engines.radix_cache import RadixCache

if TYPE_CHECKING:  # the engine only needs the Clock protocol's shape; no import of the runtime
    from pearl.runtime.clock import Clock


class ResponseModel(Protocol):
    """Where the emulated model ends a response (its EOS), as the policy being emulated would."""

    def remaining(self, conversation: str, position: int) -> int | None:
        """Tokens the model generates from ``position`` of ``conversation`` up to and including
        its EOS; None: it does not stop before ``max_new_tokens``."""


#: per-request seconds summed over finished requests by ``EmulatedEngine.request_split``
_REQUEST_FIELDS = ("requests", "pd_requests", "prefill_queue_s", "kv_wait_s", "prefill_s", "transfer_s", "decode_s",
                   "transfer_bytes")

#: per-worker phase counters folded into ``EmulatedEngine.phase_split``
_PHASE_FIELDS = ("prefill_busy_s", "decode_busy_s", "prefill_tokens", "cached_tokens", "decode_tokens", "sched_s",
                 "retracted", "retracted_tokens")


# ------------------------------------------------------------------------------------ engine
class EmulatedEngine:
    """``InferenceEngine`` over simulated workers; all waiting goes through the injected clock."""

    #: PD hands KV over within one engine only; a role change is in place (``role_switch_s``)
    capabilities = EngineCapabilities(in_place_role_switch=True)

    def __init__(
        self,
        model: ModelSpec,
        hardware: HardwareSpec,
        clock: Clock,
        emulator: EmulatorSpec | None = None,
        tp_size: int = 1,
        physics: EmulatorPhysics | None = None,
        iteration_log: list[Any] | None = None,
        responses: ResponseModel | None = None,
    ) -> None:
        """``iteration_log``: where each decode span is appended as a ``pearl.core.telemetry.IterationRecord``
        (its owner drains it: ``pearl.runtime.controller.Controller``); None: not kept. ``responses``:
        where the emulated model ends each response (its EOS); None: every request runs to its
        ``max_new_tokens``."""
        self.iteration_log = iteration_log
        self.emu = emulator or EmulatorSpec()
        self.physics = physics or EmulatorPhysics()
        self.costs: WorkerCosts | MeasuredCosts = worker_costs(model, hardware, self.emu, tp_size, self.physics)
        self.overheads = engine_overheads(model, hardware, self.emu, self.physics, tp_size)
        self.responses = responses
        self.vocab = model.vocab_size
        # synthetic tokens: position q of conversation c is table[(crc32(c) + q) mod vocab], a seeded
        # permutation of the vocabulary, with a fixed logprob per table slot (slicing: no per-token work)
        rng = np.random.default_rng(self.emu.seed)
        self._tok: tuple[int, ...] = tuple(rng.permutation(self.vocab).tolist())
        self._lp: tuple[float, ...] = tuple((-rng.exponential(0.7, self.vocab)).tolist())
        self.clock = clock
        self._workers: dict[str, EmulatedServer] = {}
        self._inflight: dict[str, EmulatedRequest] = {}
        self._fail_next: set[str] = set()
        self._fail_all_launches = False
        self._counts: dict[tuple[str, str], int] = {}
        self.reconfig_log: list[tuple[str, str, float]] = []  # (kind, worker, seconds) for Table 3
        self.crashes: list[str] = []  # driver errors (a bug): their requests ended as aborted
        self.events_total = 0
        self._phase_retired: dict[str, float] = dict.fromkeys(_PHASE_FIELDS, 0.0)
        #: (conversation, prompt tokens prefilled again, prefill s, GPU work s of those tokens
        #: alone) of every resumed request
        self.resume_log: list[tuple[str, int, float, float]] = []
        self._gen_s: dict[str, float] = {}  # conversation -> prefill + decode s of all its requests
        self._req_split: dict[str, float] = dict.fromkeys(_REQUEST_FIELDS, 0.0)
        self._busy_retired: dict[str, tuple[str, float, float]] = {}
        self.iterations = IterationLoop(clock, self.emu, self.costs, self.overheads, self._inflight, self._workers,
                                        self.crashes, iteration_log, self._abort_worker, self.output_ids)

    @staticmethod
    def from_config(cfg: RunConfig, clock: Clock, physics: EmulatorPhysics | None = None,
                    iteration_log: list[Any] | None = None, responses: ResponseModel | None = None) -> EmulatedEngine:
        """The engine of ``cfg`` with ``physics`` (default: every constant the run config's). The
        simulator passes the model's ``configs/emulator`` file (``emulator_physics``) and its
        sessions' response model."""
        return EmulatedEngine(cfg.model, cfg.hardware, clock, cfg.emulator, cfg.cluster.tp_size, physics,
                              iteration_log, responses)

    @staticmethod
    def emulator_physics(cfg: RunConfig) -> EmulatorPhysics:
        """The constants of ``configs/emulator/<model>-<hardware>.yaml`` (none where it is absent)."""
        return load_physics(cfg.model.name, cfg.hardware.name).engine

    # ------------------------------------------------------------------ failure injection / stats
    def fail_next_launch(self, worker_id: str = "", gpu: str = "") -> None:
        """The next ``launch`` of ``worker_id`` (or of any worker bound to ``gpu``) fails with
        ``EngineStartError`` after its preparation time."""
        if worker_id:
            self._fail_next.add(worker_id)
        if gpu:
            self._fail_next.add(f"gpu:{gpu}")

    def output_ids(self, conv: str, start: int, n: int) -> tuple[int, ...]:
        """The ``n`` tokens this engine generates from position ``start`` of conversation ``conv``."""
        v = self.vocab
        a = (zlib.crc32(conv.encode()) + start) % v
        b = a + n
        return self._tok[a:b] if b <= v else self._tok[a:] + self._tok[: b - v]

    def token_at(self, conv: str, q: int) -> int:
        """The token this engine generates at position ``q`` of conversation ``conv`` (read by the
        invariant checker in ``pearl.reliability``: a token generated twice shifts positions)."""
        return self._tok[(zlib.crc32(conv.encode()) + q) % self.vocab]

    def conversations_in_flight(self) -> frozenset[str]:
        """The ``GenerateRequest.conversation`` of every in-flight request (read by fault injection)."""
        return frozenset(r.conv for r in self._inflight.values())

    def request_stages(self) -> dict[str, tuple[str, tuple[str, ...]]]:
        """``rid -> (stage, workers)`` of every in-flight request (read by fault injection:
        ``pearl.reliability``); stages: waiting, prefill, kv_wait, transfer, decode."""
        return {rid: (r.stage.value, tuple(r.workers)) for rid, r in self._inflight.items()}

    def worker_ids(self) -> list[str]:
        return sorted(w for w, x in self._workers.items() if x.status is not ServerStatus.STOPPED)

    def worker_load(self, worker_id: str) -> int:
        w = self._workers.get(worker_id)
        return w.load if w else 0

    def kv_used(self, worker_id: str) -> int:
        return self._workers[worker_id].kv_used

    def radix_cache(self, worker_id: str) -> RadixCache:
        """The worker's prefix cache (read by tests and reports)."""
        return self._workers[worker_id].tree

    def request_split(self) -> dict[str, float]:
        """Seconds summed over the requests finished so far (aborted ones left out): waiting for a
        prefill worker's admission (``prefill_queue_s``: KV room or the running cap), waiting for
        the decode worker's KV admission (``kv_wait_s``, PD only), prefill, KV transfer, decode;
        ``transfer_bytes`` the KV moved; ``requests`` / ``pd_requests`` the counts. Where a
        makespan is lost between the phases of a request."""
        return dict(self._req_split)

    def worker_busy(self) -> dict[str, tuple[str, float, float]]:
        """``worker -> (role, prefill busy s, decode busy s)`` of every worker launched (a stopped
        one with its role at the stop)."""
        out = dict(self._busy_retired)
        for w in self._workers.values():
            if w.status is not ServerStatus.STOPPED:
                _, p, d = out.get(w.id, (w.role.value, 0.0, 0.0))
                out[w.id] = (w.role.value, p + w.prefill_busy_s, d + w.decode_busy_s)
        return out

    def phase_split(self) -> dict[str, float]:
        """Token / time split of all workers so far (paper Sec. 3.2 reports it for colocation):
        ``prefill_busy_s``, ``decode_busy_s``, ``prefill_tokens`` (computed), ``cached_tokens``
        (prefix-cache hits), ``decode_tokens``, and the shares ``prefill_time_share`` =
        prefill / (prefill + decode) busy time and ``prefill_token_share`` = prefill tokens /
        (prefill + decode tokens), with and without cached tokens counted as prefill tokens."""
        tot = dict(self._phase_retired)
        for w in self._workers.values():
            for k in _PHASE_FIELDS:
                tot[k] += getattr(w, k)
        busy = tot["prefill_busy_s"] + tot["decode_busy_s"]
        toks = tot["prefill_tokens"] + tot["decode_tokens"]
        tot["prefill_time_share"] = tot["prefill_busy_s"] / busy if busy else 0.0
        tot["prefill_token_share"] = tot["prefill_tokens"] / toks if toks else 0.0
        allp = toks + tot["cached_tokens"]
        tot["prompt_token_share"] = (tot["prefill_tokens"] + tot["cached_tokens"]) / allp if allp else 0.0
        return tot

    def resume_prefill(self) -> dict[str, Any]:
        """The extra prefill of resumed requests (module docstring): per resumed request
        ``tokens`` (prompt tokens computed again) and ``seconds`` (its prefill time), and per
        trajectory with a resumed request ``share`` = its resumed requests' prefill seconds / its
        generation seconds (prefill + decode of all its requests so far; a trajectory still
        running at the end counts what it had done)."""
        extra: dict[str, float] = {}
        work: dict[str, float] = {}
        for conv, _tok, sec, w in self.resume_log:
            extra[conv] = extra.get(conv, 0.0) + sec
            work[conv] = work.get(conv, 0.0) + w
        gen = {c: g for c, g in self._gen_s.items() if g > 0}
        return {
            "tokens": [t for _c, t, _s, _w in self.resume_log],
            "seconds": [sec for _c, _t, sec, _w in self.resume_log],
            "work_seconds": [w for _c, _t, _s, w in self.resume_log],
            "share": [sec / gen[c] for c, sec in extra.items() if c in gen],
            "work_share": [w / gen[c] for c, w in work.items() if c in gen],
        }

    def _alone_prefill_s(self, tokens: int, cached: int) -> float:
        """GPU time of prefilling ``tokens`` after ``cached`` with nothing else on the worker:
        ``sum_k prefill_chunk_s([(x_k, cached + sum_{j<k} x_j)])`` over chunks of ``chunk_tokens``.
        This is the work a resume adds; ``prefill_s`` (wall time from admission to the first token)
        also holds the chunks of other requests and the decode iterations interleaved with it."""
        t, done = 0.0, 0
        while done < tokens:
            x = min(self.emu.chunk_tokens, tokens - done)
            t += self.costs.prefill_chunk_s([(x, cached + done)])
            done += x
        return t

    @property
    def events(self) -> int:
        return self.events_total + sum(w.events for w in self._workers.values())

    def _sample(self, kind: str, worker_id: str, lo: float, hi: float) -> float:
        n = self._counts.get((kind, worker_id), 0)
        self._counts[(kind, worker_id)] = n + 1
        if hi <= lo:
            return lo
        return random.Random(f"{self.emu.seed}:{worker_id}:{kind}:{n}").uniform(lo, hi)

    async def _spend(self, kind: str, worker_id: str, seconds: float) -> None:
        t0 = self.clock.now()
        await self.clock.sleep(seconds)
        self.reconfig_log.append((kind, worker_id, self.clock.now() - t0))

    # ------------------------------------------------------------------ life cycle
    async def launch(self, spec: ServerSpec) -> None:
        old = self._workers.get(spec.worker_id)
        if old is not None and old.status is not ServerStatus.STOPPED:
            raise EngineStartError(spec.worker_id, "already running; stop it before launching again")
        loop = asyncio.get_running_loop()
        w = EmulatedServer(spec, self.costs.kv_capacity_tokens, loop)
        self._workers[spec.worker_id] = w
        try:
            await self._spend("launch", spec.worker_id, self._sample("launch", spec.worker_id, *self.emu.launch_s))
        except asyncio.CancelledError:
            w.launch_failed()
            raise
        gpu_keys = {f"gpu:{d}" for d in spec.devices} & self._fail_next
        if spec.worker_id in self._fail_next or gpu_keys or w.status is ServerStatus.STOPPED:
            self._fail_next.discard(spec.worker_id)
            self._fail_next.difference_update(gpu_keys)
            w.launch_failed()
            raise EngineStartError(spec.worker_id, "emulated launch failure (injected)", exit_code=1,
                                   log_tail="RuntimeError: CUDA error: out of memory (emulated)")
        w.launched(asyncio.create_task(self.iterations.drive(w), name=f"emulated-driver-{w.id}"))

    async def stop(self, worker_id: str) -> None:
        w = self._workers.get(worker_id)
        if w is None or w.status is ServerStatus.STOPPED:
            return
        w.status = ServerStatus.STOPPED
        self._abort_worker(w)
        if w.driver is not None:
            w.driver.cancel()
            await asyncio.gather(w.driver, return_exceptions=True)
            w.driver = None
        self.events_total += w.events
        w.events = 0
        p_busy, d_busy = self._busy_retired.get(w.id, (w.role.value, 0.0, 0.0))[1:]
        self._busy_retired[w.id] = (w.role.value, p_busy + w.prefill_busy_s, d_busy + w.decode_busy_s)
        for k in _PHASE_FIELDS:
            self._phase_retired[k] += getattr(w, k)
            setattr(w, k, type(getattr(w, k))())

    async def healthy(self, worker_id: str) -> bool:
        w = self._workers.get(worker_id)
        return w is not None and w.status in (ServerStatus.READY, ServerStatus.RELEASED)

    async def close(self) -> None:
        for wid in list(self._workers):
            await self.stop(wid)

    def _serving(self, worker_id: str, role: Role | None = None) -> EmulatedServer:
        w = self._workers.get(worker_id)
        if w is None or w.status in (ServerStatus.STOPPED, ServerStatus.LAUNCHING):
            raise EngineDeadError(worker_id, "no such running emulated worker (stopped or never launched)")
        if w.status is ServerStatus.RELEASED:
            raise EngineError(worker_id, "memory is released (borrowed GPU returned); resume_memory first")
        if role is not None and w.role is not role:
            raise EngineError(worker_id, f"worker has role {w.role.value}, the request needs {role.value}")
        return w

    # ------------------------------------------------------------------ generation
    async def generate(self, worker_id: str, req: GenerateRequest) -> GenerateResult:
        w = self._serving(worker_id)
        if w.role is not Role.COLOCATED:
            raise EngineError(worker_id, f"generate() needs a colocated worker, this one is {w.role.value}")
        r = self._new_req(req, pd=False)
        r.workers = [w.id]
        r.version = w.version
        self._enqueue(w, r)
        try:
            await r.fut
        except asyncio.CancelledError:
            self._abort(r)
            raise
        return self._result(r, w.id, "")

    async def generate_pd(self, prefill_id: str, decode_id: str, req: GenerateRequest) -> GenerateResult:
        p = self._serving(prefill_id, Role.PREFILL)
        d = self._serving(decode_id, Role.DECODE)
        r = self._new_req(req, pd=True)
        r.workers = [p.id]
        r.p_worker, r.d_worker = p.id, d.id
        r.version = p.version
        loop = asyncio.get_running_loop()
        try:
            self._enqueue(p, r)
            await r.fut
            if r.stage is Stage.DONE:
                return self._result(r, p.id, d.id)
            # KV admission on the decode worker (FIFO; it moves the request to TRANSFER); the prompt's
            # KV stays on the prefill worker (p_owned) until the transfer is done. The grant resolves
            # r.fut (so does an abort).
            r.fut = loop.create_future()
            r.workers = [p.id, d.id]
            if d.status is not ServerStatus.READY:
                self._abort(r)
                return self._result(r, p.id, d.id)
            r.stage = Stage.KV_WAIT
            d.kv_wait.append(r)
            d.poke()
            await r.fut
            if r.stage is Stage.DONE:
                return self._result(r, p.id, d.id)
            r.fut = loop.create_future()
            t0 = self.clock.now()
            if await self.clock.wait(r.fut, t0 + self.costs.transfer_s(r.input_len)):
                return self._result(r, p.id, d.id)  # aborted during the transfer
            r.transfer_s = self.clock.now() - t0
            d.transferring -= 1
            self.iterations.release_prefill_kv(r)
            r.version = min(r.version, d.version)
            r.stage = Stage.DECODE
            d.joining.append(r)
            d.poke()
            await r.fut
        except asyncio.CancelledError:
            self._abort(r)
            raise
        return self._result(r, p.id, d.id)

    def _new_req(self, req: GenerateRequest, pd: bool) -> EmulatedRequest:
        if req.sampling.max_new_tokens < 1:
            raise EngineError("-", f"request {req.rid}: max_new_tokens must be >= 1")
        if req.rid in self._inflight:
            raise EngineError("-", f"request id {req.rid!r} is already in flight; rids must be unique per attempt")
        # SGLang's init_req_max_new_tokens: the output is clipped so the request fits an empty KV pool
        room = self.costs.kv_capacity_tokens - len(req.input_ids) - 2
        if room < 1:
            raise RequestRejectedError("-", f"request {req.rid}: its prompt of {len(req.input_ids)} tokens exceeds "
                                            f"the KV pool of {self.costs.kv_capacity_tokens} tokens; shorten the "
                                            "trajectory limit", 400)
        cap = min(req.sampling.max_new_tokens, room)
        stop = cap
        if self.responses is not None:
            eos = self.responses.remaining(req.conversation, len(req.input_ids))
            if eos is not None:
                stop = min(cap, max(eos, 1))
        r = EmulatedRequest(req, cap, stop, pd, self.clock.now(), asyncio.get_running_loop())
        self._inflight[r.rid] = r
        return r

    def _enqueue(self, w: EmulatedServer, r: EmulatedRequest) -> None:
        r.stage = Stage.WAITING
        w.waiting.append(r)
        w.poke()

    def _result(self, r: EmulatedRequest, worker_id: str, decode_id: str) -> GenerateResult:
        self._inflight.pop(r.rid, None)
        n = r.generated
        if n:
            v = self.vocab
            a = (zlib.crc32(r.conv.encode()) + r.input_len) % v
            b = a + n
            out = self.output_ids(r.conv, r.input_len, n)
            lps = self._lp[a:b] if b <= v else self._lp[a:] + self._lp[: b - v]
        else:
            out, lps = (), ()
        if r.aborted:
            reason = FinishReason.ABORT
        else:
            reason = FinishReason.LENGTH if r.generated >= r.max_new else FinishReason.STOP
        conc = r.conc
        if not r.aborted:
            sp = self._req_split
            sp["requests"] += 1
            sp["pd_requests"] += r.pd
            sp["prefill_queue_s"] += r.queue_s - r.kv_wait_s
            sp["kv_wait_s"] += r.kv_wait_s
            sp["prefill_s"] += r.prefill_s
            sp["transfer_s"] += r.transfer_s
            sp["decode_s"] += r.decode_s
            sp["transfer_bytes"] += r.input_len * self.costs.kv_bytes if r.transfer_s > 0 else 0.0
        self._gen_s[r.conv] = self._gen_s.get(r.conv, 0.0) + r.prefill_s + r.decode_s
        if r.attempt > 0 and r.prefill_s > 0:
            self.resume_log.append((r.conv, r.input_len - max(r.cached, 0), r.prefill_s,
                                    self._alone_prefill_s(r.input_len - max(r.cached, 0), max(r.cached, 0))))
        return GenerateResult(
            rid=r.rid, output_ids=out, logprobs=lps, finish_reason=reason, weight_version=r.version,
            prompt_tokens=r.input_len, cached_tokens=max(r.cached, 0),
            timings=RequestTimings(queue_s=r.queue_s, prefill_s=r.prefill_s, transfer_s=r.transfer_s,
                                   decode_s=r.decode_s, decode_concurrency=conc),
            worker_id=worker_id, decode_worker_id=decode_id,
        )

    # ------------------------------------------------------------------ abort / pause
    async def abort(self, worker_id: str, rid: str | None = None) -> None:
        w = self._workers.get(worker_id)
        if w is None:
            return
        if rid is None:
            self._abort_worker(w)
        else:
            for r in list(self._inflight.values()):
                if r.rid == rid and (worker_id in r.workers or r.d_worker == worker_id):
                    self._abort(r)

    def _abort_worker(self, w: EmulatedServer) -> None:
        # PD: a request still prefilling elsewhere is bound for its decode worker too (``d_worker``);
        # aborting only those already on it would let a draining decode worker take new hand-offs
        # and serve them to the end (borrowed-GPU returns of 22-38 s instead of ~4 s)
        for r in list(self._inflight.values()):
            if w.id in r.workers or r.d_worker == w.id:
                self._abort(r)

    def _abort(self, r: EmulatedRequest) -> None:
        """End ``r`` now with the tokens completed so far; free its KV; wake the worker(s)."""
        self.iterations.abort_request(r)

    async def pause(self, worker_id: str, mode: PauseMode = PauseMode.KEEP) -> None:
        self.capabilities.check_pause(worker_id, mode)
        w = self._serving(worker_id)
        w.paused += 1
        w.poke()

    async def resume(self, worker_id: str) -> None:
        w = self._workers.get(worker_id)
        if w is not None and w.paused:
            w.paused -= 1
            w.poke()

    # ------------------------------------------------------------------ weights / memory / role
    async def load_weights(self, worker_id: str, path: str, version: int) -> None:
        """First load after launch: finalization (``admission_s``); later: in-place update
        (``weight_update_s``). In-flight requests end with ``abort`` (their tokens came from the old
        version) and the prefix cache is flushed."""
        w = self._workers.get(worker_id)
        if w is None or w.status is ServerStatus.STOPPED:
            raise EngineDeadError(worker_id, "cannot load weights: worker is not running")
        self._abort_worker(w)
        self.iterations.flush_cache(w)
        w.paused += 1
        try:
            if w.fresh:
                await self._spend("finalize", worker_id, self._sample("finalize", worker_id, *self.emu.admission_s))
            else:
                await self._spend("weight_update", worker_id, self.emu.weight_update_s)
        finally:
            w.paused -= 1
            w.poke()
        w.fresh = False
        w.version = version

    async def weight_version(self, worker_id: str) -> int:
        w = self._workers.get(worker_id)
        if w is None:
            raise EngineDeadError(worker_id, "no such emulated worker")
        return w.version

    async def release_memory(self, worker_id: str) -> None:
        w = self._serving(worker_id)
        self._abort_worker(w)
        self.iterations.flush_cache(w)
        w.status = ServerStatus.RELEASED
        await self._spend("deactivate", worker_id, self._sample("deactivate", worker_id, *self.emu.deactivation_s))

    async def resume_memory(self, worker_id: str) -> None:
        w = self._workers.get(worker_id)
        if w is None or w.status is ServerStatus.STOPPED:
            raise EngineDeadError(worker_id, "cannot resume memory: worker is not running")
        if w.status is ServerStatus.READY:
            return
        await self._spend("activate", worker_id, self._sample("activate", worker_id, *self.emu.activation_s))
        w.status = ServerStatus.READY
        w.poke()

    async def set_role(self, worker_id: str, role: Role) -> None:
        w = self._workers.get(worker_id)
        if w is None or w.status is ServerStatus.STOPPED:
            raise EngineDeadError(worker_id, "cannot change role: worker is not running")
        if w.role is role:
            return
        self._abort_worker(w)
        self.iterations.flush_cache(w)
        await self._spend("role_switch", worker_id, self.emu.role_switch_s)
        w.role = role

    # ------------------------------------------------------------------ KV bookkeeping
def emulator_summary(engine: EmulatedEngine) -> dict[str, Any]:
    """Counters for reports: simulated events and observed reconfiguration times by kind."""
    by_kind: dict[str, list[float]] = {}
    for kind, _w, s in engine.reconfig_log:
        by_kind.setdefault(kind, []).append(s)
    return {
        "events": engine.events,
        "crashes": list(engine.crashes),
        "reconfigurations": {k: {"count": len(v), "min_s": min(v), "max_s": max(v), "mean_s": sum(v) / len(v)}
                             for k, v in sorted(by_kind.items())},
    }

