"""Pipeline Scheduler (paper Sec. 4.1.1): rollout batches of multi-turn trajectories.

Life cycle (one owner task, ``run``; every trajectory task belongs to its batch)::

    for r = 0, 1, 2, ...:
        wait until trainer_version >= r - max_staleness        (bounded staleness)
        start B trajectories (B / G GRPO groups of G samples, one AgentSession each)
        each trajectory, turn after turn:
            context += TurnInput.prompt_ids
            route -> colocated worker | prefill worker -> KV transfer -> decode worker
            aborted?  keep the partial output, resume with prompt + partial (resume.py) on the
                      next route: nothing lost, nothing generated twice
            response -> session.step (env time) -> next TurnInput | EpisodeEnd
            one TelemetryRecord per turn -> RuntimeTracker
        batch done -> ``hooks.batch_done(r, records)`` (profile refit) -> queue for the trainer

Hooks (``PipelineHooks``, given to the constructor, each optional): ``batch_started(r)`` as batch
``r`` starts (the controller records its batch forecast), ``batch_done(r, records)`` awaited
before the batch is queued, ``worker_failed(worker_id, reason)`` when a worker died or could not
load weights (it is no longer dispatchable; the controller removes it from the topology),
``trajectory_done(record)`` on every completion (the journal). A restarted run passes a
``Resume``: trajectories completed before the restart are handed on as journaled (never generated
again) and the batches the trainer already consumed are skipped. ``weights``: the ``(version,
path)`` the run starts on (the trainer's version until it publishes a newer one).

Staleness: rollout batch ``r`` is admitted once the trainer has published version
``>= r - max_staleness``; every request is served with the weights the worker holds, and the
trajectory's ``policy_version`` is the oldest version that produced any of its tokens.

Routing: ``pearl.runtime.router`` (``Router``: dispatchable workers, least-loaded with conversation
affinity, same-node PD pairs); the pipeline acquires a ``Route`` per turn and releases it after.

Interruption: ``evict(worker_id)`` stops dispatch to a worker and aborts its in-flight requests;
each returns ``finish_reason=abort`` with its partial output, which the turn keeps and resumes
elsewhere. ``sync_weights(version, path)`` pauses dispatch, aborts in-flight requests, loads the
new weights on every dispatchable worker and resumes (ROLL's partial-rollout model update).

Public names: ``PipelineScheduler``, ``PipelineHooks``, ``Resume``, ``PipelineStats``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import overload

from pearl.core.affinity import move_gain_s, turn_cost
from pearl.core.profile import TelemetryRecord
from pearl.core.session import AgentSession, EpisodeEnd, SessionFactory, SessionSpec, TurnInput
from pearl.core.state import Role
from pearl.core.trajectory import Segment, TrajectoryRecord, TrajectoryStatus, check_trajectory_transition
from pearl.engines.base import (
    EngineDeadError,
    EngineError,
    EngineProtocolError,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    InferenceEngine,
    KVTransferError,
    RequestRejectedError,
    SamplingParams,
)
from pearl.engines.resume import continuation_request, generated_tokens, merge_parts
from pearl.runtime.clock import Clock
from pearl.runtime.router import Route, Router
from pearl.runtime.tracker import RuntimeTracker

log = logging.getLogger("pearl.pipeline")


# ------------------------------------------------------------------------------------ context
class TokenContext(Sequence[int]):
    """An immutable view of a trajectory's growing token context, O(new tokens) per append.

    Views share one append-only buffer: ``ctx + more`` extends the buffer in place when ``ctx`` is
    its newest view (the common case: a trajectory only ever appends) and copies otherwise, so
    every view stays immutable. It behaves like ``tuple[int, ...]`` for the engines (``len``,
    indexing, iteration, ``+`` with a tuple, equality with tuples); real engines turn it into a
    list for their HTTP payloads. Without it, re-building a 30K-token tuple every turn dominates
    a paper-scale replay.
    """

    __slots__ = ("_buf", "_n")

    def __init__(self, tokens: Iterable[int] = (), _buf: list[int] | None = None, _n: int = 0) -> None:
        if _buf is None:
            self._buf = list(tokens)
            self._n = len(self._buf)
        else:
            self._buf, self._n = _buf, _n

    def __len__(self) -> int:
        return self._n

    def flat(self) -> tuple[list[int], int]:
        """The shared buffer and this view's length (positions below it never change): for an
        engine that slices a context without copying it (``pearl.engines.radix_cache.flat``)."""
        return self._buf, self._n

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[int, ...]: ...
    def __getitem__(self, i: int | slice) -> int | tuple[int, ...]:
        if isinstance(i, slice):
            return tuple(self._buf[: self._n][i])
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(f"token index {i} out of range for a context of {self._n}")
        return self._buf[i]

    def __iter__(self) -> Iterator[int]:
        return iter(self._buf[: self._n]) if self._n < len(self._buf) else iter(self._buf)

    def __add__(self, other: Iterable[int]) -> TokenContext:
        if self._n == len(self._buf):
            self._buf.extend(other)
            return TokenContext(_buf=self._buf, _n=len(self._buf))
        buf = self._buf[: self._n]
        buf.extend(other)
        return TokenContext(_buf=buf, _n=len(buf))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TokenContext):
            return self._n == other._n and self._buf[: self._n] == other._buf[: other._n]
        if isinstance(other, tuple | list):
            return self._n == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"TokenContext(len={self._n})"


# ---------------------------------------------------------------------------------- pipeline
@dataclass
class PipelineStats:
    rollout_step: int = 0  # batches completed
    trajectories_completed: int = 0  # completed in this run (journaled ones handed on again: below)
    trajectories_redelivered: int = 0  # completed before a restart, handed on from the journal
    trajectories_failed: int = 0
    trajectories_in_flight: int = 0
    interruptions: int = 0  # aborted requests resumed
    turns: int = 0
    tokens_generated: int = 0
    batch_started_at: float = 0.0
    batch_ends: list[float] = field(default_factory=list)  # clock time each batch completed
    batch_makespans: list[float] = field(default_factory=list)  # s from admission to the last trajectory
    weight_syncs: int = 0


@dataclass(frozen=True, slots=True)
class PipelineHooks:
    """What the pipeline tells its owner (module docstring, "Hooks"); None: nobody is told."""

    batch_started: Callable[[int], None] | None = None
    batch_done: Callable[[int, list[TrajectoryRecord]], Awaitable[None]] | None = None
    worker_failed: Callable[[str, str], None] | None = None
    trajectory_done: Callable[[TrajectoryRecord], None] | None = None


@dataclass(frozen=True, slots=True)
class Resume:
    """Where a restarted run picks up: ``completed`` (trajectory id -> record) were completed
    before the restart and are returned as they are; ``first_batch`` is the first batch the trainer
    has not consumed whole."""

    completed: Mapping[str, TrajectoryRecord] = field(default_factory=dict)
    first_batch: int = 0


@dataclass
class _Traj:
    spec: SessionSpec
    status: TrajectoryStatus = TrajectoryStatus.PENDING
    last_worker: str = ""
    interruptions: int = 0

    def move(self, new: TrajectoryStatus) -> None:
        check_trajectory_transition(self.spec.traj_id, self.status, new)
        self.status = new


class PipelineScheduler:
    def __init__(
        self,
        engine: InferenceEngine,
        clock: Clock,
        tracker: RuntimeTracker,
        session_factory: SessionFactory,
        *,
        batch_size: int,
        group_size: int,
        max_staleness: int,
        max_trajectory_tokens: int,
        router: Router | None = None,
        hooks: PipelineHooks | None = None,
        resume: Resume | None = None,
        weights: tuple[int, str] = (0, ""),
        error_backoff_s: float = 1.0,
        max_batches: int | None = None,
    ) -> None:
        if batch_size % group_size:
            raise ValueError(f"batch_size={batch_size} is not a multiple of group_size={group_size}")
        self.engine = engine
        self.clock = clock
        self.tracker = tracker
        self.session_factory = session_factory
        self.batch_size = batch_size
        self.group_size = group_size
        self.max_staleness = max_staleness
        self.max_trajectory_tokens = max_trajectory_tokens
        self.router = router or Router()
        self.hooks = hooks or PipelineHooks()
        self.error_backoff_s = error_backoff_s
        self.max_batches = max_batches
        self.stats = PipelineStats()
        self.trainer_version = weights[0]  # the newest version the trainer has published
        self.worker_versions: dict[str, int] = {}
        self.weights = weights  # latest (version, path) every serving worker must hold
        self._refresh: dict[str, asyncio.Task[None]] = {}
        self._version_changed = asyncio.Event()
        self._batches: asyncio.Queue[list[TrajectoryRecord]] = asyncio.Queue()
        self._inflight: dict[str, int] = {}  # worker -> requests in flight through this pipeline
        self._drained: dict[str, asyncio.Event] = {}  # set when a worker's count drops to 0
        self._trajs: dict[str, _Traj] = {}
        self.failures: list[str] = []
        resume = resume or Resume()
        self._recovered: dict[str, TrajectoryRecord] = dict(resume.completed)  # handed on once each
        self.first_batch = resume.first_batch
        self._batch_done = asyncio.Event()

    # ------------------------------------------------------------------ trainer side
    async def next_batch(self) -> list[TrajectoryRecord]:
        """The next completed rollout batch (completed trajectories only), in order."""
        return await self._batches.get()

    def set_trainer_version(self, version: int) -> None:
        self.trainer_version = max(self.trainer_version, version)
        self._version_changed.set()
        self._version_changed = asyncio.Event()

    # ------------------------------------------------------------------ worker membership
    def admit(self, worker_id: str, role: Role, version: int) -> None:
        """Make a worker dispatchable. A worker holding an older version than ``weights`` (the
        trainer published while it was being prepared) first reloads in a task owned here."""
        self.worker_versions[worker_id] = version
        if version < self.weights[0] and self.weights[1]:
            old = self._refresh.pop(worker_id, None)
            if old is not None:
                old.cancel()
            self._refresh[worker_id] = asyncio.get_running_loop().create_task(
                self._reload_then_admit(worker_id, role), name=f"refresh-{worker_id}")
            return
        self.router.admit(worker_id, role)

    async def _reload_then_admit(self, worker_id: str, role: Role) -> None:
        version, path = self.weights
        try:
            await self.engine.load_weights(worker_id, path, version)
        except EngineError as e:
            self.failures.append(f"weight refresh v{version} on {worker_id}: {e}")
            return
        finally:
            self._refresh.pop(worker_id, None)
        self.worker_versions[worker_id] = version
        self.router.admit(worker_id, role)

    async def close(self) -> None:
        """Cancel and await the weight-refresh tasks this pipeline owns."""
        tasks = list(self._refresh.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._refresh.clear()

    async def evict(self, worker_id: str) -> int:
        """Stop dispatch to ``worker_id`` and abort its in-flight requests (their partial outputs
        are kept and resumed elsewhere). Returns once every aborted call has returned; the number
        of aborted requests."""
        self.router.remove(worker_id)
        pending = self._refresh.pop(worker_id, None)
        if pending is not None:
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)
        n = self._inflight.get(worker_id, 0)
        if n:
            with contextlib.suppress(EngineError):
                await self.engine.abort(worker_id)
            await self._wait_drained(worker_id)
        return n

    async def _wait_drained(self, worker_id: str) -> None:
        while self._inflight.get(worker_id, 0):
            ev = self._drained.setdefault(worker_id, asyncio.Event())
            await ev.wait()

    def _track(self, route: Route, delta: int) -> None:
        for w in (route.worker, route.decode):
            if not w:
                continue
            n = self._inflight.get(w, 0) + delta
            if n:
                self._inflight[w] = n
            else:
                self._inflight.pop(w, None)
                ev = self._drained.pop(w, None)
                if ev is not None:
                    ev.set()

    async def sync_weights(self, version: int, path: str) -> None:
        """Pause dispatch, abort in-flight requests, load ``version`` on every dispatchable worker."""
        self.weights = (version, path)
        self.router.set_paused(True)
        try:
            workers = list(self.router.workers)
            for w in workers:
                with contextlib.suppress(EngineError):
                    await self.engine.abort(w)
            for w in workers:
                await self._wait_drained(w)

            async def load(w: str) -> None:
                try:
                    await self.engine.load_weights(w, path, version)
                    self.worker_versions[w] = version
                except EngineError as e:
                    self.failures.append(f"weight sync v{version} on {w}: {e}")
                    self._worker_failed(w, f"weight sync v{version}: {e}")

            await asyncio.gather(*(load(w) for w in workers))
            self.stats.weight_syncs += 1
        finally:
            self.router.set_paused(False)

    def _worker_failed(self, worker_id: str, reason: str) -> None:
        """Stop dispatching to a failed worker (a dead server must not be picked again: every retry
        would fail at once) and tell the controller."""
        if self.router.remove(worker_id) and self.hooks.worker_failed is not None:
            self.hooks.worker_failed(worker_id, reason)

    def inflight_on(self, worker_id: str) -> int:
        return self._inflight.get(worker_id, 0)

    # ------------------------------------------------------------------ batches
    async def run(self) -> None:
        """Produce rollout batches forever (or ``max_batches``); cancel to stop."""
        r = self.first_batch
        while self.max_batches is None or r < self.max_batches:
            if self.trainer_version < r - self.max_staleness:
                log.info("rollout batch %d waits for policy version %d (max_staleness %d; trainer at v%d)",
                         r, r - self.max_staleness, self.max_staleness, self.trainer_version)
            while self.trainer_version < r - self.max_staleness:
                await self._version_changed.wait()
            records = await self.run_batch(r)
            if self.hooks.batch_done is not None:
                await self.hooks.batch_done(r, records)
            self._batches.put_nowait([x for x in records if x.status is TrajectoryStatus.COMPLETED])
            r += 1

    async def run_batch(self, r: int) -> list[TrajectoryRecord]:
        groups = self.batch_size // self.group_size
        specs = [
            SessionSpec(f"b{r}-g{g}-s{s}", f"b{r}-g{g}", r, g, s)
            for g in range(groups) for s in range(self.group_size)
        ]
        t0 = self.clock.now()
        self.stats.batch_started_at = t0
        if self.hooks.batch_started is not None:
            self.hooks.batch_started(r)
        tasks = [asyncio.create_task(self._trajectory(sp), name=f"traj-{sp.traj_id}") for sp in specs]
        try:
            records = list(await asyncio.gather(*tasks))
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        end = self.clock.now()
        self.stats.rollout_step = r + 1
        self.stats.batch_ends.append(end)
        self.stats.batch_makespans.append(end - t0)
        self._batch_done.set()
        self._batch_done = asyncio.Event()
        return records

    async def wait_batch(self) -> None:
        """Wait for the next batch completion."""
        await self._batch_done.wait()

    def remaining_trajectories(self) -> int:
        return sum(1 for t in self._trajs.values() if not t.status.terminal)

    # ------------------------------------------------------------------ one trajectory
    async def _trajectory(self, spec: SessionSpec) -> TrajectoryRecord:
        journaled = self._recovered.pop(spec.traj_id, None)
        if journaled is not None:  # completed before a restart: hand it on as it was (not new work)
            self.stats.trajectories_redelivered += 1
            return journaled
        t = _Traj(spec)
        self._trajs[spec.traj_id] = t
        self.stats.trajectories_in_flight += 1
        segments: list[Segment] = []
        session: AgentSession | None = None
        try:
            session = self.session_factory(spec)
            ti: TurnInput | EpisodeEnd = await session.start()
            t.move(TrajectoryStatus.RUNNING)
            ctx = TokenContext()
            turn = 0
            while isinstance(ti, TurnInput):
                turn += 1
                segments.append(Segment(tuple(ti.prompt_ids), trained=False, turn=turn))
                ctx = ctx + ti.prompt_ids
                budget = min(ti.max_new_tokens, self.max_trajectory_tokens - len(ctx))
                if budget < 1:
                    ti = EpisodeEnd(0.0, {"truncated": True, "reason": "trajectory length limit reached"})
                    break
                parts, rec = await self._turn(t, turn, ctx, budget)
                out = parts[0].output_ids if len(parts) == 1 else tuple(generated_tokens(parts))
                segments.extend(merge_parts(parts, turn))
                ctx = ctx + out
                self.stats.turns += 1
                self.stats.tokens_generated += len(out)
                t.move(TrajectoryStatus.ENV)
                e0 = self.clock.now()
                ti = await session.step(out)
                env_s = self.clock.now() - e0
                self.tracker.record(_with_env(rec, env_s, isinstance(ti, EpisodeEnd)))
                if isinstance(ti, TurnInput):
                    t.move(TrajectoryStatus.RUNNING)
            t.move(TrajectoryStatus.COMPLETED)
            self.stats.trajectories_completed += 1
            info = dict(ti.info)
            info["interruptions"] = t.interruptions
            info["turns"] = turn
            done = TrajectoryRecord(spec.traj_id, spec.group_id, tuple(segments), ti.reward,
                                    TrajectoryStatus.COMPLETED, MappingProxyType(info))
            if self.hooks.trajectory_done is not None:
                self.hooks.trajectory_done(done)
            return done
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a broken session fails its trajectory, not the batch
            if not t.status.terminal:
                t.status = TrajectoryStatus.FAILED
            self.stats.trajectories_failed += 1
            self.failures.append(f"trajectory {spec.traj_id}: {type(e).__name__}: {e}")
            return TrajectoryRecord(spec.traj_id, spec.group_id, tuple(segments), 0.0, TrajectoryStatus.FAILED,
                                    MappingProxyType({"error": f"{type(e).__name__}: {e}"}))
        finally:
            self.stats.trajectories_in_flight -= 1
            self._trajs.pop(spec.traj_id, None)
            # a session that holds resources (a checkout, a container) releases them even when the
            # trajectory is cancelled mid-episode; sessions without resources have no ``aclose``
            aclose = getattr(session, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await asyncio.shield(aclose())

    async def _turn(self, t: _Traj, turn: int, ctx: TokenContext, budget: int
                    ) -> tuple[list[GenerateResult], TelemetryRecord]:
        original = GenerateRequest(t.spec.traj_id, ctx, SamplingParams(max_new_tokens=budget),  # type: ignore[arg-type]
                                   turn=turn)
        parts: list[GenerateResult] = []
        attempt = 0
        queue = prefill = transfer = decode = 0.0
        conc_w = conc_t = 0.0
        cached = -1
        moved = False
        prev = t.last_worker
        mode, worker = "colocated", ""
        req: GenerateRequest | None = original
        while req is not None:
            q0 = self.clock.now()
            route = await self.router.acquire(self.clock, t.last_worker, self._move_rule(turn, len(req.input_ids)))
            queue += self.clock.now() - q0
            res: GenerateResult | None = None
            self._track(route, +1)
            try:
                if route.decode:
                    res = await self.engine.generate_pd(route.worker, route.decode, req)
                else:
                    res = await self.engine.generate(route.worker, req)
            except (EngineDeadError, KVTransferError, EngineProtocolError) as e:
                res = e.partial
                self.failures.append(f"{req.rid}: {e}")
                if isinstance(e, EngineDeadError):
                    self._worker_failed(e.worker_id, str(e))
            except RequestRejectedError:
                raise  # the request itself is refused: resending it fails the same way; the turn fails
            except EngineError as e:
                self.failures.append(f"{req.rid}: {e}")
            finally:
                self.router.release(route)
                self._track(route, -1)
            if res is None:
                await self.router.wait_change(self.clock, self.error_backoff_s)
            else:
                parts.append(res)
                t.last_worker = route.worker
                tm = res.timings
                queue += tm.queue_s
                prefill += tm.prefill_s
                transfer += tm.transfer_s
                decode += tm.decode_s
                conc_w += tm.decode_concurrency * tm.decode_s
                conc_t += tm.decode_s
                if cached < 0:
                    cached = res.cached_tokens
                    moved = bool(prev) and route.worker != prev
                mode = "disaggregated" if route.decode else "colocated"
                worker = route.decode or route.worker
                if res.finish_reason is not FinishReason.ABORT:
                    break
            attempt += 1
            if res is not None and res.finish_reason is FinishReason.ABORT:
                t.interruptions += 1
                self.stats.interruptions += 1
                if t.status is TrajectoryStatus.RUNNING:
                    t.move(TrajectoryStatus.INTERRUPTED)
            req = (continuation_request(original, parts, attempt) if parts
                   else replace(original, attempt=attempt))
            if req is not None and t.status is TrajectoryStatus.INTERRUPTED:
                t.move(TrajectoryStatus.RUNNING)
        if t.status is TrajectoryStatus.INTERRUPTED:
            t.move(TrajectoryStatus.RUNNING)
        rec = TelemetryRecord(
            traj_id=t.spec.traj_id, turn=turn, prompt_tokens=len(ctx), cached_tokens=max(cached, 0),
            output_tokens=sum(len(p.output_ids) for p in parts), queue_s=queue, prefill_s=prefill,
            transfer_s=transfer, decode_s=decode, decode_concurrency=conc_w / conc_t if conc_t > 0 else 1.0,
            mode=mode, worker_id=worker, moved=moved,
        )
        return parts, rec


    def _move_rule(self, turn: int, context: int) -> Callable[[int, int], bool] | None:
        """The cost-aware affinity rule for turn ``turn`` with ``context`` prompt tokens
        (``pearl.core.affinity``: move iff the turn's predicted latency gain ``G > 0``, from the
        tracker's current profiles); None with the plain load-slack rule."""
        if not self.router.cost_aware:
            return None
        hw, tc = self.tracker.hardware, turn_cost(self.tracker.workload, turn, context)
        return lambda n_p, n_b: move_gain_s(hw, tc, n_p, n_b) > 0.0


def _with_env(rec: TelemetryRecord, env_s: float, final: bool) -> TelemetryRecord:
    return replace(rec, env_s=env_s, final=final)
