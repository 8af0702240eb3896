"""One emulated server's state machine: its queues, KV pool, radix cache, decode batch and driver.

``EmulatedServer`` holds one worker's state, ``EmulatedRequest`` one request's, and
``IterationLoop`` runs every server's iterations over them (the engine, ``pearl.engines.emulated``,
owns the servers and the API; this module owns the invariants, e.g. "every KV token is owned by
exactly one request or by the radix cache"). Only time is modelled; the kernel costs come from the
engine's cost model (``MeasuredCosts`` or ``WorkerCosts``), the engine's own time per iteration
from ``pearl.engines.emulated_overheads``, and the scheduling rules are SGLang's
(``pearl.engines.emulated_sched``, ``pearl.engines.radix_cache``).

Per worker, the request life cycle (queues in order)::

    waiting --admission--> prefill batch --chunks--> decoding --EOS / cap--> done
       ^        (FCFS,        (chunked prefill: one       (continuous batching:
       |     estimate rule)    request at a time is        one token per running
       |                       the chunked one)            request per iteration)
       '------------------ retracted (KV pressure) -----------'
    PD:  prefill worker: waiting -> prefill batch -> (first token) -> KV held until the transfer
         decode worker:  kv-wait (FIFO, 512-token reserve rule) -> transfer -> decoding -> done
                         decoding --retracted--> offloaded to host --> resumed (KV copied back)

The KV pool of ``H_max = (tp memory u - W) / kv`` tokens holds the radix cache's tokens (locked by
running requests: protected; unlocked: evictable) and the tokens running requests own outside it
(prompt tokens not inserted yet, decoded tokens). Tokens are real ids (a trajectory's context, the
engine's own output), so the prefix a request finds cached is what the radix tree holds: reuse
comes out of routing, eviction, retraction and flushes, not out of a constant.

Scheduling choices (SGLang 0.5.23's defaults, the rules in ``emulated_sched``):

* **Prefill first.** Each iteration tries to form a prefill batch (the chunked request first, then
  FCFS admissions while the KV estimate and the chunk's ``EmulatorSpec.chunk_tokens`` allow); only
  if there is none does the decode batch step, and the decodes stall for a prefill batch ("prefill
  interrupts decode"), as with ``enable_mixed_chunk = False``, how PEARL launches SGLang.
* **Admission on an estimate**: the scheduler does not know where a response stops; it counts
  ``min(max_new_tokens - generated, 4096) x new_token_ratio`` per running request, so a batch can
  outgrow the pool, and is then **retracted** (KV freed, back to the waiting queue, output kept).
* **The radix cache** (``radix_cache.RadixCache``): an admission matches its prompt (at most all but
  its last token, which must be computed); a chunk of an unfinished prompt is inserted and held
  (``cache_unfinished_req``); a finished or aborted request inserts prompt + output less the last
  token (``cache_finished_req``); a PD prefill worker inserts the prompt once its KV is sent; a PD
  decode worker keeps no tree. Eviction is LRU over unlocked leaves. A weight update, a memory
  release and a role change flush it.
* **With ``emulator.mixed_chunk``** the chunk carries the running decodes, one token each, in one
  forward pass (``mixed_step_s``).
* **The first output token comes from the prefill pass** (as in SGLang/vLLM); a request stops at
  its EOS (``EmulatedEngine``'s response model: where the synthetic policy ends its turn) or at
  ``max_new_tokens``.

Public names: ``Stage``, ``EmulatedRequest``, ``ServerStatus``, ``EmulatedServer``, ``IterationLoop``.
"""

from __future__ import annotations

import asyncio
import heapq
import math
from collections import deque
from collections.abc import Callable
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from pearl.config import EmulatorSpec
from pearl.core.state import Role
from pearl.engines.base import EngineError, GenerateRequest, RequestRejectedError, ServerSpec
from pearl.engines.emulated_costs import MeasuredCosts, WorkerCosts
from pearl.engines.emulated_overheads import Overheads, Span
from pearl.engines.emulated_sched import (
    CLIP_MAX_NEW_TOKENS,
    NUM_RESERVED_DECODE_TOKENS,
    RETRACT_DECODE_STEPS,
    NewTokenRatio,
    admission_estimate,
    ratio_after_retract,
    retraction_order,
)
from pearl.engines.radix_cache import Node, RadixCache

if TYPE_CHECKING:  # the loop only needs the Clock protocol's shape; no import of the runtime
    from pearl.runtime.clock import Clock

#: output token ids of a request: (conversation, first position, count) -> ids
OutputIds = Callable[[str, int, int], tuple[int, ...]]


class Stage(StrEnum):
    """Where a request is on its server (module docstring: the life cycle)."""

    WAITING = "waiting"
    PREFILL = "prefill"
    KV_WAIT = "kv_wait"
    TRANSFER = "transfer"
    DECODE = "decode"
    OFFLOADED = "offloaded"
    DONE = "done"


class EmulatedRequest:
    """One request on the emulated servers: its stage, KV and timings.

    ``target``: tokens its current prefill covers (prompt + output kept across a retraction);
    ``node`` / ``prefix``: the radix path it holds on its worker and that path's length;
    ``owned0``: KV tokens it owned outside the tree when it joined the decode batch (it owns one
    more per decode step since); ``p_node`` / ``p_owned``: the same on a PD prefill worker until
    its KV is sent."""

    __slots__ = (
        "aborted", "attempt", "cached", "conc", "conc0", "conv", "d_worker", "decode_s", "decode_start", "dtime0",
        "finish_step", "fut", "gen0", "generated", "input_ids", "join_step", "kv_wait_s", "max_new", "node",
        "owned", "owned0", "p_node", "p_owned", "p_prefix", "p_worker", "pd", "prefill_end", "prefill_s", "prefill_start",
        "prefilled", "prefix", "queue_s", "retractions", "rid", "stage", "stop", "submit_t", "target",
        "transfer_s", "version", "workers",
    )

    def __init__(self, req: GenerateRequest, max_new: int, stop: int, pd: bool, now: float,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.rid = req.rid
        self.conv = req.conversation
        self.attempt = req.attempt
        self.input_ids = req.input_ids
        self.max_new = max_new
        self.stop = stop
        self.pd = pd
        self.cached = -1  # prefix hit of the first admission (-1: not admitted yet)
        self.prefilled = 0
        self.generated = 0
        self.target = len(req.input_ids)
        self.node: Node | None = None
        self.prefix = 0
        self.owned = 0
        self.owned0 = 0
        self.p_node: Node | None = None
        self.p_owned = 0
        self.p_prefix = 0
        self.retractions = 0
        self.stage = Stage.WAITING
        self.fut: asyncio.Future[None] = loop.create_future()
        self.submit_t = now
        self.queue_s = self.prefill_s = self.transfer_s = self.decode_s = self.kv_wait_s = 0.0
        self.prefill_start = self.prefill_end = self.decode_start = now
        self.join_step = self.gen0 = self.finish_step = 0
        self.conc0 = self.dtime0 = 0.0
        self.conc = 1.0
        self.p_worker = ""  # PD: the prefill worker (holds p_owned until the transfer is done)
        self.d_worker = ""  # PD: the decode worker
        self.version = 0
        self.aborted = False
        self.workers: list[str] = []

    @property
    def input_len(self) -> int:
        return len(self.input_ids)

    @property
    def holder(self) -> str:
        """The worker holding its KV (and, while decoding, its batch slot)."""
        return self.workers[-1]


# ----------------------------------------------------------------------------------- workers
class ServerStatus(StrEnum):
    """An emulated server's life: launching -> ready <-> released -> stopped."""

    LAUNCHING = "launching"
    READY = "ready"
    RELEASED = "released"
    STOPPED = "stopped"


class EmulatedServer:
    """One emulated server: queues, KV pool, radix cache and a driver task (owned by the engine)."""

    def __init__(self, spec: ServerSpec, capacity: int, loop: asyncio.AbstractEventLoop) -> None:
        self.id = spec.worker_id
        self.role = spec.role
        self.version = spec.weight_version
        self.status = ServerStatus.LAUNCHING
        self.fresh = True  # no weights loaded since launch (the next load is "finalization")
        self.paused = 0
        self.capacity = capacity
        self.tree = RadixCache()
        self.owned = 0  # KV tokens running requests own outside the tree
        self.ratio = NewTokenRatio()
        self.waiting: deque[EmulatedRequest] = deque()
        self.chunked: EmulatedRequest | None = None  # the request whose prompt is split over chunks
        self.kv_wait: deque[EmulatedRequest] = deque()
        self.offloaded: deque[EmulatedRequest] = deque()  # PD decode: retracted, KV on the host
        self.transferring = 0  # PD decode: admitted requests whose KV is arriving
        self.joining: list[EmulatedRequest] = []
        self.decoding: list[tuple[int, int, EmulatedRequest]] = []  # heap (finish_step, seq, req)
        self.n_decoding = 0
        self.ctx_sum = 0  # total context of decoding requests at ``steps``
        self.steps = 0  # decode iterations executed so far
        self.conc_cum = 0.0  # integral of batch size over decode time
        self.dtime_cum = 0.0  # decode time so far
        self.seq = 0
        self.span: tuple[float, int, int, Span] | None = None
        self.wake: asyncio.Future[None] = loop.create_future()
        self.driver: asyncio.Task[None] | None = None
        self.events = 0  # spans + chunks simulated (for the events/s figure)
        # token / time split (paper Sec. 3.2): busy seconds and tokens per phase
        self.prefill_busy_s = 0.0
        self.decode_busy_s = 0.0
        self.prefill_tokens = 0  # prompt tokens computed by prefill chunks
        self.cached_tokens = 0  # prompt tokens served from the prefix cache at admission
        self.decode_tokens = 0  # tokens generated by decode iterations
        self.sched_s = 0.0  # engine time beyond the kernels (scheduler, launches, host copies)
        self.retracted = 0  # requests retracted
        self.retracted_tokens = 0  # KV tokens they gave up (colocated: computed again later)

    def poke(self) -> None:
        if not self.wake.done():
            self.wake.set_result(None)

    def launched(self, driver: asyncio.Task[None]) -> None:
        """Its launch finished: ready, its iterations run in ``driver``."""
        self.status = ServerStatus.READY
        self.driver = driver

    def launch_failed(self) -> None:
        """Its launch failed or was cancelled: stopped, it never serves."""
        self.status = ServerStatus.STOPPED

    @property
    def kv_used(self) -> int:
        return self.tree.size + self.owned

    @property
    def available(self) -> int:
        return self.capacity - self.tree.size - self.owned

    @property
    def load(self) -> int:
        return (len(self.waiting) + len(self.kv_wait) + len(self.offloaded) + self.transferring
                + (self.chunked is not None) + len(self.joining) + self.n_decoding)


# ------------------------------------------------------------------------------ iterations
class IterationLoop:
    """Every server's iterations (module docstring): admission, prefill batches, decode spans.

    Shared with the engine that owns it: ``inflight`` (request id -> request), ``servers`` (worker
    id -> server), ``crashes`` (driver errors), ``iteration_log`` (decode spans as
    ``IterationRecord``; None: not kept); ``abort_worker`` ends a crashed server's requests;
    ``output_ids`` gives a request's output tokens (the radix cache stores them)."""

    def __init__(self, clock: Clock, emu: EmulatorSpec, costs: WorkerCosts | MeasuredCosts, overheads: Overheads,
                 inflight: dict[str, EmulatedRequest], servers: dict[str, EmulatedServer], crashes: list[str],
                 iteration_log: list[Any] | None, abort_worker: Callable[[EmulatedServer], None],
                 output_ids: OutputIds) -> None:
        self.clock = clock
        self.emu = emu
        self.costs = costs
        self.overheads = overheads
        self._inflight = inflight
        self._workers = servers
        self.crashes = crashes
        self.iteration_log = iteration_log
        self._abort_worker = abort_worker
        self._output_ids = output_ids

    # ------------------------------------------------------------------ KV and the radix cache
    def flush_cache(self, w: EmulatedServer) -> None:
        """SGLang's ``flush_cache`` (a weight update, a memory release, a role change): the tree
        emptied; only valid once every request on ``w`` has ended (the engine aborts them first)."""
        w.tree.reset()
        w.ratio.reset()

    def _alloc(self, w: EmulatedServer, tokens: int) -> None:
        """``tokens`` more owned by a request on ``w``; the tree is evicted for them as needed."""
        w.owned += tokens
        short = -w.available
        if short > 0:
            w.tree.evict(short)

    def _insert_finished(self, w: EmulatedServer, r: EmulatedRequest, kv_tokens: int) -> None:
        """``cache_finished_req`` for the KV ``r`` holds on ``w`` (``r.node``, ``r.prefix``,
        ``r.owned``): the first ``kv_tokens`` of prompt + output enter the tree (a PD decode worker
        keeps none), ``r``'s own copies are freed and its path unlocked."""
        now = self.clock.now()
        node = r.node
        if w.role is not Role.DECODE and w.status is ServerStatus.READY and node is not None and kv_tokens > r.prefix:
            n_in = min(kv_tokens, r.input_len)
            _, last = w.tree.insert(r.input_ids, now, start=node, offset=r.prefix, limit=n_in)
            if kv_tokens > n_in:
                w.tree.insert(self._output_ids(r.conv, r.input_len, kv_tokens - r.input_len), now, start=last)
        w.owned -= r.owned
        r.owned = 0
        if node is not None:
            w.tree.unlock(node)
            r.node = None
        r.prefix = 0
        short = -w.available
        if short > 0:  # duplicates were freed; what is new may need room
            w.tree.evict(short)
        w.poke()

    def _refuse(self, w: EmulatedServer, r: EmulatedRequest, need: int) -> None:
        """``r`` needs more KV than ``w``'s whole pool: it fails with an error naming both."""
        r.stage = Stage.DONE
        self._inflight.pop(r.rid, None)
        if not r.fut.done():
            r.fut.set_exception(RequestRejectedError(w.id, f"request {r.rid} needs {need} KV tokens, the worker "
                                                           f"holds {w.capacity}; shorten the trajectory limit", 400))

    def release_prefill_kv(self, r: EmulatedRequest) -> None:
        """PD: the prompt's KV is sent; the prefill worker inserts the prompt into its tree and
        frees its copy (``r.p_*``); what ``r`` holds on its decode worker is left as it is."""
        if r.p_node is None and not r.p_owned:
            return
        p = self._workers.get(r.p_worker)
        held = (r.node, r.owned, r.prefix)
        r.node, r.owned, r.prefix = r.p_node, r.p_owned, r.p_prefix
        r.p_node, r.p_owned, r.p_prefix = None, 0, 0
        if p is not None:
            self._insert_finished(p, r, r.input_len)
        r.node, r.owned, r.prefix = held

    # ------------------------------------------------------------------ admission
    def _running_offset(self, w: EmulatedServer) -> float:
        """``sum_running ratio min(M_i - o_i, CLIP)`` (the decode batch's estimated growth)."""
        if not w.n_decoding and not w.joining:
            return 0.0
        steps = w.steps
        total = 0
        for _, _, r in w.decoding:
            if r.join_step >= 0:
                total += min(max(r.max_new - (r.gen0 + steps - r.join_step), 0), CLIP_MAX_NEW_TOKENS)
        for r in w.joining:
            total += admission_estimate(r)
        return w.ratio.current * total

    def _form_prefill(self, w: EmulatedServer, now: float) -> list[tuple[EmulatedRequest, int]]:
        """SGLang's ``get_new_batch_prefill`` with ``PrefillAdder``: the chunked request's next
        chunk, then FCFS admissions while the chunk, the running cap and the KV estimate allow."""
        budget = self.emu.chunk_tokens
        parts: list[tuple[EmulatedRequest, int]] = []
        if w.chunked is not None:  # its next chunk first (add_chunked_req), then admissions in what is left
            r = w.chunked
            x = min(r.target - r.prefix - r.prefilled, budget)
            parts.append((r, x))
            budget -= x
        if budget <= 0 or not w.waiting or w.role is Role.DECODE:
            return parts
        running = w.n_decoding + len(w.joining)
        avail = w.available  # allocation happens after the round (prepare_for_extend)
        offset = self._running_offset(w)
        while w.waiting and budget > 0:
            r = w.waiting[0]
            if r.target >= w.capacity:  # can never fit, even alone (SGLang refuses it as too long)
                w.waiting.popleft()
                self._refuse(w, r, r.target + 1)
                continue
            if running + len(parts) >= self.emu.max_running:
                break
            limit = r.input_len - 1 if r.target == r.input_len else r.input_len  # >= 1 token computed
            hit, node = w.tree.match(r.input_ids, now, limit=limit)
            w.tree.lock(node)  # pinned for the check (not evictable), kept if admitted
            extend = r.target - hit
            est = 1 if w.role is Role.PREFILL else admission_estimate(r)
            if extend + est >= avail + w.tree.evictable - offset:  # check_prefill: total < remaining_total
                w.tree.unlock(node)
                break
            w.waiting.popleft()
            offset += extend + est
            r.node, r.prefix, r.prefilled = node, hit, 0
            if r.cached < 0:
                r.cached = hit
                w.cached_tokens += hit
            r.stage = Stage.PREFILL
            r.queue_s += now - r.submit_t
            r.prefill_start = now
            x = min(extend, budget)
            parts.append((r, x))
            budget -= x
            if x < extend:
                w.chunked = r
                break
        return parts

    # ------------------------------------------------------------------ the driver
    async def drive(self, w: EmulatedServer) -> None:
        """Runs ``_drive_loop``; a bug in it must not hang the requests: they end as aborted (with
        their partial output), the worker is marked dead and the error is kept in ``crashes``."""
        try:
            await self._drive_loop(w)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.crashes.append(f"worker {w.id}: {type(e).__name__}: {e}")
            w.status = ServerStatus.STOPPED
            self._abort_worker(w)

    async def _drive_loop(self, w: EmulatedServer) -> None:
        """Per-worker event loop: admit, then one prefill batch or one decode span, and repeat."""
        loop = asyncio.get_running_loop()
        while True:
            if w.wake.done():
                w.wake = loop.create_future()
            now = self.clock.now()
            if w.paused or w.status is not ServerStatus.READY:
                await w.wake
                continue
            if w.role is Role.DECODE:
                await self._admit_decode(w, now)
            if w.joining:
                for r in w.joining:
                    self._join_decode(w, r, now)
                w.joining.clear()
            parts = self._form_prefill(w, now)
            if parts:
                await self._prefill_chunk(w, parts, now)
                continue
            if w.n_decoding:
                await self._decode_span(w, now)
                continue
            if not w.waiting and w.chunked is None and not w.kv_wait and not w.offloaded:
                w.ratio.reset()  # idle (self_check_during_idle)
            await w.wake

    async def _prefill_chunk(self, w: EmulatedServer, parts: list[tuple[EmulatedRequest, int]], now: float) -> None:
        """Run one prefill batch (``parts``: request, new tokens), then move each request on: an
        unfinished prompt is inserted and held (``cache_unfinished_req``), a finished one emits
        its first token and decodes here (colocated) or waits for its transfer (PD prefill)."""
        chunk = [(x, r.prefix + r.prefilled) for r, x in parts]
        for r, x in parts:
            self._alloc(w, x)
            r.owned += x
        kernels = self.costs.prefill_chunk_s(chunk)
        mixed = self.emu.mixed_chunk and w.n_decoding > 0
        if mixed:  # the running decodes ride along, one token each (module docstring)
            self._alloc(w, w.n_decoding)
            kernels = self.costs.mixed_step_s(chunk, w.n_decoding, w.ctx_sum)
        extra = self.overheads.extend_s(len(parts), sum(c + x for x, c in chunk), kernels)
        dt = kernels + extra
        w.events += 1
        w.sched_s += extra
        await self.clock.sleep(dt)
        end = self.clock.now()
        pre = dt if not mixed else dt - (self.costs.mixed_step_s(chunk, w.n_decoding, w.ctx_sum)
                                         - self.costs.prefill_chunk_s(chunk))
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
            if r.stage is not Stage.PREFILL:
                continue  # aborted meanwhile (its KV was freed then)
            r.prefilled += x
            done = r.prefix + r.prefilled
            if done < r.target:  # cache_unfinished_req: the computed prompt enters the tree, held
                self._hold_prefix(w, r, min(done, r.input_len), end)
                continue
            if w.chunked is r:
                w.chunked = None
            r.prefill_end = end
            r.prefill_s += end - r.prefill_start
            r.generated += 1  # the prefill pass emits a token
            if r.pd:
                r.p_node, r.p_owned, r.p_prefix = r.node, r.owned, r.prefix
                r.node, r.owned, r.prefix = None, 0, 0
                r.stage = Stage.KV_WAIT
                if r.generated >= r.stop:
                    self.release_prefill_kv(r)
                    r.stage = Stage.DONE
                    self._inflight.pop(r.rid, None)
                r.fut.set_result(None)
            elif r.generated >= r.stop:
                self._insert_finished(w, r, r.target)
                r.stage = Stage.DONE
                self._inflight.pop(r.rid, None)
                r.fut.set_result(None)
            else:
                self._join_decode(w, r, end)

    def _hold_prefix(self, w: EmulatedServer, r: EmulatedRequest, upto: int, now: float) -> None:
        """Insert ``r``'s prompt up to ``upto`` below its held path and hold the new path instead."""
        if upto <= r.prefix or r.node is None:
            return
        _, node = w.tree.insert(r.input_ids, now, start=r.node, offset=r.prefix, limit=upto)
        w.tree.lock(node)
        w.tree.unlock(r.node)
        moved = upto - r.prefix  # now the tree's (or freed, where another request had inserted them)
        r.owned -= moved
        w.owned -= moved
        r.node, r.prefix, r.prefilled = node, upto, r.prefilled - moved

    # ------------------------------------------------------------------ decode batch
    def _join_decode(self, w: EmulatedServer, r: EmulatedRequest, now: float) -> None:
        r.stage = Stage.DECODE
        r.decode_start = now
        r.join_step = w.steps
        r.gen0 = r.generated
        r.owned0 = r.owned
        r.finish_step = w.steps + (r.stop - r.generated)
        r.conc0 = w.conc_cum
        r.dtime0 = w.dtime_cum
        w.seq += 1
        heapq.heappush(w.decoding, (r.finish_step, w.seq, r))
        w.n_decoding += 1
        w.ctx_sum += r.input_len + r.generated

    def leave_decode(self, w: EmulatedServer, r: EmulatedRequest, now: float) -> None:
        """Remove ``r`` from the batch (lazy heap deletion) after bringing its count up to date;
        ``r.owned``: the KV it holds as ``w.owned`` counts it (the span in progress is not)."""
        steps = w.steps
        if w.span is not None:
            t0, k_max, base_steps, span = w.span
            steps = base_steps + span.within(now - t0, k_max)
        r.generated = r.gen0 + (steps - r.join_step)
        w.decode_tokens += steps - w.steps  # its tokens of the span in progress (the span counts the others')
        dtime = w.dtime_cum - r.dtime0
        r.conc = (w.conc_cum - r.conc0) / dtime if dtime > 0 else float(max(w.n_decoding, 1))
        r.owned = r.owned0 + (w.steps - r.join_step)
        w.n_decoding -= 1
        w.ctx_sum -= r.input_len + r.gen0 + (w.steps - r.join_step)
        r.join_step = -1  # marks "left" for the lazy heap

    def _finish(self, w: EmulatedServer, r: EmulatedRequest, now: float) -> None:
        r.generated = r.stop
        dtime = w.dtime_cum - r.dtime0
        r.conc = (w.conc_cum - r.conc0) / dtime if dtime > 0 else 1.0
        r.decode_s += now - r.decode_start
        r.owned = r.owned0 + (r.stop - r.gen0)
        w.n_decoding -= 1
        w.ctx_sum -= r.input_len + r.stop
        r.join_step = -1
        self._insert_finished(w, r, r.input_len + r.stop - 1)
        r.stage = Stage.DONE
        self._inflight.pop(r.rid, None)
        if not r.fut.done():
            r.fut.set_result(None)

    def _running(self, w: EmulatedServer) -> list[EmulatedRequest]:
        """The decode batch, each request's ``generated`` brought up to ``w.steps``."""
        out = []
        for _, _, r in w.decoding:
            if r.join_step >= 0:
                r.generated = r.gen0 + (w.steps - r.join_step)
                out.append(r)
        return out

    async def _retract(self, w: EmulatedServer, now: float) -> None:
        """``update_running_batch`` when the next step does not fit (``emulated_sched``): retract
        until it does; colocated requests go back to the waiting queue, a PD decode worker's are
        offloaded to host memory (the copy stalls the worker)."""
        reqs = self._running(w)
        keep = retraction_order(reqs)
        out: list[EmulatedRequest] = []
        first = True
        while first or w.available + w.tree.evictable < len(keep):
            if len(keep) <= 1:
                break
            first = False
            r = reqs[keep.pop()]
            self.leave_decode(w, r, now)
            r.decode_s += now - r.decode_start
            w.owned -= r.owned
            w.retracted += 1
            w.retracted_tokens += r.owned + r.prefix
            if r.node is not None:
                w.tree.unlock(r.node)
                r.node = None
            r.prefix = 0
            w.tree.evict(len(keep) * RETRACT_DECODE_STEPS)
            r.retractions += 1
            out.append(r)
        if len(keep) <= 1 and keep and w.available + w.tree.evictable < len(keep):
            r = reqs[keep.pop()]  # even alone it does not fit: SGLang aborts it (out of memory)
            self.leave_decode(w, r, now)
            w.owned -= r.owned
            r.owned = 0
            if r.node is not None:
                w.tree.unlock(r.node)
                r.node = None
            r.stage = Stage.DONE
            self._inflight.pop(r.rid, None)
            r.fut.set_exception(EngineError(w.id, f"request {r.rid} alone outgrows the KV pool of {w.capacity} "
                                                  "tokens; shorten the trajectory limit"))
        w.ratio.retracted(ratio_after_retract([reqs[i] for i in keep]))
        copy = 0
        for r in out:
            if w.role is Role.DECODE:
                r.stage = Stage.OFFLOADED
                copy += r.owned
                w.offloaded.append(r)
            else:
                r.stage = Stage.WAITING
                r.target = r.input_len + r.generated
                r.prefilled = r.owned = 0
                r.submit_t = now
                w.waiting.append(r)
        if copy:
            dt = self.overheads.host_copy_s(copy)
            w.sched_s += dt
            w.events += 1
            await self.clock.sleep(dt)

    async def _admit_decode(self, w: EmulatedServer, now: float) -> None:
        """A PD decode worker's ``DecodePreallocQueue`` (``emulated_sched``): offloaded requests
        resume first (their KV copied back), then transferred ones are admitted FIFO while
        ``prompt + 512 <= available - 512 x active`` (less what the offloaded ones need)."""
        active = w.n_decoding + len(w.joining) + w.transferring
        copy = 0
        while w.offloaded and active < self.emu.max_running:
            r = w.offloaded[0]
            if r.owned + NUM_RESERVED_DECODE_TOKENS > w.available - NUM_RESERVED_DECODE_TOKENS * active:
                break
            w.offloaded.popleft()
            self._alloc(w, r.owned)
            copy += r.owned
            r.stage = Stage.DECODE
            w.joining.append(r)
            active += 1
        if copy:
            dt = self.overheads.host_copy_s(copy)
            w.sched_s += dt
            w.events += 1
            await self.clock.sleep(dt)
            now = self.clock.now()
        pending = sum(r.owned + NUM_RESERVED_DECODE_TOKENS for r in w.offloaded)
        while w.kv_wait and active < self.emu.max_running:
            r = w.kv_wait[0]
            if r.input_len + NUM_RESERVED_DECODE_TOKENS > w.capacity:  # can never fit
                w.kv_wait.popleft()
                self.release_prefill_kv(r)
                self._refuse(w, r, r.input_len + NUM_RESERVED_DECODE_TOKENS)
                continue
            if r.input_len + NUM_RESERVED_DECODE_TOKENS > (w.available - NUM_RESERVED_DECODE_TOKENS * active
                                                            - pending):
                break
            w.kv_wait.popleft()
            self._alloc(w, r.input_len)
            r.owned = len(r.input_ids)
            r.stage = Stage.TRANSFER
            w.transferring += 1
            active += 1
            r.kv_wait_s = now - r.prefill_end
            r.queue_s += r.kv_wait_s
            if not r.fut.done():
                r.fut.set_result(None)

    def _admission_opens(self, w: EmulatedServer, now: float) -> int | None:
        """Decode steps after which the waiting head fits the estimate rule as ``new_token_ratio``
        decays (``budget(k) = A - n k + E_v - ratio(k) sum est_i``; None: not within this span)."""
        if w.role is Role.DECODE or not w.waiting or w.chunked is not None:
            return None
        n = w.n_decoding
        if n + len(w.joining) >= self.emu.max_running:
            return None
        r = w.waiting[0]
        limit = r.input_len - 1 if r.target == r.input_len else r.input_len
        hit, _ = w.tree.match(r.input_ids, now, limit=limit)
        need = r.target - hit + admission_estimate(r)
        ratio = w.ratio
        if ratio.current <= 0:
            return None
        est = self._running_offset(w) / ratio.current
        gain = ratio.decay * est - n  # tokens of budget gained per step
        if gain <= 0:
            return None
        gap = need + ratio.current * est - w.available - w.tree.evictable
        k = max(math.floor(gap / gain) + 1, 1)
        return k if ratio.current - k * ratio.decay >= ratio.min else None

    async def _decode_span(self, w: EmulatedServer, now: float) -> None:
        # drop lazily-deleted heap heads
        while w.decoding and w.decoding[0][2].join_step < 0:
            heapq.heappop(w.decoding)
        if not w.decoding:
            return
        n = w.n_decoding
        room = w.available + w.tree.evictable
        if room < n:  # check_decode_mem failed
            await self._retract(w, now)
            return
        k_max = min(w.decoding[0][0] - w.steps, room // n)
        opens = self._admission_opens(w, now)
        if opens is not None:
            k_max = min(k_max, opens)
        blocked = bool(w.waiting) or bool(w.kv_wait) or bool(w.offloaded)  # already tried: cannot enter now
        ctx0 = w.ctx_sum
        base = self.costs.span(n, ctx0, k_max)
        span = self.overheads.decode_span(base, n, k_max)
        w.span = (now, k_max, w.steps, span)
        w.events += 1
        full = span.total(k_max)
        loop = asyncio.get_running_loop()
        k = k_max
        while await self.clock.wait(w.wake, now + full):
            if ((w.waiting and not blocked) or w.joining or (w.kv_wait and not blocked) or w.paused
                    or w.status is not ServerStatus.READY or w.n_decoding != n):
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
        w.conc_cum += dt * n  # the batch the span ran at (a request aborted in it left at its cut)
        w.decode_busy_s += dt
        if span is not base:
            w.sched_s += max(dt - base.total(k), 0.0)
        w.decode_tokens += w.n_decoding * k
        w.steps += k
        w.ctx_sum += w.n_decoding * k
        w.owned += w.n_decoding * k
        short = -w.available
        if short > 0:
            w.tree.evict(short)
        w.ratio.decay_steps(k)
        self._log_span(w, n, ctx0, k, now, end)
        self._finish_due(w, end)

    def _finish_due(self, w: EmulatedServer, end: float) -> None:
        """Finish the decoding requests whose last token is out by ``w.steps`` (and drop left ones)."""
        while w.decoding and (w.decoding[0][2].join_step < 0 or w.decoding[0][0] <= w.steps):
            _, _, r = heapq.heappop(w.decoding)
            if r.join_step >= 0:
                self._finish(w, r, end)

    # ------------------------------------------------------------------ aborts
    def abort_request(self, r: EmulatedRequest) -> None:
        """End ``r`` now with the tokens completed so far: every queue it sits in, the KV it holds
        on each worker (computed tokens enter the radix cache, as a finished request's do)."""
        if r.stage is Stage.DONE:
            return
        now = self.clock.now()
        stage = r.stage
        for wid in r.workers:
            w = self._workers.get(wid)
            if w is None:
                continue
            if r in w.waiting:
                w.waiting.remove(r)
            if r in w.kv_wait:
                w.kv_wait.remove(r)
            if r in w.offloaded:
                w.offloaded.remove(r)
                r.owned = 0  # its KV sits in host memory
            if r in w.joining:
                w.joining.remove(r)
                r.join_step = -1
            w.poke()
        holder = self._workers.get(r.holder) if r.workers else None
        if holder is not None:
            if stage is Stage.PREFILL:
                if holder.chunked is r:
                    holder.chunked = None
                self._insert_finished(holder, r, r.prefix + r.prefilled)
            elif stage is Stage.DECODE and r.join_step >= 0:
                self.leave_decode(holder, r, now)
                r.decode_s += now - r.decode_start
                self._insert_finished(holder, r, r.input_len + r.generated - 1)
            elif stage is Stage.DECODE or stage is Stage.TRANSFER:
                if stage is Stage.TRANSFER:
                    holder.transferring -= 1
                self._insert_finished(holder, r, 0)
        self.release_prefill_kv(r)
        r.aborted = True
        r.stage = Stage.DONE
        if not r.fut.done():
            r.fut.set_result(None)

    def _log_span(self, w: EmulatedServer, n: int, context: int, k: int, start: float, end: float) -> None:
        """Log ``k`` decode iterations of ``w`` at the batch ``n`` and total context ``context`` the
        span started with: its cost. A request that leaves in the span (an abort) leaves at its
        cut, so every iteration of it ran at that batch, whatever the batch is after it."""
        if self.iteration_log is not None and k > 0:
            from pearl.core.telemetry import IterationRecord

            self.iteration_log.append(IterationRecord(w.id, w.role.value, n, float(context), 0, start, end, k))
