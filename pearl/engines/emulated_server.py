"""One emulated server's state machine: its queues, KV pool, prefix cache, decode batch and driver.

``EmulatedServer`` holds one worker's state, ``EmulatedRequest`` one request's, and
``IterationLoop`` runs every server's iterations over them (the engine, ``pearl.engines.emulated``,
owns the servers and the API; this module owns the invariants, e.g. "a reservation is freed
exactly once"). Only time is modelled; the costs come from the engine's cost model
(``MeasuredCosts`` or ``WorkerCosts``).

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

Public names: ``Stage``, ``EmulatedRequest``, ``ServerStatus``, ``EmulatedServer``, ``IterationLoop``.
"""

from __future__ import annotations

import asyncio
import heapq
from collections import OrderedDict, deque
from collections.abc import Callable
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from pearl.config import EmulatorSpec
from pearl.core.state import Role
from pearl.engines.base import EngineError, GenerateRequest, ServerSpec
from pearl.engines.emulated_costs import LineSpan, MeasuredCosts, WorkerCosts
from pearl.engines.emulated_tables import TableSpan

if TYPE_CHECKING:  # the loop only needs the Clock protocol's shape; no import of the runtime
    from pearl.runtime.clock import Clock


class Stage(StrEnum):
    """Where a request is on its server (module docstring: the life cycle)."""

    WAITING = "waiting"
    PREFILL = "prefill"
    KV_WAIT = "kv_wait"
    TRANSFER = "transfer"
    DECODE = "decode"
    DONE = "done"


class EmulatedRequest:
    """One request on the emulated servers: its stage, reservations and timings."""

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
        self.stage = Stage.WAITING
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
class ServerStatus(StrEnum):
    """An emulated server's life: launching -> ready <-> released -> stopped."""

    LAUNCHING = "launching"
    READY = "ready"
    RELEASED = "released"
    STOPPED = "stopped"


class EmulatedServer:
    """One emulated server: queues, KV pool, prefix cache and a driver task (owned by the engine)."""

    def __init__(self, spec: ServerSpec, capacity: int, loop: asyncio.AbstractEventLoop) -> None:
        self.id = spec.worker_id
        self.role = spec.role
        self.version = spec.weight_version
        self.status = ServerStatus.LAUNCHING
        self.fresh = True  # no weights loaded since launch (the next load is "finalization")
        self.paused = 0
        self.capacity = capacity
        self.kv_used = 0
        self.cache: OrderedDict[str, tuple[int, int, int]] = OrderedDict()  # conv -> (len, first, last)
        self.cache_tokens = 0
        self.waiting: deque[EmulatedRequest] = deque()
        self.kv_wait: deque[EmulatedRequest] = deque()
        self.prefilling: list[EmulatedRequest] = []
        self.joining: list[EmulatedRequest] = []
        self.decoding: list[tuple[int, int, EmulatedRequest]] = []  # heap (finish_step, seq, req)
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

    def launched(self, driver: asyncio.Task[None]) -> None:
        """Its launch finished: ready, its iterations run in ``driver``."""
        self.status = ServerStatus.READY
        self.driver = driver

    def launch_failed(self) -> None:
        """Its launch failed or was cancelled: stopped, it never serves."""
        self.status = ServerStatus.STOPPED

    @property
    def load(self) -> int:
        return len(self.waiting) + len(self.kv_wait) + len(self.prefilling) + len(self.joining) + self.n_decoding


# ------------------------------------------------------------------------------ iterations
class IterationLoop:
    """Every server's iterations (module docstring): admission, prefill chunks, decode spans.

    Shared with the engine that owns it: ``inflight`` (request id -> request), ``servers`` (worker
    id -> server), ``crashes`` (driver errors), ``iteration_log`` (decode spans as
    ``IterationRecord``; None: not kept); ``abort_worker`` ends a crashed server's requests."""

    def __init__(self, clock: Clock, emu: EmulatorSpec, costs: WorkerCosts | MeasuredCosts,
                 reuse: dict[Role, float], kv_reserve: float, trajectory_tokens: int,
                 inflight: dict[str, EmulatedRequest], servers: dict[str, EmulatedServer], crashes: list[str],
                 iteration_log: list[Any] | None, abort_worker: Callable[[EmulatedServer], None]) -> None:
        self.clock = clock
        self.emu = emu
        self.costs = costs
        self._reuse = reuse
        self._kv_reserve = kv_reserve
        self._traj_tokens = trajectory_tokens
        self._inflight = inflight
        self._workers = servers
        self.crashes = crashes
        self.iteration_log = iteration_log
        self._abort_worker = abort_worker

    def flush_cache(self, w: EmulatedServer) -> None:
        w.cache.clear()
        w.cache_tokens = 0

    def free(self, w: EmulatedServer, r: EmulatedRequest, cache_len: int) -> None:
        """Release ``r``'s reservation on ``w``; keep ``cache_len`` tokens of its context as the
        conversation's prefix entry (not on decode workers)."""
        w.kv_used -= r.reserved
        r.reserved = 0
        self._cache(w, r, cache_len)
        w.poke()

    def _cache(self, w: EmulatedServer, r: EmulatedRequest, cache_len: int) -> None:
        if cache_len <= 0 or w.status is not ServerStatus.READY or w.role is Role.DECODE:
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

    def release_prefill_kv(self, r: EmulatedRequest) -> None:
        """PD: free the prompt's KV on the prefill worker (kept as the conversation's prefix)."""
        if not r.p_reserved:
            return
        p = self._workers.get(r.p_worker)
        if p is not None:
            p.kv_used -= r.p_reserved
            self._cache(p, r, r.input_len)
            p.poke()
        r.p_reserved = 0

    def _make_room(self, w: EmulatedServer, need: int, keep: str) -> bool:
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

    def decode_need(self, r: EmulatedRequest, capacity: int) -> int:
        """KV tokens a decoding request reserves: ``p + r + floor(rho (K - p - r))`` for a prompt of p
        tokens and r to generate, ``rho = EmulatorPhysics.decode_kv_reserve``, ``K`` the
        trajectory limit; never above ``capacity`` unless ``p + r`` alone is."""
        exact = r.input_len + r.max_new
        if self._kv_reserve <= 0.0 or self._traj_tokens <= exact:
            return exact
        return max(exact, min(exact + int(self._kv_reserve * (self._traj_tokens - exact)), capacity))

    def _admit(self, w: EmulatedServer, now: float) -> None:
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
            need = r.input_len + (self.decode_need(r, w.capacity) - r.input_len if w.role is Role.COLOCATED else 0)
            need_extra = need - (entry[0] if entry is not None else 0)  # the entry is consumed either way
            if need > w.capacity:
                w.waiting.popleft()
                self._inflight.pop(r.rid, None)
                r.stage = Stage.DONE
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
            r.stage = Stage.PREFILL
            r.queue_s = now - r.submit_t
            r.prefill_start = now
            w.prefilling.append(r)
        while w.kv_wait and w.role is Role.DECODE:
            r = w.kv_wait[0]
            need = self.decode_need(r, w.capacity)
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
    def _join_decode(self, w: EmulatedServer, r: EmulatedRequest, now: float) -> None:
        r.stage = Stage.DECODE
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

    def leave_decode(self, w: EmulatedServer, r: EmulatedRequest, now: float) -> None:
        """Remove ``r`` from the batch (lazy heap deletion) after bringing its count up to date."""
        steps = w.steps
        if w.span is not None:
            t0, k_max, base_steps, span = w.span
            steps = base_steps + span.within(now - t0, k_max)
        r.generated = r.gen0 + (steps - r.join_step)
        w.decode_tokens += steps - w.steps  # its tokens of the span in progress (the span counts the others')
        dtime = w.dtime_cum - r.dtime0
        r.conc = (w.conc_cum - r.conc0) / dtime if dtime > 0 else float(max(w.n_decoding, 1))
        w.n_decoding -= 1
        w.ctx_sum -= r.input_len + r.gen0 + (w.steps - r.join_step)
        r.join_step = -1  # marks "left" for the lazy heap

    def _finish(self, w: EmulatedServer, r: EmulatedRequest, now: float) -> None:
        r.generated = r.max_new
        dtime = w.dtime_cum - r.dtime0
        r.conc = (w.conc_cum - r.conc0) / dtime if dtime > 0 else 1.0
        r.decode_s = now - r.decode_start
        w.n_decoding -= 1
        w.ctx_sum -= r.input_len + r.max_new
        r.join_step = -1
        self.free(w, r, cache_len=0 if r.pd else r.input_len + r.generated)
        r.stage = Stage.DONE
        self._inflight.pop(r.rid, None)
        if not r.fut.done():
            r.fut.set_result(None)

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
        """Per-worker event loop: admit, then one prefill chunk or one decode span, and repeat."""
        loop = asyncio.get_running_loop()
        while True:
            if w.wake.done():
                w.wake = loop.create_future()
            now = self.clock.now()
            if w.paused or w.status is not ServerStatus.READY:
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

    async def _prefill_chunk(self, w: EmulatedServer, now: float) -> None:
        budget = self.emu.chunk_tokens
        parts: list[tuple[EmulatedRequest, int]] = []
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
            if r.stage is not Stage.PREFILL:
                continue  # aborted meanwhile
            r.prefilled += x
            if r.cached + r.prefilled >= r.input_len:
                w.prefilling.remove(r)
                r.prefill_end = end
                r.prefill_s = end - r.prefill_start
                r.generated = 1  # the prefill pass emits the first token
                if r.pd:
                    r.p_reserved, r.reserved = r.reserved, 0
                    r.stage = Stage.KV_WAIT
                    if r.max_new <= 1:
                        self.release_prefill_kv(r)
                        r.stage = Stage.DONE
                        self._inflight.pop(r.rid, None)
                    r.fut.set_result(None)
                elif r.max_new <= 1:
                    self.free(w, r, cache_len=r.input_len + 1)
                    r.stage = Stage.DONE
                    self._inflight.pop(r.rid, None)
                    r.fut.set_result(None)
                else:
                    self._join_decode(w, r, end)

    async def _decode_span(self, w: EmulatedServer, now: float) -> None:
        # drop lazily-deleted heap heads
        while w.decoding and w.decoding[0][2].join_step < 0:
            heapq.heappop(w.decoding)
        if not w.decoding:
            return
        n, ctx0 = w.n_decoding, w.ctx_sum
        k_max = w.decoding[0][0] - w.steps
        span = self.costs.span(n, ctx0, k_max)
        w.span = (now, k_max, w.steps, span)
        w.events += 1
        full = span.total(k_max)
        loop = asyncio.get_running_loop()
        k = k_max
        while await self.clock.wait(w.wake, now + full):
            if w.waiting or w.joining or w.kv_wait or w.paused or w.status is not ServerStatus.READY or (
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
        w.conc_cum += dt * n  # the batch the span ran at (a request aborted in it left at its cut)
        w.decode_busy_s += dt
        w.decode_tokens += w.n_decoding * k
        w.steps += k
        w.ctx_sum += w.n_decoding * k
        self._log_span(w, n, ctx0, k, now, end)
        self._finish_due(w, end)

    def _finish_due(self, w: EmulatedServer, end: float) -> None:
        """Finish the decoding requests whose last token is out by ``w.steps`` (and drop left ones)."""
        while w.decoding and (w.decoding[0][2].join_step < 0 or w.decoding[0][0] <= w.steps):
            _, _, r = heapq.heappop(w.decoding)
            if r.join_step >= 0:
                self._finish(w, r, end)

    def _log_span(self, w: EmulatedServer, n: int, context: int, k: int, start: float, end: float) -> None:
        """Log ``k`` decode iterations of ``w`` at the batch ``n`` and total context ``context`` the
        span started with: its cost. A request that leaves in the span (an abort) leaves at its
        cut, so every iteration of it ran at that batch, whatever the batch is after it."""
        if self.iteration_log is not None and k > 0:
            from pearl.core.telemetry import IterationRecord

            self.iteration_log.append(IterationRecord(w.id, w.role.value, n, float(context), 0, start, end, k))
