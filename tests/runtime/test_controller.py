"""The Controller's composition (Elastic Scheduler, Rebuilder, Toggle Manager, pipeline) on the emulator."""

from __future__ import annotations

import pytest

from pearl.core.events import GpusGranted, GrantedGpu, NoticeCancelled, ReclaimNotice, TrainingFinished, TrainingStarted
from pearl.core.session import SessionSpec
from pearl.core.state import Zone
from pearl.runtime.clock import LoopClock, run_virtual
from pearl.runtime.controller import Controller

from .helpers import ScriptedSession, config, engine


def _cfg(**kw):
    base = {"workload.batch_size": 8, "workload.group_size": 4, "cluster.reserved_gpus": 2,
            "cluster.training_gpus": 2, "cluster.max_preemptible_gpus": 4}
    base.update(kw)
    return config(**base)


def _controller(clock, cfg, turns=40, state_listeners=()):
    eng = engine(clock, cfg)
    sessions: dict[str, ScriptedSession] = {}

    def factory(spec: SessionSpec) -> ScriptedSession:
        s = ScriptedSession(spec, clock, turns=turns, response=300, env_s=3.0)
        sessions[spec.traj_id] = s
        return s

    ctl = Controller(cfg, eng, factory, clock=clock, state_listeners=state_listeners)
    return ctl, eng, sessions


def _grant(ids, eid):
    return GpusGranted(tuple(GrantedGpu(g, "pnode0", "inst-1") for g in ids), event_id=eid)


async def _expansion_settled(ctl):
    """Wait for the newest expansion group to be admitted or failed (its task, then the queue)."""
    await ctl.elastic.idle()
    grp = list(ctl.rebuilder.groups.values())[-1]
    await grp.task
    await ctl.elastic.idle()
    return grp


def _serving(ctl) -> set[str]:
    return {w["worker_id"] for w in ctl.state_dict()["workers"] if w["status"] == "active"}


def test_startup_admits_reserved_workers_and_parks_overlap_workers() -> None:
    async def main():
        clock = LoopClock()
        ctl, _eng, _ = _controller(clock, _cfg())
        await ctl.start()
        st = ctl.state_dict()
        await ctl.stop()
        return ctl, st

    ctl, st = run_virtual(main())
    by = {w["worker_id"]: w for w in st["workers"]}
    assert {w for w, x in by.items() if x["status"] == "active"} == {"w-r0-0", "w-r1-0"}
    assert {w for w, x in by.items() if x["status"] == "inactive"} == {"o-t0", "o-t1"}
    # preparation 56-67 s + finalization 11-18 s (Table 3) before the first worker serves
    assert 67.0 <= ctl.ready_at <= 85.0
    d = ctl.decision_dict()  # the serving roles are exactly the decision's allocation
    roles = sorted(x["role"] for x in by.values() if x["status"] == "active")
    assert roles == sorted(["colocated"] * d["n_colocated"] + ["prefill"] * d["n_prefill"] + ["decode"] * d["n_decode"])


def test_events_are_idempotent_on_event_id() -> None:
    async def main():
        clock = LoopClock()
        ctl, _eng, _ = _controller(clock, _cfg())
        await ctl.start()
        first = await ctl.submit(_grant(["p0", "p1"], "grant-1"))
        again = await ctl.submit(_grant(["p0", "p1"], "grant-1"))
        await ctl.elastic.idle()
        n_gpus = len(ctl.state_dict()["gpus"])
        grants = [h for h in ctl.history(1000) if h["kind"] == "grant"]
        await ctl.stop()
        return first, again, n_gpus, grants

    first, again, n_gpus, grants = run_virtual(main())
    assert first.applied and not first.duplicate
    assert not again.applied and again.duplicate and again.event_id == "grant-1"
    assert n_gpus == 2 + 2 + 2
    assert len(grants) == 1


def test_expansion_is_admitted_as_a_whole_group() -> None:
    async def main():
        clock = LoopClock()
        seen: list[set[str]] = []
        ctl, _eng, _ = _controller(clock, _cfg(), state_listeners=[lambda s: seen.append(
            {w.worker_id for w in s.workers.values() if w.status.value == "active"})])
        await ctl.start()
        t0 = clock.now()
        await ctl.submit(_grant(["p0", "p1", "p2", "p3"], "g"))
        grp = await _expansion_settled(ctl)
        await ctl.stop()
        return t0, grp, seen

    t0, grp, seen = run_virtual(main())
    assert grp.status.value == "admitted"
    new = set(grp.members)
    assert len(new) == 4
    # every state ever seen has either none or all of the group serving
    assert all(not (s & new) or new <= s for s in seen)
    assert 56.0 + 11.0 <= grp.admitted_at - t0 <= 67.0 + 18.0 + 2.0


def test_failed_member_cancels_the_whole_expansion() -> None:
    async def main():
        clock = LoopClock()
        cfg = _cfg()
        seen: list[set[str]] = []
        ctl, eng, _ = _controller(clock, cfg, state_listeners=[lambda s: seen.append(set(s.workers))])
        await ctl.start()
        eng.fail_next_launch(gpu="p2")
        await ctl.submit(_grant(["p0", "p1", "p2", "p3"], "g"))
        grp = await _expansion_settled(ctl)
        running = eng.worker_ids()
        st = ctl.state_dict()
        await ctl.stop()
        return grp, seen, running, st

    grp, seen, running, st = run_virtual(main())
    assert grp.status.value == "failed" and "injected" in grp.error
    members = set(grp.members)
    assert all(not (s & members) for s in seen)  # no member ever entered the topology
    assert not (members & set(running))  # every member process was stopped
    assert {g["gpu_id"] for g in st["gpus"] if g["zone"] == "preemptible"} == {"p0", "p1", "p2", "p3"}
    assert all(not w["gpus"][0].startswith("p") for w in st["workers"])


def test_a_retried_expansion_never_reuses_a_failed_members_id() -> None:
    """The failed group's servers may still be stopping when the re-plan retries the same GPUs at
    the same state version: the retry's workers get fresh ids, and are admitted."""
    async def main():
        clock = LoopClock()
        ctl, eng, _ = _controller(clock, _cfg())
        await ctl.start()
        eng.fail_next_launch(gpu="p2")
        await ctl.submit(_grant(["p0", "p1", "p2", "p3"], "g"))
        failed = await _expansion_settled(ctl)
        for _ in range(60):  # the re-plan 30 s after the failure considers the GPUs again
            await clock.sleep(1.0)
            if list(ctl.rebuilder.groups.values())[-1] is not failed:
                break
        retry = await _expansion_settled(ctl)
        serving = _serving(ctl)
        await ctl.stop()
        return failed, retry, serving

    failed, retry, serving = run_virtual(main())
    assert failed.status.value == "failed" and retry.status.value == "admitted"
    assert {g for gs in (s[0] for s in retry.members.values()) for g in gs} == {"p0", "p1", "p2", "p3"}
    assert not set(failed.members) & set(retry.members)
    assert all(w.rsplit(".", 1)[-1] == "2" for w in retry.members)  # w-p0-1 -> w-p0-1.2
    assert set(retry.members) <= serving


def test_urgent_shrink_releases_before_the_deadline_and_loses_nothing() -> None:
    async def main():
        clock = LoopClock()
        ctl, _eng, sessions = _controller(clock, _cfg(), turns=6)
        await ctl.start()
        await ctl.submit(_grant(["p0", "p1", "p2", "p3"], "g"))
        await _expansion_settled(ctl)
        await clock.sleep(10.0)
        serving = _serving(ctl)
        deadline = clock.now() + 30.0
        await ctl.submit(ReclaimNotice(("p0", "p1"), deadline=deadline, notice_id="n1", event_id="rc"))
        await clock.sleep_until(deadline)
        st = ctl.state_dict()
        batch = await ctl.take_batch()
        await ctl.stop()
        return ctl, serving, st, batch, sessions, deadline

    ctl, serving, st, batch, sessions, deadline = run_virtual(main())
    assert any(w.startswith("w-p0") for w in serving)
    (shrink,) = ctl.elastic.shrinks
    assert shrink["released_at"] <= deadline and shrink["met_deadline"]
    assert shrink["released_at"] == deadline - ctl.elastic.shrink_margin_s
    assert {g["gpu_id"] for g in st["gpus"]} & {"p0", "p1"} == set()
    assert all(w["gpus"][0] not in ("p0", "p1") for w in st["workers"])
    assert len(batch) == 8
    for rec in batch:  # interrupted turns resumed with nothing lost or duplicated
        s = sessions[rec.traj_id]
        assert [len(r) for r in s.seen] == [300] * 6
        assert rec.response_tokens == 6 * 300


def test_cancelled_notice_removes_nothing() -> None:
    async def main():
        clock = LoopClock()
        ctl, _eng, _ = _controller(clock, _cfg())
        await ctl.start()
        await ctl.submit(_grant(["p0", "p1"], "g"))
        await _expansion_settled(ctl)
        before = ctl.state_dict()
        await ctl.submit(ReclaimNotice(("p0",), deadline=clock.now() + 60.0, notice_id="n1", event_id="rc"))
        await clock.sleep(10.0)
        await ctl.submit(NoticeCancelled("n1", event_id="cancel"))
        await clock.sleep(100.0)
        await ctl.elastic.idle()
        after = ctl.state_dict()
        await ctl.stop()
        return ctl, before, after

    ctl, before, after = run_virtual(main())
    assert ctl.elastic.shrinks == []
    assert {g["gpu_id"] for g in after["gpus"]} == {g["gpu_id"] for g in before["gpus"]}


def test_one_notice_per_id_a_reused_id_never_leaves_a_second_timer() -> None:
    """A client notice id names one reclaim: the same notice again tightens it (one timer, never a
    duplicate), another reclaim under the id is refused naming the id, and cancelling the id leaves
    nothing armed (no GPU is shrunk)."""
    async def main():
        clock = LoopClock()
        ctl, _eng, _ = _controller(clock, _cfg())
        await ctl.start()
        await ctl.submit(_grant(["p0", "p1"], "g"))
        await _expansion_settled(ctl)
        before = ctl.state_dict()
        deadline = clock.now() + 60.0
        await ctl.submit(ReclaimNotice(("p0",), deadline=deadline, notice_id="n1", event_id="rc1"))
        await ctl.elastic.idle()
        dup = await ctl.submit(ReclaimNotice(("p0",), deadline=deadline, notice_id="n1", event_id="rc2"))
        await ctl.elastic.idle()
        with pytest.raises(ValueError, match="notice_id 'n1' already names the reclaim of p0"):
            await ctl.submit(ReclaimNotice(("p1",), deadline=deadline, notice_id="n1", event_id="rc3"))
        timers = len(ctl.elastic._timers)
        await ctl.submit(NoticeCancelled("n1", event_id="cancel"))
        await clock.sleep(120.0)
        await ctl.elastic.idle()
        after = ctl.state_dict()
        await ctl.stop()
        return ctl, before, after, dup, timers

    ctl, before, after, dup, timers = run_virtual(main())
    assert dup.applied and not dup.duplicate and "earliest deadline" in dup.detail
    assert timers == 1
    assert ctl.elastic.shrinks == []
    assert {g["gpu_id"] for g in after["gpus"]} == {g["gpu_id"] for g in before["gpus"]}


def test_borrowed_gpus_return_before_training_starts() -> None:
    async def main():
        clock = LoopClock()
        # PD forced: the borrowed decode workers take turns at once (colocated borrowed workers only
        # receive trajectories once the affinity slack is exceeded, which 8 trajectories never do)
        cfg = _cfg(**{"policy.gate_enabled": False, "policy.force_disaggregation": True})
        ctl, _eng, _ = _controller(clock, cfg)
        await ctl.start()
        await clock.sleep(60.0)
        await ctl.notify(TrainingFinished(1, 0, expected_idle_s=600.0, event_id="tf1"))
        borrowed = _serving(ctl)
        await clock.sleep(60.0)
        served = {r.worker_id for r in ctl.tracker.window}
        t0 = clock.now()
        await ctl.notify(TrainingStarted(2, event_id="ts2"))
        t_back = clock.now()
        st = ctl.state_dict()
        await ctl.stop()
        return ctl, borrowed, served, t0, t_back, st

    ctl, borrowed, served, t0, t_back, st = run_virtual(main())
    assert {"o-t0", "o-t1"} <= borrowed
    assert {"o-t0", "o-t1"} & served  # the borrowed workers really served turns
    (ret,) = [r for r in ctl.toggle.returns if r.workers]
    assert ret.workers == ("o-t0", "o-t1")
    # notify(TrainingStarted) returned exactly when the GPUs were back: deactivation 3.2-4.4 s
    assert t_back - t0 == ret.delay_s and 3.2 <= ret.delay_s <= 4.4
    overlap = [g for g in st["gpus"] if g["zone"] == Zone.OVERLAP.value]
    assert overlap and not any(g["lent"] for g in overlap)
    assert {w["worker_id"]: w["status"] for w in st["workers"] if w["worker_id"].startswith("o-")} == {
        "o-t0": "inactive", "o-t1": "inactive"}


def test_controller_is_a_control_plane_and_rejects_bad_requests() -> None:
    import pytest

    from pearl.runtime.control import ControlPlane, UnknownResourceError

    async def main():
        clock = LoopClock()
        ctl, _eng, _ = _controller(clock, _cfg())
        await ctl.start()
        assert isinstance(ctl, ControlPlane)
        await ctl.submit(_grant(["p0"], "g"))
        await ctl.elastic.idle()
        assert ctl.instance_gpus("inst-1") == ("p0",)
        with pytest.raises(UnknownResourceError):
            ctl.instance_gpus("nope")
        with pytest.raises(UnknownResourceError):
            await ctl.submit(ReclaimNotice(("zz",), deadline=clock.now() + 10, event_id="bad"))
        with pytest.raises(ValueError, match="reserved"):
            await ctl.submit(ReclaimNotice(("r0",), deadline=clock.now() + 10, event_id="bad2"))
        with pytest.raises(ValueError, match="already in the cluster"):
            await ctl.submit(_grant(["p0"], "g-again"))
        with pytest.raises(UnknownResourceError):
            await ctl.submit(NoticeCancelled("no-such-notice", event_id="c"))
        await ctl.elastic.idle()
        out = (ctl.state_dict(), ctl.decision_dict(), ctl.history(5), ctl.progress(), ctl.config_dict())
        await ctl.stop()
        return out

    state, decision, hist, prog, conf = run_virtual(main())
    assert {g["gpu_id"] for g in state["gpus"]} >= {"r0", "r1", "t0", "t1", "p0"}
    assert decision is not None and decision["candidates"]
    assert len(hist) <= 5 and all("kind" in h and "t" in h for h in hist)
    assert prog.rollout_step >= 0 and conf["workload"]["batch_size"] == 8


def test_a_dead_worker_is_removed_and_replaced_and_nothing_is_lost() -> None:
    async def main():
        clock = LoopClock()
        ctl, eng, sessions = _controller(clock, _cfg(), turns=4)
        await ctl.start()
        await clock.sleep(20.0)
        # a server that runs (serving, or draining for a role change the refit chose) dies behind the
        # runtime's back
        victim = sorted(w["worker_id"] for w in ctl.state_dict()["workers"] if w["status"] in ("active", "draining"))[0]
        await eng.stop(victim)
        batch = await ctl.take_batch()
        await _expansion_settled(ctl)  # the replacement (a colocated pool can finish the batch first)
        await ctl.elastic.idle()
        st = ctl.state_dict()
        hist = ctl.history(1000)
        await ctl.stop()
        return victim, batch, st, hist, sessions

    victim, batch, st, hist, sessions = run_virtual(main())
    assert any(h["kind"] == "worker_failed" and h["worker"] == victim for h in hist)
    assert victim not in {w["worker_id"] for w in st["workers"]}
    gpu = victim.split("-")[1]
    assert any(w["gpus"] == [gpu] for w in st["workers"])  # a new worker was started on its GPU
    assert len(batch) == 8
    for rec in batch:
        assert rec.response_tokens == 4 * 300
        assert [len(r) for r in sessions[rec.traj_id].seen] == [300] * 4


def test_expansion_gate_charges_only_the_serving_workers_the_admission_re_plans() -> None:
    """A colocated growth re-plans no serving worker: the gate's cost is 0. A growth whose target
    re-roles the two serving colocated workers (forced here to 2P2D at 4 workers) costs the
    finalisation EMA times the re-planned share k / n = 2 / 2 (``pearl.core.gate``)."""

    async def run(overrides):
        clock = LoopClock()
        ctl, _eng, _ = _controller(clock, _cfg(**{"cluster.training_gpus": 0, "policy.gate_enabled": True,
                                                  "policy.allocation_overrides": overrides}))
        await ctl.start()
        c_f = ctl.elastic.costs.expansion_final_s
        await ctl.submit(_grant(["p0", "p1"], "g"))
        grp = await _expansion_settled(ctl)
        roles = sorted(w["role"] for w in ctl.state_dict()["workers"] if w["status"] == "active")
        gate = [g for g in ctl.elastic.gate_log if g["kind"] == "expansion"]
        await ctl.stop()
        return c_f, grp, roles, gate

    c_f, grp, roles, gate = run_virtual(run({2: "coloc", 4: "coloc"}))
    assert grp.status.value == "admitted" and roles == ["colocated"] * 4
    assert len(gate) == 1 and gate[0]["admit"] and gate[0]["cost_s"] == 0.0

    c_f, grp, roles, gate = run_virtual(run({2: "coloc", 4: "2P2D"}))
    assert roles == ["decode", "decode", "prefill", "prefill"]
    assert len(gate) == 1 and gate[0]["cost_s"] == round(c_f, 3) and c_f > 0
    assert "100% of the serving workers re-planned" in gate[0]["reason"]
