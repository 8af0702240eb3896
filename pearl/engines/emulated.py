"""The emulated engine: an event-driven cost model of SGLang-style inference servers.

It implements ``InferenceEngine`` so the production runtime (pipeline, schedulers, rebuilder,
toggle manager) drives it exactly as it drives vLLM or SGLang; only time is modelled. It is
deliberately a *different* model from the decision engine's closed-form predictor
(``pearl.core.profile`` / ``makespan``): the predictor sums per-turn costs with fitted linear
coefficients; the emulator runs iteration-level continuous batching per worker.

Per worker, the request life cycle (queues in order)::

    waiting --KV admission--> prefilling --chunks--> decoding --last token--> done
                 (FIFO;            (chunked prefill,      (continuous batching:
              head-of-line          <= chunk_tokens        one token per running
                 blocking)          per iteration)         request per iteration)
    PD:  prefill worker: waiting -> prefilling -> (first token) -> handed off
         decode worker:  kv-wait (FIFO) -> transfer -> decoding -> done

Scheduling choices (SGLang's defaults, written down here):

* **Prefill first.** When a colocated worker has admitted prefill work, the next iteration is a
  prefill chunk and every running decode stalls for it ("prefill interrupts decode"). A chunk
  takes up to ``EmulatorSpec.chunk_tokens`` new tokens from the admitted requests in FIFO order.
* **KV admission.** A request is admitted only if ``prompt + max_new_tokens`` tokens fit in the
  worker's KV pool (so a running request never needs preemption); prefix-cache entries are evicted
  LRU to make room; otherwise it waits (FIFO). The pool is
  ``H_max = (tp * memory_gb * memory_utilization - weight_bytes) / kv_bytes_per_token``.
* **Prefix cache.** Requests with one ``GenerateRequest.conversation`` (the trajectory id) are one
  conversation. A worker remembers
  the last context it held per conversation; the next request of that conversation reuses
  ``prefix_reuse * min(cached, prompt - 1)`` tokens when the first and the last cached token match
  (per role: ``EmulatorPhysics.prefix_reuse_colocated`` / ``prefix_reuse_prefill``, both defaulting
  to ``EmulatorSpec.prefix_reuse``, 1.0 = an ideal radix cache; the ``paper`` workload preset uses
  0.3, calibrated on the paper's Sec. 3.2 token / time split of colocated rollout - see
  ``pearl/sim/presets.py``; routing itself stays conversation-sticky, as ROLL's
  ``EnvAffinityRouter`` is). Colocated workers
  cache prompt + output; a PD prefill worker caches only the prompt (the output was decoded
  elsewhere); a decode worker frees its KV when a request ends (SGLang's decode side keeps no
  radix cache). A weight update or memory release flushes the cache.
* **Mixed chunks off** (SGLang's ``enable_mixed_chunk = False``, as PEARL launches it). With
  ``emulator.mixed_chunk`` the chunk carries the running decodes instead: one forward pass of
  ``mixed_step_s`` (the database's mixed step: the weights read once for both), each running
  request one token longer; its time beyond the chunk alone counts as decode time.
* **The first output token comes from the prefill pass** (as in SGLang/vLLM).

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

This module is longer than our usual ~600 lines on purpose: one worker's queues, KV pool, prefix
cache, decode batch and driver are one state machine, and splitting it would scatter invariants
(e.g. "a reservation is freed exactly once") across files.
"""

from __future__ import annotations

import asyncio
import heapq
import random
import zlib
from collections import OrderedDict, deque
from enum import StrEnum
from typing import TYPE_CHECKING, Any

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
    RequestTimings,
    ServerSpec,
)
from pearl.engines.emulated_costs import LineSpan, MeasuredCosts, WorkerCosts, worker_costs
from pearl.engines.emulated_physics import EmulatorPhysics, load_physics
from pearl.engines.emulated_tables import TableSpan

if TYPE_CHECKING:  # the engine only needs the Clock protocol's shape; no import of the runtime
    from pearl.runtime.clock import Clock


#: per-request seconds summed over finished requests by ``EmulatedEngine.request_split``
_REQUEST_FIELDS = ("requests", "pd_requests", "prefill_queue_s", "kv_wait_s", "prefill_s", "transfer_s", "decode_s",
                   "transfer_bytes")

#: per-worker phase counters folded into ``EmulatedEngine.phase_split``
_PHASE_FIELDS = ("prefill_busy_s", "decode_busy_s", "prefill_tokens", "cached_tokens", "decode_tokens")


# ---------------------------------------------------------------------------------- requests
class _Stage(StrEnum):
    WAITING = "waiting"
    PREFILL = "prefill"
    KV_WAIT = "kv_wait"
    TRANSFER = "transfer"
    DECODE = "decode"
    DONE = "done"


class _Req:
    __slots__ = (
        "aborted", "attempt", "cached", "conc", "conc0", "conv", "d_worker", "decode_s", "decode_start", "dtime0",
        "finish_step", "fut", "gen0", "generated", "input_ids", "join_step", "kv_wait_s", "max_new", "p_reserved",
        "p_worker", "pd", "prefill_end", "prefill_s", "prefill_start", "prefilled", "queue_s", "reserved",
        "rid", "stage", "submit_t", "transfer_s", "version", "workers",
    )

    def __init__(self, req: GenerateRequest, max_new: int, pd: bool, now: float,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.rid = req.rid
        self.conv = req.conversation
        self.attempt = req.attempt
        self.input_ids = req.input_ids
        self.max_new = max_new
        self.pd = pd
        self.cached = 0
        self.prefilled = 0
        self.generated = 0
        self.reserved = 0
        self.stage = _Stage.WAITING
        self.fut: asyncio.Future[None] = loop.create_future()
        self.submit_t = now
        self.queue_s = self.prefill_s = self.transfer_s = self.decode_s = self.kv_wait_s = 0.0
        self.prefill_start = self.prefill_end = self.decode_start = now
        self.join_step = self.gen0 = self.finish_step = 0
        self.conc0 = self.dtime0 = 0.0
        self.conc = 1.0
        self.p_reserved = 0
        self.p_worker = ""  # PD: the prefill worker (holds p_reserved until the transfer is done)
        self.d_worker = ""  # PD: the decode worker
        self.version = 0
        self.aborted = False
        self.workers: list[str] = []

    @property
    def input_len(self) -> int:
        return len(self.input_ids)

    @property
    def holder(self) -> str:
        """The worker holding ``reserved`` KV tokens (and, while decoding, the batch slot)."""
        return self.workers[-1]


# ----------------------------------------------------------------------------------- workers
class _WStatus(StrEnum):
    LAUNCHING = "launching"
    READY = "ready"
    RELEASED = "released"
    STOPPED = "stopped"


class _Worker:
    """One emulated server: queues, KV pool, prefix cache and a driver task (owned by the engine)."""

    def __init__(self, spec: ServerSpec, capacity: int, loop: asyncio.AbstractEventLoop) -> None:
        self.id = spec.worker_id
        self.role = spec.role
        self.version = spec.weight_version
        self.status = _WStatus.LAUNCHING
        self.fresh = True  # no weights loaded since launch (the next load is "finalization")
        self.paused = 0
        self.capacity = capacity
        self.kv_used = 0
        self.cache: OrderedDict[str, tuple[int, int, int]] = OrderedDict()  # conv -> (len, first, last)
        self.cache_tokens = 0
        self.waiting: deque[_Req] = deque()
        self.kv_wait: deque[_Req] = deque()
        self.prefilling: list[_Req] = []
        self.joining: list[_Req] = []
        self.decoding: list[tuple[int, int, _Req]] = []  # heap (finish_step, seq, req)
        self.n_decoding = 0
        self.ctx_sum = 0  # total context of decoding requests at ``steps``
        self.steps = 0  # decode iterations executed so far
        self.conc_cum = 0.0  # integral of batch size over decode time
        self.dtime_cum = 0.0  # decode time so far
        self.seq = 0
        self.span: tuple[float, int, int, LineSpan | TableSpan] | None = None
        self.wake: asyncio.Future[None] = loop.create_future()
        self.driver: asyncio.Task[None] | None = None
        self.events = 0  # spans + chunks simulated (for the events/s figure)
        # token / time split (paper Sec. 3.2): busy seconds and tokens per phase
        self.prefill_busy_s = 0.0
        self.decode_busy_s = 0.0
        self.prefill_tokens = 0  # prompt tokens computed by prefill chunks
        self.cached_tokens = 0  # prompt tokens served from the prefix cache at admission
        self.decode_tokens = 0  # tokens generated by decode iterations

    def poke(self) -> None:
        if not self.wake.done():
            self.wake.set_result(None)

    @property
    def load(self) -> int:
        return len(self.waiting) + len(self.kv_wait) + len(self.prefilling) + len(self.joining) + self.n_decoding


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
        trajectory_tokens: int = 0,
        iteration_log: list[Any] | None = None,
    ) -> None:
        """``iteration_log``: where each decode span is appended as a ``pearl.core.telemetry.IterationRecord``
        (its owner drains it: ``pearl.runtime.controller.Controller``); None: not kept."""
        self.iteration_log = iteration_log
        self.emu = emulator or EmulatorSpec()
        self.physics = physics or EmulatorPhysics()
        self.costs: WorkerCosts | MeasuredCosts = worker_costs(model, hardware, self.emu, tp_size, self.physics)
        ph = self.physics.resolved(hardware, self.emu)
        #: prefix reuse per serving role (EmulatorPhysics; both default to EmulatorSpec.prefix_reuse)
        self._reuse = {
            Role.COLOCATED: ph.value("prefix_reuse_colocated", 0.0),
            Role.PREFILL: ph.value("prefix_reuse_prefill", 0.0),
        }
        #: decode KV reservation beyond the response (``_decode_need``): rho and the trajectory limit K
        self._kv_reserve = ph.value("decode_kv_reserve", 0.0)
        self._traj_tokens = trajectory_tokens
        self.vocab = model.vocab_size
        # synthetic tokens: position q of conversation c is table[(crc32(c) + q) mod vocab], a seeded
        # permutation of the vocabulary, with a fixed logprob per table slot (slicing: no per-token work)
        rng = np.random.default_rng(self.emu.seed)
        self._tok: tuple[int, ...] = tuple(rng.permutation(self.vocab).tolist())
        self._lp: tuple[float, ...] = tuple((-rng.exponential(0.7, self.vocab)).tolist())
        self.clock = clock
        self._workers: dict[str, _Worker] = {}
        self._inflight: dict[str, _Req] = {}
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

    @staticmethod
    def from_config(cfg: RunConfig, clock: Clock, physics: EmulatorPhysics | None = None,
                    iteration_log: list[Any] | None = None) -> EmulatedEngine:
        """The engine of ``cfg`` with ``physics`` (default: every constant the run config's). The
        simulator passes the model's ``configs/emulator`` file (``emulator_physics``)."""
        return EmulatedEngine(cfg.model, cfg.hardware, clock, cfg.emulator, cfg.cluster.tp_size, physics,
                              cfg.workload.max_trajectory_tokens, iteration_log)

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
        return sorted(w for w, x in self._workers.items() if x.status is not _WStatus.STOPPED)

    def worker_load(self, worker_id: str) -> int:
        w = self._workers.get(worker_id)
        return w.load if w else 0

    def kv_used(self, worker_id: str) -> int:
        return self._workers[worker_id].kv_used

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
            if w.status is not _WStatus.STOPPED:
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
        if old is not None and old.status is not _WStatus.STOPPED:
            raise EngineStartError(spec.worker_id, "already running; stop it before launching again")
        loop = asyncio.get_running_loop()
        w = _Worker(spec, self.costs.kv_capacity_tokens, loop)
        self._workers[spec.worker_id] = w
        try:
            await self._spend("launch", spec.worker_id, self._sample("launch", spec.worker_id, *self.emu.launch_s))
        except asyncio.CancelledError:
            w.status = _WStatus.STOPPED
            raise
        gpu_keys = {f"gpu:{d}" for d in spec.devices} & self._fail_next
        if spec.worker_id in self._fail_next or gpu_keys or w.status is _WStatus.STOPPED:
            self._fail_next.discard(spec.worker_id)
            self._fail_next.difference_update(gpu_keys)
            w.status = _WStatus.STOPPED
            raise EngineStartError(spec.worker_id, "emulated launch failure (injected)", exit_code=1,
                                   log_tail="RuntimeError: CUDA error: out of memory (emulated)")
        w.status = _WStatus.READY
        w.driver = asyncio.create_task(self._drive(w), name=f"emulated-driver-{w.id}")

    async def stop(self, worker_id: str) -> None:
        w = self._workers.get(worker_id)
        if w is None or w.status is _WStatus.STOPPED:
            return
        w.status = _WStatus.STOPPED
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
        return w is not None and w.status in (_WStatus.READY, _WStatus.RELEASED)

    async def close(self) -> None:
        for wid in list(self._workers):
            await self.stop(wid)

    def _serving(self, worker_id: str, role: Role | None = None) -> _Worker:
        w = self._workers.get(worker_id)
        if w is None or w.status in (_WStatus.STOPPED, _WStatus.LAUNCHING):
            raise EngineDeadError(worker_id, "no such running emulated worker (stopped or never launched)")
        if w.status is _WStatus.RELEASED:
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
            if r.stage is _Stage.DONE:
                return self._result(r, p.id, d.id)
            # KV admission on the decode worker (FIFO); the prompt's KV stays on the prefill worker
            # (p_reserved) until the transfer is done. The grant resolves r.fut (so does an abort).
            r.fut = loop.create_future()
            r.workers = [p.id, d.id]
            if d.status is not _WStatus.READY:
                self._abort(r)
                return self._result(r, p.id, d.id)
            r.stage = _Stage.KV_WAIT
            d.kv_wait.append(r)
            d.poke()
            await r.fut
            if r.stage is _Stage.DONE:
                return self._result(r, p.id, d.id)
            r.fut = loop.create_future()
            r.stage = _Stage.TRANSFER
            t0 = self.clock.now()
            if await self.clock.wait(r.fut, t0 + self.costs.transfer_s(r.input_len)):
                return self._result(r, p.id, d.id)  # aborted during the transfer
            r.transfer_s = self.clock.now() - t0
            self._release_prefill_kv(r)
            r.version = min(r.version, d.version)
            r.stage = _Stage.DECODE
            d.joining.append(r)
            d.poke()
            await r.fut
        except asyncio.CancelledError:
            self._abort(r)
            raise
        return self._result(r, p.id, d.id)

    def _new_req(self, req: GenerateRequest, pd: bool) -> _Req:
        if req.sampling.max_new_tokens < 1:
            raise EngineError("-", f"request {req.rid}: max_new_tokens must be >= 1")
        if req.rid in self._inflight:
            raise EngineError("-", f"request id {req.rid!r} is already in flight; rids must be unique per attempt")
        r = _Req(req, req.sampling.max_new_tokens, pd, self.clock.now(),
                 asyncio.get_running_loop())
        self._inflight[r.rid] = r
        return r

    def _enqueue(self, w: _Worker, r: _Req) -> None:
        r.stage = _Stage.WAITING
        w.waiting.append(r)
        w.poke()

    def _result(self, r: _Req, worker_id: str, decode_id: str) -> GenerateResult:
        self._inflight.pop(r.rid, None)
        n = r.generated
        if n:
            v = self.vocab
            a = (zlib.crc32(r.conv.encode()) + r.input_len) % v
            b = a + n
            if b <= v:
                out, lps = self._tok[a:b], self._lp[a:b]
            else:  # wraps around the table (n <= vocab always: max_new_tokens < max_context)
                out = self._tok[a:] + self._tok[: b - v]
                lps = self._lp[a:] + self._lp[: b - v]
        else:
            out, lps = (), ()
        if r.aborted:
            reason = FinishReason.ABORT
        else:
            reason = FinishReason.LENGTH
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
            self.resume_log.append((r.conv, r.prefilled, r.prefill_s, self._alone_prefill_s(r.prefilled, r.cached)))
        return GenerateResult(
            rid=r.rid, output_ids=out, logprobs=lps, finish_reason=reason, weight_version=r.version,
            prompt_tokens=r.input_len, cached_tokens=r.cached,
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

    def _abort_worker(self, w: _Worker) -> None:
        # PD: a request still prefilling elsewhere is bound for its decode worker too (``d_worker``);
        # aborting only those already on it would let a draining decode worker take new hand-offs
        # and serve them to the end (borrowed-GPU returns of 22-38 s instead of ~4 s)
        for r in list(self._inflight.values()):
            if w.id in r.workers or r.d_worker == w.id:
                self._abort(r)

    def _abort(self, r: _Req) -> None:
        """End ``r`` now with the tokens completed so far; free its KV; wake the worker(s)."""
        if r.stage is _Stage.DONE:
            return
        now = self.clock.now()
        for wid in r.workers:
            w = self._workers.get(wid)
            if w is None:
                continue
            if r in w.waiting:
                w.waiting.remove(r)
            if r in w.prefilling:
                w.prefilling.remove(r)
                self._free(w, r, cache_len=r.cached + r.prefilled)
            if r in w.kv_wait:
                w.kv_wait.remove(r)
            if r in w.joining:
                w.joining.remove(r)
            elif r.stage is _Stage.DECODE and r.join_step >= 0 and wid == r.holder:
                self._leave_decode(w, r, now)
                r.decode_s = now - r.decode_start
            w.poke()
        self._release_prefill_kv(r)
        holder = self._workers.get(r.holder)
        if r.reserved and holder is not None:
            self._free(holder, r, cache_len=0 if r.pd else r.input_len + r.generated)
        r.aborted = True
        r.stage = _Stage.DONE
        if not r.fut.done():
            r.fut.set_result(None)

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
        if w is None or w.status is _WStatus.STOPPED:
            raise EngineDeadError(worker_id, "cannot load weights: worker is not running")
        self._abort_worker(w)
        self._flush_cache(w)
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
        self._flush_cache(w)
        w.status = _WStatus.RELEASED
        await self._spend("deactivate", worker_id, self._sample("deactivate", worker_id, *self.emu.deactivation_s))

    async def resume_memory(self, worker_id: str) -> None:
        w = self._workers.get(worker_id)
        if w is None or w.status is _WStatus.STOPPED:
            raise EngineDeadError(worker_id, "cannot resume memory: worker is not running")
        if w.status is _WStatus.READY:
            return
        await self._spend("activate", worker_id, self._sample("activate", worker_id, *self.emu.activation_s))
        w.status = _WStatus.READY
        w.poke()

    async def set_role(self, worker_id: str, role: Role) -> None:
        w = self._workers.get(worker_id)
        if w is None or w.status is _WStatus.STOPPED:
            raise EngineDeadError(worker_id, "cannot change role: worker is not running")
        if w.role is role:
            return
        self._abort_worker(w)
        self._flush_cache(w)
        await self._spend("role_switch", worker_id, self.emu.role_switch_s)
        w.role = role

    # ------------------------------------------------------------------ KV bookkeeping
    def _flush_cache(self, w: _Worker) -> None:
        w.cache.clear()
        w.cache_tokens = 0

    def _free(self, w: _Worker, r: _Req, cache_len: int) -> None:
        """Release ``r``'s reservation on ``w``; keep ``cache_len`` tokens of its context as the
        conversation's prefix entry (not on decode workers)."""
        w.kv_used -= r.reserved
        r.reserved = 0
        self._cache(w, r, cache_len)
        w.poke()

    def _cache(self, w: _Worker, r: _Req, cache_len: int) -> None:
        if cache_len <= 0 or w.status is not _WStatus.READY or w.role is Role.DECODE:
            return
        old = w.cache.pop(r.conv, None)
        if old is not None:
            w.cache_tokens -= old[0]
        ids = r.input_ids
        cache_len = min(cache_len, w.capacity - w.kv_used - w.cache_tokens)
        if cache_len <= 0 or not ids:
            return
        # the entry remembers the first token and the last cached prompt token (-1: beyond the prompt)
        last = ids[cache_len - 1] if cache_len <= len(ids) else -1
        w.cache[r.conv] = (cache_len, ids[0], last)
        w.cache_tokens += cache_len

    def _release_prefill_kv(self, r: _Req) -> None:
        """PD: free the prompt's KV on the prefill worker (kept as the conversation's prefix)."""
        if not r.p_reserved:
            return
        p = self._workers.get(r.p_worker)
        if p is not None:
            p.kv_used -= r.p_reserved
            self._cache(p, r, r.input_len)
            p.poke()
        r.p_reserved = 0

    def _make_room(self, w: _Worker, need: int, keep: str) -> bool:
        free = w.capacity - w.kv_used - w.cache_tokens
        if free >= need:
            return True
        for conv in list(w.cache):
            if conv == keep:
                continue
            ln = w.cache.pop(conv)[0]
            w.cache_tokens -= ln
            free += ln
            if free >= need:
                return True
        return free >= need

    def _decode_need(self, r: _Req, capacity: int) -> int:
        """KV tokens a decoding request reserves: ``p + r + floor(rho (K - p - r))`` for a prompt of p
        tokens and r to generate, ``rho = EmulatorPhysics.decode_kv_reserve``, ``K`` the
        trajectory limit; never above ``capacity`` unless ``p + r`` alone is."""
        exact = r.input_len + r.max_new
        if self._kv_reserve <= 0.0 or self._traj_tokens <= exact:
            return exact
        return max(exact, min(exact + int(self._kv_reserve * (self._traj_tokens - exact)), capacity))

    def _admit(self, w: _Worker, now: float) -> None:
        """Admit waiting requests FIFO while KV (and the running cap) allows."""
        while w.waiting:
            r = w.waiting[0]
            if len(w.prefilling) + w.n_decoding + len(w.joining) >= self.emu.max_running:
                break
            hit = 0
            entry = w.cache.get(r.conv)
            if entry is not None:
                ln, first, last = entry
                ids = r.input_ids
                if ids and ids[0] == first and (last == -1 or (ln <= len(ids) and ids[ln - 1] == last)):
                    hit = int(min(ln, len(ids) - 1) * self._reuse.get(w.role, self.emu.prefix_reuse))  # >= 1 computed
            need = r.input_len + (self._decode_need(r, w.capacity) - r.input_len if w.role is Role.COLOCATED else 0)
            need_extra = need - (entry[0] if entry is not None else 0)  # the entry is consumed either way
            if need > w.capacity:
                w.waiting.popleft()
                self._inflight.pop(r.rid, None)
                r.stage = _Stage.DONE
                r.fut.set_exception(EngineError(w.id, f"request {r.rid} needs {need} KV tokens, the worker "
                                                      f"holds {w.capacity}; shorten the trajectory limit"))
                continue
            if not self._make_room(w, max(need_extra, 0), keep=r.conv if entry is not None else ""):
                break
            if entry is not None:
                w.cache.pop(r.conv, None)
                w.cache_tokens -= entry[0]
            w.waiting.popleft()
            w.kv_used += need
            r.reserved = need
            r.cached = hit
            w.cached_tokens += hit
            r.stage = _Stage.PREFILL
            r.queue_s = now - r.submit_t
            r.prefill_start = now
            w.prefilling.append(r)
        while w.kv_wait and w.role is Role.DECODE:
            r = w.kv_wait[0]
            need = self._decode_need(r, w.capacity)
            if w.n_decoding + len(w.joining) >= self.emu.max_running or not self._make_room(w, need, ""):
                break
            w.kv_wait.popleft()
            w.kv_used += need
            r.reserved = need
            r.kv_wait_s = now - r.prefill_end
            r.queue_s += r.kv_wait_s
            if not r.fut.done():
                r.fut.set_result(None)

    # ------------------------------------------------------------------ decode batch
    def _join_decode(self, w: _Worker, r: _Req, now: float) -> None:
        r.stage = _Stage.DECODE
        r.decode_start = now
        r.join_step = w.steps
        r.gen0 = r.generated
        r.finish_step = w.steps + (r.max_new - r.generated)
        r.conc0 = w.conc_cum
        r.dtime0 = w.dtime_cum
        w.seq += 1
        heapq.heappush(w.decoding, (r.finish_step, w.seq, r))
        w.n_decoding += 1
        w.ctx_sum += r.input_len + r.generated

    def _leave_decode(self, w: _Worker, r: _Req, now: float) -> None:
        """Remove ``r`` from the batch (lazy heap deletion) after bringing its count up to date."""
        steps = w.steps
        if w.span is not None:
            t0, k_max, base_steps, span = w.span
            steps = base_steps + span.within(now - t0, k_max)
        r.generated = r.gen0 + (steps - r.join_step)
        dtime = w.dtime_cum - r.dtime0
        r.conc = (w.conc_cum - r.conc0) / dtime if dtime > 0 else float(max(w.n_decoding, 1))
        w.n_decoding -= 1
        w.ctx_sum -= r.input_len + r.gen0 + (w.steps - r.join_step)
        r.join_step = -1  # marks "left" for the lazy heap

    def _finish(self, w: _Worker, r: _Req, now: float) -> None:
        r.generated = r.max_new
        dtime = w.dtime_cum - r.dtime0
        r.conc = (w.conc_cum - r.conc0) / dtime if dtime > 0 else 1.0
        r.decode_s = now - r.decode_start
        w.n_decoding -= 1
        w.ctx_sum -= r.input_len + r.max_new
        r.join_step = -1
        self._free(w, r, cache_len=0 if r.pd else r.input_len + r.generated)
        r.stage = _Stage.DONE
        self._inflight.pop(r.rid, None)
        if not r.fut.done():
            r.fut.set_result(None)

    # ------------------------------------------------------------------ the driver
    async def _drive(self, w: _Worker) -> None:
        """Runs ``_drive_loop``; a bug in it must not hang the requests: they end as aborted (with
        their partial output), the worker is marked dead and the error is kept in ``crashes``."""
        try:
            await self._drive_loop(w)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.crashes.append(f"worker {w.id}: {type(e).__name__}: {e}")
            w.status = _WStatus.STOPPED
            self._abort_worker(w)

    async def _drive_loop(self, w: _Worker) -> None:
        """Per-worker event loop: admit, then one prefill chunk or one decode span, and repeat."""
        loop = asyncio.get_running_loop()
        while True:
            if w.wake.done():
                w.wake = loop.create_future()
            now = self.clock.now()
            if w.paused or w.status is not _WStatus.READY:
                await w.wake
                continue
            self._admit(w, now)
            if w.joining:
                for r in w.joining:
                    self._join_decode(w, r, now)
                w.joining.clear()
            if w.prefilling:
                await self._prefill_chunk(w, now)
                continue
            if w.n_decoding:
                await self._decode_span(w, now)
                continue
            await w.wake

    async def _prefill_chunk(self, w: _Worker, now: float) -> None:
        budget = self.emu.chunk_tokens
        parts: list[tuple[_Req, int]] = []
        for r in w.prefilling:
            todo = r.input_len - r.cached - r.prefilled
            take = min(todo, budget)
            if take > 0:
                parts.append((r, take))
                budget -= take
            if budget <= 0:
                break
        chunk = [(x, r.cached + r.prefilled) for r, x in parts]
        dt = pre = self.costs.prefill_chunk_s(chunk)
        mixed = self.emu.mixed_chunk and w.n_decoding > 0
        if mixed:  # the running decodes ride along, one token each (module docstring)
            dt = self.costs.mixed_step_s(chunk, w.n_decoding, w.ctx_sum)
        w.events += 1
        await self.clock.sleep(dt)
        end = self.clock.now()
        w.prefill_busy_s += pre
        w.prefill_tokens += sum(x for _, x in parts)
        # decode stalled for the chunk (or rode along): it counts as decode time with the current batch
        if w.n_decoding:
            w.dtime_cum += dt
            w.conc_cum += dt * w.n_decoding
        if mixed and w.n_decoding:
            w.decode_busy_s += dt - pre
            w.decode_tokens += w.n_decoding
            w.steps += 1
            w.ctx_sum += w.n_decoding
            self._finish_due(w, end)
        for r, x in parts:
            if r.stage is not _Stage.PREFILL:
                continue  # aborted meanwhile
            r.prefilled += x
            if r.cached + r.prefilled >= r.input_len:
                w.prefilling.remove(r)
                r.prefill_end = end
                r.prefill_s = end - r.prefill_start
                r.generated = 1  # the prefill pass emits the first token
                if r.pd:
                    r.p_reserved, r.reserved = r.reserved, 0
                    r.stage = _Stage.KV_WAIT
                    if r.max_new <= 1:
                        self._release_prefill_kv(r)
                        r.stage = _Stage.DONE
                        self._inflight.pop(r.rid, None)
                    r.fut.set_result(None)
                elif r.max_new <= 1:
                    self._free(w, r, cache_len=r.input_len + 1)
                    r.stage = _Stage.DONE
                    self._inflight.pop(r.rid, None)
                    r.fut.set_result(None)
                else:
                    self._join_decode(w, r, end)

    async def _decode_span(self, w: _Worker, now: float) -> None:
        # drop lazily-deleted heap heads
        while w.decoding and w.decoding[0][2].join_step < 0:
            heapq.heappop(w.decoding)
        if not w.decoding:
            return
        n = w.n_decoding
        k_max = w.decoding[0][0] - w.steps
        span = self.costs.span(n, w.ctx_sum, k_max)
        w.span = (now, k_max, w.steps, span)
        w.events += 1
        full = span.total(k_max)
        loop = asyncio.get_running_loop()
        k = k_max
        while await self.clock.wait(w.wake, now + full):
            if w.waiting or w.joining or w.kv_wait or w.paused or w.status is not _WStatus.READY or (
                    w.n_decoding != n):
                # cut the span at the end of the iteration in progress (requests join at boundaries)
                k = span.within(self.clock.now() - now, k_max)
                if k < k_max:
                    await self.clock.sleep_until(now + span.total(k + 1))
                    k += 1
                break
            w.wake = loop.create_future()  # a wake that changes nothing for this span
        end = self.clock.now()
        w.span = None
        dt = end - now
        w.dtime_cum += dt
        w.conc_cum += dt * w.n_decoding
        w.decode_busy_s += dt
        w.decode_tokens += w.n_decoding * k
        w.steps += k
        w.ctx_sum += w.n_decoding * k
        self._log_span(w, k, now, end)
        self._finish_due(w, end)

    def _finish_due(self, w: _Worker, end: float) -> None:
        """Finish the decoding requests whose last token is out by ``w.steps`` (and drop left ones)."""
        while w.decoding and (w.decoding[0][2].join_step < 0 or w.decoding[0][0] <= w.steps):
            _, _, r = heapq.heappop(w.decoding)
            if r.join_step >= 0:
                self._finish(w, r, end)

    def _log_span(self, w: _Worker, k: int, start: float, end: float) -> None:
        """Log ``k`` decode iterations of ``w`` at its batch, from the span's first context on."""
        if self.iteration_log is not None and k > 0:
            from pearl.core.telemetry import IterationRecord

            self.iteration_log.append(IterationRecord(w.id, w.role.value, w.n_decoding,
                                                      float(w.ctx_sum - w.n_decoding * k), 0, start, end, k))


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

