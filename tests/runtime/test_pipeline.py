"""Pipeline Scheduler on the emulated engine: routing, interruption + resume, staleness, telemetry."""

from __future__ import annotations

import asyncio
import dataclasses

from pearl.core.profile import HardwareProfile, WorkloadProfile
from pearl.core.session import SessionSpec
from pearl.core.state import Role
from pearl.core.trajectory import TrajectoryStatus
from pearl.engines.base import FinishReason, ServerSpec, StreamCutError
from pearl.runtime.clock import LoopClock, run_virtual
from pearl.runtime.pipeline import PipelineHooks, PipelineScheduler, Resume
from pearl.runtime.router import Router
from pearl.runtime.tracker import RuntimeTracker

from .helpers import ScriptedSession, config, engine


def _pipeline(clock, eng, sessions, batch=4, group=2, staleness=1, max_batches=None, hooks=None, resume=None, **kw):
    cfg = config()
    tracker = RuntimeTracker(HardwareProfile.from_specs(cfg.model, cfg.hardware), WorkloadProfile.from_spec(cfg.workload))

    def factory(spec: SessionSpec) -> ScriptedSession:
        s = ScriptedSession(spec, clock, **kw)
        sessions[spec.traj_id] = s
        return s

    return PipelineScheduler(eng, clock, tracker, factory, batch_size=batch, group_size=group,
                             max_staleness=staleness, max_trajectory_tokens=32768, max_batches=max_batches,
                             hooks=hooks, resume=resume)


def _check_record(rec, session: ScriptedSession) -> None:
    """The record is prompt, then (response, observation)*: exactly what the session saw."""
    trained = [s for s in rec.segments if s.trained]
    joined: list[int] = []
    for s in trained:
        joined.extend(s.token_ids)
    assert joined == [t for r in session.seen for t in r]
    assert all(len(r) == session.response for r in session.seen)
    assert rec.response_tokens == session.turns * session.response
    assert len(rec.rollout_logprobs) == len(rec.token_ids) == len(rec.loss_mask)


def test_colocated_batch_runs_every_turn_and_records_telemetry() -> None:
    async def main():
        clock = LoopClock()
        eng = engine(clock)
        sessions: dict[str, ScriptedSession] = {}
        pipe = _pipeline(clock, eng, sessions)
        for w in ("w0", "w1"):
            await eng.launch(ServerSpec(w, (w,), Role.COLOCATED, ""))
            pipe.admit(w, Role.COLOCATED, 0)
        recs = await pipe.run_batch(0)
        await eng.close()
        return pipe, recs, sessions

    pipe, recs, sessions = run_virtual(main())
    assert [r.traj_id for r in recs] == ["b0-g0-s0", "b0-g0-s1", "b0-g1-s0", "b0-g1-s1"]
    assert [r.group_id for r in recs] == ["b0-g0", "b0-g0", "b0-g1", "b0-g1"]
    for r in recs:
        assert r.status is TrajectoryStatus.COMPLETED and r.reward == 1.0
        _check_record(r, sessions[r.traj_id])
    window = pipe.tracker.window
    assert len(window) == 4 * 3 and sum(1 for x in window if x.final) == 4
    assert {x.mode for x in window} == {"colocated"}
    assert all(x.output_tokens == 200 and x.env_s == 2.0 for x in window)
    # turn 2 reuses turn 1's context from the radix cache (sticky routing): 2000 + 200 less the
    # last token, whose KV is computed only by the next pass (SGLang's cache_finished_req)
    t2 = [x for x in window if x.turn == 2]
    assert all(x.prompt_tokens == 2500 and x.cached_tokens == 2199 for x in t2)
    assert pipe.stats.tokens_generated == 4 * 3 * 200


def test_disaggregated_routing_uses_prefill_then_decode() -> None:
    async def main():
        clock = LoopClock()
        eng = engine(clock)
        sessions: dict[str, ScriptedSession] = {}
        pipe = _pipeline(clock, eng, sessions)
        await eng.launch(ServerSpec("p0", ("g0",), Role.PREFILL, ""))
        await eng.launch(ServerSpec("d0", ("g1",), Role.DECODE, ""))
        pipe.admit("p0", Role.PREFILL, 0)
        pipe.admit("d0", Role.DECODE, 0)
        recs = await pipe.run_batch(0)
        await eng.close()
        return pipe, recs, sessions

    pipe, recs, sessions = run_virtual(main())
    for r in recs:
        _check_record(r, sessions[r.traj_id])
    window = pipe.tracker.window
    assert {x.mode for x in window} == {"disaggregated"}
    assert {x.worker_id for x in window} == {"d0"}
    assert all(x.transfer_s > 0 for x in window)
    # the prefill worker caches the prompt only: turn 2 recomputes the 200 response tokens + 300 obs
    assert all(x.cached_tokens == 2000 for x in window if x.turn == 2)


def test_router_least_loaded_with_affinity() -> None:
    r = Router(affinity_slack=1)
    r.admit("a", Role.COLOCATED)
    r.admit("b", Role.COLOCATED)
    r.load.update({"a": 3, "b": 1})
    assert r.pick().worker == "b"
    assert r.pick(prefer="a").worker == "b"  # 3 > 1 + 1
    r.load["a"] = 2
    assert r.pick(prefer="a").worker == "a"  # within the slack: keep the prefix cache
    r.remove("b")
    assert r.pick(prefer="b").worker == "a"
    r.remove("a")
    assert r.pick() is None
    r.admit("p", Role.PREFILL)
    assert r.pick() is None  # a prefill worker alone cannot serve
    r.admit("d", Role.DECODE)
    assert r.pick() == type(r.pick())("p", "d")


def test_router_cost_aware_affinity_moves_within_the_slack_only_when_the_rule_says_so() -> None:
    r = Router(affinity_slack=4, cost_aware=True)
    r.admit("a", Role.COLOCATED)
    r.admit("b", Role.COLOCATED)
    r.load.update({"a": 3, "b": 1})
    seen: list[tuple[int, int]] = []

    def rule(ans: bool):
        def f(n_p: int, n_b: int) -> bool:
            seen.append((n_p, n_b))
            return ans
        return f

    assert r.pick("a", rule(False)).worker == "a" and r.last_move == ""  # within the slack, not worth it
    assert r.pick("a", rule(True)).worker == "b" and r.last_move == "cost"  # within the slack, the turn gains
    assert seen == [(3, 1), (3, 1)]
    r.load["b"] = 3
    assert r.pick("a", rule(True)).worker == "a" and r.last_move == ""  # no load gap: never asked, stays
    assert len(seen) == 2
    r.load.update({"a": 9, "b": 1})
    assert r.pick("a", rule(False)).worker == "b" and r.last_move == "slack"  # past the slack: moves anyway
    # ``acquire`` counts the move of the route it takes
    route = asyncio.run(r.acquire(LoopClock(), "a", rule(True)))
    assert route.worker == "b" and r.moves == {"slack": 1, "cost": 0} and r.load["b"] == 2


def test_cost_aware_affinity_spreads_a_grown_pool() -> None:
    """A batch placed on one worker, then a second worker admitted mid-batch: with the plain slack
    the trajectories stay on their cache-holding worker (load gap within the slack); cost-aware
    affinity moves turns whose decode saving beats re-prefilling their context, and the batch
    finishes sooner."""

    async def run(cost_aware: bool):
        clock = LoopClock()
        eng = engine(clock)
        sessions: dict[str, ScriptedSession] = {}
        pipe = _pipeline(clock, eng, sessions, batch=8, group=2, turns=4, response=800, env_s=0.5)
        pipe.router = Router(affinity_slack=8, cost_aware=cost_aware)
        for w in ("w0", "w1"):  # both started; w1 is admitted mid-batch, as after a grant
            await eng.launch(ServerSpec(w, (w,), Role.COLOCATED, ""))
        pipe.admit("w0", Role.COLOCATED, 0)
        start = clock.now()
        batch = asyncio.create_task(pipe.run_batch(0))
        await clock.sleep(3.0)
        pipe.admit("w1", Role.COLOCATED, 0)
        recs = await batch
        await eng.close()
        served = {x.worker_id for x in pipe.tracker.window}
        assert sum(x.moved for x in pipe.tracker.window) == sum(pipe.router.moves.values())  # telemetry flags each move
        return recs, clock.now() - start, served, dict(pipe.router.moves)

    recs_s, span_s, served_s, moves_s = run_virtual(run(False))
    recs_c, span_c, served_c, moves_c = run_virtual(run(True))
    assert all(r.status is TrajectoryStatus.COMPLETED for r in recs_s + recs_c)
    assert served_s == {"w0"} and moves_s == {"slack": 0, "cost": 0}
    assert served_c == {"w0", "w1"} and moves_c["cost"] > 0
    assert span_c < span_s


def test_interrupted_requests_resume_elsewhere_with_exact_tokens() -> None:
    """Evicting a worker mid-decode aborts its requests; each resumes on the survivor with
    prompt + partial output. The trajectories are token-for-token those of an undisturbed run."""

    async def run(evict_at: float | None):
        clock = LoopClock()
        eng = engine(clock)
        sessions: dict[str, ScriptedSession] = {}
        pipe = _pipeline(clock, eng, sessions, turns=2, response=400)
        for w in ("w0", "w1"):
            await eng.launch(ServerSpec(w, (w,), Role.COLOCATED, ""))
            pipe.admit(w, Role.COLOCATED, 0)
        start = clock.now()
        batch = asyncio.create_task(pipe.run_batch(0))
        aborted = 0
        if evict_at is not None:
            await clock.sleep_until(start + evict_at)
            in_flight = pipe.inflight_on("w0")
            aborted = await pipe.evict("w0")
            assert aborted == in_flight > 0
            assert "w0" not in pipe.router.workers
        recs = await batch
        await eng.close()
        return recs, sessions, pipe, aborted

    base, _, _, _ = run_virtual(run(None))
    recs, sessions, pipe, aborted = run_virtual(run(2.0))  # w0 is decoding at t+2 s
    assert pipe.stats.interruptions == aborted
    for a, b in zip(base, recs, strict=True):
        assert a.token_ids == b.token_ids  # nothing lost, nothing generated twice
        assert a.rollout_logprobs == b.rollout_logprobs
        _check_record(b, sessions[b.traj_id])
    split = [r for r in recs if r.info["interruptions"]]
    assert len(split) == aborted
    for r in split:  # the interrupted turn is two trained segments (partial + continuation)
        turn_segs = [s for s in r.segments if s.trained and s.turn == 1]
        assert len(turn_segs) == 2 and 0 < len(turn_segs[0].token_ids) < 400
        assert sum(len(s.token_ids) for s in turn_segs) == 400


def test_hooks_hear_each_batch_start_completion_and_end_in_order() -> None:
    async def main():
        clock = LoopClock()
        eng = engine(clock)
        heard: list[tuple[str, object]] = []

        async def done(r, records):
            heard.append(("done", (r, len(records))))

        hooks = PipelineHooks(batch_started=lambda r: heard.append(("start", r)), batch_done=done,
                              trajectory_done=lambda rec: heard.append(("traj", rec.traj_id)))
        pipe = _pipeline(clock, eng, {}, staleness=5, max_batches=2, hooks=hooks, turns=1)
        await eng.launch(ServerSpec("w0", ("w0",), Role.COLOCATED, ""))
        pipe.admit("w0", Role.COLOCATED, 0)
        await pipe.run()
        await eng.close()
        return heard

    heard = run_virtual(main())
    assert [k for k, _ in heard] == ["start", "traj", "traj", "traj", "traj", "done"] * 2
    assert [v for k, v in heard if k != "traj"] == [0, (0, 4), 1, (1, 4)]
    assert sorted(v for k, v in heard[:6] if k == "traj") == ["b0-g0-s0", "b0-g0-s1", "b0-g1-s0", "b0-g1-s1"]


def test_a_resumed_pipeline_skips_consumed_batches_and_hands_on_completed_trajectories() -> None:
    from pearl.core.trajectory import TrajectoryRecord

    kept = TrajectoryRecord("b1-g0-s0", "b1-g0", (), 0.5, TrajectoryStatus.COMPLETED)

    async def main():
        clock = LoopClock()
        eng = engine(clock)
        sessions: dict[str, ScriptedSession] = {}
        generated: list[str] = []
        pipe = _pipeline(clock, eng, sessions, staleness=5, max_batches=2, turns=1,
                         hooks=PipelineHooks(trajectory_done=lambda rec: generated.append(rec.traj_id)),
                         resume=Resume({kept.traj_id: kept}, first_batch=1))
        await eng.launch(ServerSpec("w0", ("w0",), Role.COLOCATED, ""))
        pipe.admit("w0", Role.COLOCATED, 0)
        await pipe.run()
        await eng.close()
        return pipe, await pipe.next_batch(), sessions, generated

    pipe, batch, sessions, generated = run_virtual(main())
    assert pipe.first_batch == 1 and pipe.stats.rollout_step == 2 and len(pipe.stats.batch_makespans) == 1
    assert [r.traj_id for r in batch] == ["b1-g0-s0", "b1-g0-s1", "b1-g1-s0", "b1-g1-s1"]
    assert batch[0] is kept and kept.traj_id not in sessions  # handed on, never generated again
    assert sorted(generated) == ["b1-g0-s1", "b1-g1-s0", "b1-g1-s1"]


def test_bounded_staleness_gates_admission_and_versions_are_recorded() -> None:
    async def main():
        clock = LoopClock()
        eng = engine(clock)
        sessions: dict[str, ScriptedSession] = {}
        pipe = _pipeline(clock, eng, sessions, staleness=0, max_batches=2)
        await eng.launch(ServerSpec("w0", ("w0",), Role.COLOCATED, ""))
        pipe.admit("w0", Role.COLOCATED, 0)
        run = asyncio.create_task(pipe.run())
        b0 = await pipe.next_batch()
        await clock.sleep(500.0)
        held = (pipe.stats.rollout_step, pipe.stats.trajectories_in_flight)  # batch 1 must wait for v1
        await pipe.sync_weights(1, "emulated://v1")
        pipe.set_trainer_version(1)
        b1 = await pipe.next_batch()
        await run
        await eng.close()
        return b0, held, b1, pipe

    b0, held, b1, pipe = run_virtual(main())
    assert held == (1, 0)
    assert {r.policy_version for r in b0} == {0}
    assert {r.policy_version for r in b1} == {1}
    assert pipe.worker_versions == {"w0": 1} and pipe.stats.weight_syncs == 1


def test_random_evictions_in_every_stage_lose_and_duplicate_nothing() -> None:
    """Evict (abort) random prefill / decode / colocated workers at random times - requests are
    caught waiting, prefilling, waiting for decode KV, in transfer and decoding - then re-admit them.
    Every trajectory must equal the undisturbed run token for token."""
    import random

    async def run(seed: int | None):
        clock = LoopClock()
        eng = engine(clock)
        sessions: dict[str, ScriptedSession] = {}
        pipe = _pipeline(clock, eng, sessions, batch=8, group=4, turns=3, response=150, env_s=0.5)
        roles = {"p0": Role.PREFILL, "p1": Role.PREFILL, "d0": Role.DECODE, "d1": Role.DECODE,
                 "c0": Role.COLOCATED}
        for w, r in roles.items():
            await eng.launch(ServerSpec(w, (w,), r, ""))
            pipe.admit(w, r, 0)
        batch = asyncio.create_task(pipe.run_batch(0))
        aborted = 0
        if seed is not None:
            rng = random.Random(seed)
            while not batch.done():
                await clock.sleep(rng.uniform(0.01, 0.6))
                w = rng.choice(sorted(roles))
                aborted += await pipe.evict(w)
                await clock.sleep(rng.uniform(0.0, 0.2))
                pipe.admit(w, roles[w], 0)
        recs = await batch
        await eng.close()
        return recs, pipe, aborted, eng.crashes

    base, _, _, _ = run_virtual(run(None))
    for seed in (1, 2, 3):
        recs, pipe, aborted, crashes = run_virtual(run(seed))
        assert crashes == [] and aborted > 0 and pipe.stats.interruptions == aborted
        for a, b in zip(base, recs, strict=True):
            assert a.token_ids == b.token_ids
            assert b.response_tokens == 3 * 150


class _CutOnce:
    """The emulated engine, except that its first generation breaks off halfway with a
    ``StreamCutError`` carrying the half that arrived (a server that broke its protocol)."""

    def __init__(self, inner) -> None:
        self.inner, self.cut = inner, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def generate(self, worker_id, req):
        res = await self.inner.generate(worker_id, req)
        if self.cut == 0 and len(res.output_ids) > 1:
            self.cut = k = len(res.output_ids) // 2
            part = dataclasses.replace(res, output_ids=res.output_ids[:k], logprobs=res.logprobs[:k],
                                       finish_reason=FinishReason.ABORT)
            raise StreamCutError(worker_id, "stream closed before [DONE]", part)
        return res


def test_a_protocol_error_keeps_its_partial_output_and_the_turn_resumes() -> None:
    async def run(cut: bool):
        clock = LoopClock()
        eng = engine(clock)
        wrapped = _CutOnce(eng) if cut else eng
        sessions: dict[str, ScriptedSession] = {}
        pipe = _pipeline(clock, wrapped, sessions, turns=2, response=64)
        for w in ("w0", "w1"):
            await eng.launch(ServerSpec(w, (w,), Role.COLOCATED, ""))
            pipe.admit(w, Role.COLOCATED, 0)
        recs = await pipe.run_batch(0)
        await eng.close()
        return recs, sessions, pipe, wrapped

    base, _, _, _ = run_virtual(run(False))
    recs, sessions, pipe, wrapped = run_virtual(run(True))
    assert wrapped.cut == 32 and any("stream closed before [DONE]" in f for f in pipe.failures)
    turns = [[len(s.token_ids) for s in r.segments if s.trained and s.turn == t] for r in recs for t in (1, 2)]
    assert turns.count([32, 32]) == 1  # the 32 tokens that arrived are kept; the turn resumed after them
    assert turns.count([64]) == len(turns) - 1
    for a, b in zip(base, recs, strict=True):
        assert a.token_ids == b.token_ids and a.rollout_logprobs == b.rollout_logprobs  # nothing lost
        _check_record(b, sessions[b.traj_id])
