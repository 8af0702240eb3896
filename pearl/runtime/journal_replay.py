"""The journal at the engine boundary and on restart: ``JournaledEngine`` and ``attach``.

Role. ``pearl.runtime.journal.Journal`` stores; this module wires it into a controller.
``JournaledEngine`` wraps the runtime's engine: every generation result (normal, aborted, or the
partial carried by an engine error) is journaled as a part of its ``(conversation, turn)``
(``GenerateRequest``'s typed fields) before the runtime sees it, and after a restart a request of a
turn with journaled parts is answered from them. ``attach`` records the starting cluster state
and returns the hooks that keep the journal current (``JournalHooks``); ``restart_state`` and
``first_unconsumed_batch`` are where a recovered run starts.

Life cycle (``Controller(..., journal=j)``)::

    run = j.recover()
    engine = JournaledEngine(engine, j, run.partials)       # replays, then journals every part
    hooks = attach(j, state, run, batch_size)               # state + completions + resume point
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from pearl.core.state import ClusterState, Gpu, Role
from pearl.core.trajectory import TrajectoryRecord
from pearl.engines.base import (
    EngineCapabilities,
    EngineDeadError,
    EngineProtocolError,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    InferenceEngine,
    KVTransferError,
    PauseMode,
    ServerSpec,
)
from pearl.runtime.journal import Journal, PartialOutput, RecoveredRun, first_unconsumed_batch


class JournaledEngine:
    """Journals every generation result at the engine boundary and replays recovered parts.

    Every result the runtime receives (normal, aborted, or the partial carried by
    ``EngineDeadError`` / ``KVTransferError``) is written with ``record_partial`` before the runtime
    sees it. After a restart, a request for turn ``k`` of a trajectory whose parts were journaled
    is answered from the journal, one part per attempt and in order, as long as the request's
    prompt length is the one the part was generated on: an unfinished part comes back with
    ``finish_reason=abort`` (the pipeline then sends the continuation: prompt + part, remaining
    budget), the finished one with ``length``. So a restarted trajectory replays its journaled
    tokens (with their logprobs and weight versions) and generates only what was never generated.
    A length mismatch (the context diverged, e.g. a non-deterministic environment) drops that
    turn's replay and generates afresh.
    """

    def __init__(self, inner: InferenceEngine, journal: Journal,
                 partials: Mapping[str, Sequence[PartialOutput]]) -> None:
        self.inner = inner
        self.journal = journal
        self._replay: dict[tuple[str, int], list[PartialOutput]] = {}
        for ps in partials.values():
            for p in ps:
                self._replay.setdefault((p.traj_id, p.turn), []).append(p)
        self.replayed_parts = 0
        self.replayed_tokens = 0
        self.replay_mismatches = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def capabilities(self) -> EngineCapabilities:
        return self.inner.capabilities

    def _replayed(self, worker_id: str, req: GenerateRequest) -> GenerateResult | None:
        key = (req.conversation, req.turn)
        queue = self._replay.get(key)
        if not queue:
            return None
        p = queue[0]
        if p.input_len not in (-1, len(req.input_ids)) or len(p.tokens) > req.sampling.max_new_tokens:
            self.replay_mismatches += 1
            self._replay.pop(key, None)
            return None
        queue.pop(0)
        self.replayed_parts += 1
        self.replayed_tokens += len(p.tokens)
        return GenerateResult(rid=req.rid, output_ids=p.tokens, logprobs=p.logprobs,
                              finish_reason=FinishReason.LENGTH if p.finished else FinishReason.ABORT,
                              weight_version=p.weight_version, prompt_tokens=len(req.input_ids),
                              worker_id=worker_id)

    def _journal(self, req: GenerateRequest, res: GenerateResult | None, finished: bool) -> None:
        """Queue the part on the journal's writer thread (in order; the loop does not wait)."""
        if res is not None:
            j, n_in, traj, turn = self.journal, len(req.input_ids), req.conversation, req.turn
            j.post(lambda: j.record_partial(traj, turn, res.output_ids, res.logprobs, res.weight_version,
                                            input_len=n_in, finished=finished), f"partial of {traj}")

    async def _call(self, worker_id: str, req: GenerateRequest,
                    call: Callable[[], Awaitable[GenerateResult]]) -> GenerateResult:
        res = self._replayed(worker_id, req)
        if res is not None:
            return res
        try:
            res = await call()
        except (EngineDeadError, KVTransferError, EngineProtocolError) as e:
            self._journal(req, e.partial, False)
            raise
        self._journal(req, res, res.finish_reason is not FinishReason.ABORT)
        return res

    async def generate(self, worker_id: str, req: GenerateRequest) -> GenerateResult:
        return await self._call(worker_id, req, lambda: self.inner.generate(worker_id, req))

    async def generate_pd(self, prefill_id: str, decode_id: str, req: GenerateRequest) -> GenerateResult:
        return await self._call(prefill_id, req, lambda: self.inner.generate_pd(prefill_id, decode_id, req))

    # the rest of the InferenceEngine contract, delegated as is
    async def launch(self, spec: ServerSpec) -> None:
        await self.inner.launch(spec)

    async def stop(self, worker_id: str) -> None:
        await self.inner.stop(worker_id)

    async def healthy(self, worker_id: str) -> bool:
        return bool(await self.inner.healthy(worker_id))

    async def abort(self, worker_id: str, rid: str | None = None) -> None:
        await self.inner.abort(worker_id, rid)

    async def pause(self, worker_id: str, mode: PauseMode = PauseMode.KEEP) -> None:
        await self.inner.pause(worker_id, mode)

    async def resume(self, worker_id: str) -> None:
        await self.inner.resume(worker_id)

    async def load_weights(self, worker_id: str, path: str, version: int) -> None:
        await self.inner.load_weights(worker_id, path, version)

    async def weight_version(self, worker_id: str) -> int:
        return int(await self.inner.weight_version(worker_id))

    async def release_memory(self, worker_id: str) -> None:
        await self.inner.release_memory(worker_id)

    async def resume_memory(self, worker_id: str) -> None:
        await self.inner.resume_memory(worker_id)

    async def set_role(self, worker_id: str, role: Role) -> None:
        await self.inner.set_role(worker_id, role)

    async def close(self) -> None:
        await self.inner.close()


def restart_state(journaled: Mapping[str, Any]) -> ClusterState:
    """The cluster a restarted controller starts from: every GPU of the journaled table (a
    preemptible GPU granted before the crash is still ours: the cloud will not grant it again),
    no workers (their servers died with the controller; the start-up re-plan launches new ones),
    nothing lent (the trainer re-lends after its next step)."""
    st = ClusterState.from_dict(journaled)
    return ClusterState.build([Gpu(g.gpu_id, g.zone, g.node, g.instance_id, False) for g in st.gpus.values()])


@dataclass(frozen=True, slots=True)
class JournalHooks:
    """What a controller wires from a journal (``attach``): ``record_state`` for the executor's
    state listeners, ``record_trajectory`` for the pipeline's completions (both queued on the
    writer thread; the trajectory's future completes once it is on disk), and where the recovered
    run resumes (``completed``: trajectory id -> record, handed on as journaled; ``first_batch``)."""

    record_state: Callable[[ClusterState], None]
    record_trajectory: Callable[[TrajectoryRecord], Future[bool]]
    completed: Mapping[str, TrajectoryRecord]
    first_batch: int


def attach(journal: Journal, state: ClusterState, run: RecoveredRun, batch_size: int) -> JournalHooks:
    """Record the starting ``state`` in ``journal`` and return the hooks that keep it current and
    restore the recovered ``run``: state changes, completions, the resume point."""
    journal.record_state(state.to_dict())

    def record_state(st: ClusterState) -> None:
        body = st.to_dict()
        journal.post(lambda: journal.record_state(body), "cluster state")

    def record_trajectory(rec: TrajectoryRecord) -> Future[bool]:
        return journal.post(lambda: journal.record_trajectory(rec), f"trajectory {rec.traj_id}")

    return JournalHooks(record_state, record_trajectory,
                        {r.traj_id: r for r in run.unconsumed}, first_unconsumed_batch(run.consumed, batch_size))
