"""Elastic Scheduler alone: its queue, handlers and re-plans over the executor, rebuilder, toggle
manager, tracker and pipeline it is given (the emulated engine underneath; no Controller; a
rollout batch runs only where a test starts one)."""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace

import pytest

from pearl.config import RunConfig
from pearl.core.decision import Allocation, Decision, Mode
from pearl.core.events import GpusGranted, GrantedGpu, NoticeCancelled, ReclaimNotice, TrainingFinished, TrainingStarted
from pearl.core.outlook import Expansion, PoolChange, Reclaim, hold_s, pool_changes
from pearl.core.override import Decider
from pearl.core.planner import StepKind
from pearl.core.state import ClusterState, Gpu, WorkerStatus, Zone
from pearl.runtime.clock import LoopClock, run_virtual
from pearl.runtime.control import UnknownResourceError
from pearl.runtime.elastic import ElasticScheduler
from pearl.runtime.rebuilder import ClusterRebuilder
from pearl.runtime.toggle import ToggleManager

from .helpers import Rig, config, rig


def _cfg(**kw: object) -> RunConfig:
    base: dict[str, object] = {"workload.batch_size": 8, "workload.group_size": 4, "policy.gate_enabled": False,
                               "train.step_time_s": 100.0, "policy.cost_ema_alpha": 0.5}
    base.update(kw)
    return config(**base)


def _state(training: int = 2) -> ClusterState:
    return ClusterState.build([Gpu("r0", Zone.RESERVED, "rnode0"), Gpu("r1", Zone.RESERVED, "rnode0")]
                              + [Gpu(f"t{i}", Zone.OVERLAP, "tnode0") for i in range(training)])


def _scheduler(clock: LoopClock, cfg: RunConfig | None = None,
               state: ClusterState | None = None) -> tuple[ElasticScheduler, Rig]:
    r = rig(clock, state or _state(), cfg or _cfg())
    rb = ClusterRebuilder(r.executor, r.engine, clock, r.latest_weights)
    tg = ToggleManager(r.executor, r.engine, clock, r.cfg.cluster.tp_size)
    return ElasticScheduler(r.cfg, clock, r.executor, rb, tg, r.tracker, r.pipeline), r


async def _started(el: ElasticScheduler) -> None:
    """Start the queue, plan the reserved workers and wait until their expansion is admitted."""
    el.start()
    await el.toggle.prepare(0, "emulated://v0")
    out = await el.replan("startup")
    assert out.expansion is not None
    task = el.rebuilder.groups[out.expansion].task
    assert task is not None
    await task
    await el.idle()


def _grant(*ids: str, eid: str = "") -> GpusGranted:
    return GpusGranted(tuple(GrantedGpu(g, "pnode0", "i-1") for g in ids), event_id=eid)


def _active(el: ElasticScheduler) -> set[str]:
    return {w for w, x in el.executor.state.workers.items() if x.status is WorkerStatus.ACTIVE}


def test_the_first_replan_decides_plans_and_launches_the_workers_as_one_expansion() -> None:
    async def main():
        clock = LoopClock()
        el, _r = _scheduler(clock)
        el.start()
        out = await el.replan("startup")
        before = set(el.executor.state.workers)
        assert out.expansion is not None
        task = el.rebuilder.groups[out.expansion].task
        assert task is not None
        await task
        await el.idle()
        await el.close()
        return el, out, before

    el, out, before = run_virtual(main())
    assert out.reason == "startup" and out.errors == () and out.error == ""
    assert out.decision is not None and out.decision.n_workers == 2 and el.allocation == out.decision.target
    assert out.plan is not None and [s.kind for s in out.plan.steps] == [StepKind.ADD, StepKind.ADD]
    assert out.report is not None and out.report.steps == 0  # ADD steps are the rebuilder's
    assert out.switch is not None and out.switch.gate is None  # a first decision passes the switch hold
    assert before == set()  # preparing members stay outside the state
    assert _active(el) == {"w-r0-0", "w-r1-0"}
    assert el.reconfigurations == {"expansion": 1}
    kinds = [h["kind"] for h in el.history]
    assert kinds == ["expand_started", "replan", "replan", "expand_admitted"]


def test_an_empty_budget_has_nothing_to_decide() -> None:
    async def main():
        clock = LoopClock()
        el, _r = _scheduler(clock, state=ClusterState.build([Gpu("t0", Zone.OVERLAP)]))
        return el, await el.replan("nothing lent")

    el, out = run_virtual(main())
    assert out.decision is None and out.plan is None and out.report is not None and out.errors == ()
    assert el.allocation is None
    assert el.history[-1]["detail"] == "no rollout GPU in the budget: nothing to decide"


def test_bad_events_are_refused_with_named_errors() -> None:
    async def main():
        clock = LoopClock()
        el, _r = _scheduler(clock)
        el.start()
        with pytest.raises(ValueError, match="a grant must name at least one GPU"):
            await el.submit(GpusGranted(()))
        with pytest.raises(ValueError, match=r"\['r0'\] are already in the cluster"):
            await el.submit(_grant("r0"))
        with pytest.raises(UnknownResourceError):
            await el.submit(ReclaimNotice(("p9",), deadline=10.0))
        with pytest.raises(ValueError, match="r1 is a reserved GPU; only preemptible GPUs can be reclaimed"):
            await el.submit(ReclaimNotice(("r1",), deadline=10.0))
        await el.submit(_grant("p0", eid="g1"), wait=True)
        with pytest.raises(ValueError, match="deadline: inf is not a finite clock time"):
            await el.submit(ReclaimNotice(("p0",), deadline=math.inf))
        with pytest.raises(UnknownResourceError):
            await el.submit(NoticeCancelled("n-none"))
        # the scheduler keeps no ids (the door does): the same grant again is refused on the table
        with pytest.raises(ValueError, match=r"\['p0'\] are already in the cluster"):
            await el.submit(_grant("p0", eid="g1"))
        await el.close()

    run_virtual(main())


def test_the_outlook_holds_the_lent_gpus_notices_and_expansions_it_knows() -> None:
    async def main():
        clock = LoopClock()
        el, _r = _scheduler(clock)
        await _started(el)
        await el.submit(TrainingStarted(1, event_id="ts1"), wait=True)
        await clock.sleep(20.0)
        training = el.outlook()  # the step holds t0, t1: they come back when it ends
        await clock.sleep(40.0)
        await el.submit(TrainingFinished(1, 1, expected_idle_s=300.0, event_id="tf1"), wait=True)  # lends t0, t1
        lent = el.outlook()
        await el.submit(_grant("p0", "p1", eid="g1"), wait=True)  # an expansion starts preparing
        now = clock.now()
        await el.submit(ReclaimNotice(("p0",), deadline=now + 200.0, notice_id="n1", event_id="rc1"), wait=True)
        o = el.outlook()
        changes = pool_changes(o, True, 6)
        await el.close()
        return el, training, lent, o, now, changes

    el, training, lent, o, now, changes = run_virtual(main())
    assert training.lent_workers == 0 and training.returning_workers == 2 and training.trainer.running
    assert pool_changes(training, False, 2) == [
        PoolChange(100.0 - 20.0 + training.costs.activation_s, 2, True)]  # T - elapsed + d_act
    assert lent.returning_workers == 0
    assert el.trainer.step_s == 100.0 + 0.5 * (60.0 - 100.0)  # EMA of the 60-s span
    assert lent.lent_workers == 2 and lent.trainer.idle_window_s == 300.0 and lent.trainer.steps_seen == 1
    assert lent.decision is not None and lent.decision.n_workers == 4
    assert o.reclaims == (Reclaim(now + 200.0, frozenset({"p0"}), 0),)
    (x,) = o.expansions
    assert x.gpus == frozenset({"p0", "p1"}) and x.workers == 2 and x.ready_at is None
    assert isinstance(x, Expansion)
    # the expansion is on a noticed GPU (its shrink cancels it); the lent workers leave and return
    d_ret, d_act = o.costs.deactivation_s, o.costs.activation_s
    assert [(c.delta, c.regrowth) for c in changes] == [(-2, False), (2, True)]
    assert changes[1].offset_s == pytest.approx(d_ret + o.trainer.step_s + d_act)


def test_a_failed_worker_is_removed_and_a_replacement_prepared() -> None:
    async def main():
        clock = LoopClock()
        el, r = _scheduler(clock, state=_state(0))
        await _started(el)
        el.worker_failed("w-r0-0", "server exited")
        await el.idle()
        pending = [sorted(g.members) for g in el.rebuilder.pending()]
        running = r.engine.worker_ids()
        await el.close()
        return el, pending, running

    el, pending, running = run_virtual(main())
    assert el.reconfigurations["worker_failed"] == 1 and "w-r0-0" not in el.executor.state.workers
    assert "w-r0-0" not in running
    assert len(pending) == 1 and len(pending[0]) == 1 and pending[0][0].startswith("w-r0-")
    assert pending[0][0] != "w-r0-0"
    failed = [h for h in el.history if h["kind"] == "worker_failed"]
    assert failed == [{"t": failed[0]["t"], "kind": "worker_failed", "worker": "w-r0-0", "reason": "server exited"}]


def test_training_start_waits_for_the_borrowed_gpus_to_come_back() -> None:
    async def main():
        clock = LoopClock()
        el, _r = _scheduler(clock)
        await _started(el)
        await el.submit(TrainingFinished(0, 0, expected_idle_s=300.0, event_id="tf0"), wait=True)
        serving = _active(el)
        await el.submit(TrainingStarted(1, event_id="ts1"), wait=True)
        back = (el.toggle.borrowed, _active(el))
        await el.close()
        return el, serving, back

    el, serving, (borrowed, after) = run_virtual(main())
    # the retained workers were parked first (state version 2 when the reserved workers were named)
    assert serving == {"w-r0-2", "w-r1-2", "o-t0", "o-t1"}
    assert not borrowed and after == {"w-r0-2", "w-r1-2"}
    assert el.reconfigurations["borrow"] == 1 and el.reconfigurations["return"] == 1
    assert el.trainer.running


def test_a_reclaim_notice_shrinks_before_its_deadline_and_a_cancelled_one_removes_nothing() -> None:
    async def main():
        clock = LoopClock()
        el, _r = _scheduler(clock, state=_state(0))
        await _started(el)
        await el.submit(_grant("p0", "p1", eid="g1"), wait=True)
        (grp,) = el.rebuilder.pending()
        assert grp.task is not None
        await grp.task
        await el.idle()
        grown = set(el.executor.state.workers)
        now = clock.now()
        await el.submit(ReclaimNotice(("p1",), deadline=now + 300.0, notice_id="keep"), wait=True)
        await el.submit(NoticeCancelled("keep"), wait=True)
        await el.submit(ReclaimNotice(("p0",), deadline=now + 60.0, notice_id="n1"), wait=True)
        await clock.sleep(70.0)
        await el.idle()
        await el.close()
        return el, grown, now

    el, grown, now = run_virtual(main())
    assert len(grown) == 4
    (shrink,) = el.shrinks
    assert shrink["gpus"] == ["p0"] and shrink["met_deadline"] and shrink["started_at"] == pytest.approx(now + 55.0)
    assert set(el.executor.state.gpus) == {"r0", "r1", "p1"} and el.notices == {}
    assert el.decision is not None and el.decision.n_workers == 3
    assert [h["kind"] for h in el.history if h["kind"].startswith("notice")] == ["notice_cancelled"]


def test_grants_are_declined_when_preemptible_gpus_are_off() -> None:
    async def main():
        clock = LoopClock()
        el, _r = _scheduler(clock, _cfg(**{"policy.use_preemptible": False}), _state(0))
        el.start()
        await el.submit(_grant("p0", eid="g1"), wait=True)
        await el.close()
        return el

    el = run_virtual(main())
    assert set(el.executor.state.gpus) == {"r0", "r1"}
    assert el.history[-1]["kind"] == "grant_declined" and el.history[-1]["reason"] == "policy.use_preemptible is off"


def test_a_reclaim_notice_teaches_the_expected_lifetime_of_preemptible_gpus() -> None:
    async def main():
        clock = LoopClock()
        el, _r = _scheduler(clock, state=_state(0))
        el.start()
        await el.submit(_grant("p0", eid="g1"), wait=True)
        await clock.sleep(100.0)
        await el.submit(ReclaimNotice(("p0",), deadline=clock.now() + 300.0, notice_id="n1"), wait=True)
        again = el.expected_lifetime_s
        await el.submit(ReclaimNotice(("p0",), deadline=clock.now() + 300.0, notice_id="n2"), wait=True)
        await el.close()
        return again, el.expected_lifetime_s

    first, second = run_virtual(main())
    assert first == pytest.approx(1800.0 + 0.3 * (100.0 - 1800.0))  # EMA of the observed lifetime
    assert second == first  # a GPU's lifetime is observed once


def test_switch_gate_holds_a_switch_that_the_lent_gpus_would_end() -> None:
    """At a batch boundary the trainer takes the lent GPUs back at once: a switch on the pool
    that includes them cannot pay back and is held (``outlook.hold_switch``, ``gate.switch_gate``).
    Without lent GPUs the budget holds and the same wish is carried out. The decision is steered
    here (colocation until the test asks, then a split predicted 20 % faster) so that the test
    does not depend on the profiles; the schedule hold, which weighs the same wish over the smaller
    pool the return leaves, is off so that the switch gate alone is seen."""
    want = {"split": False}

    class Steered(Decider):
        def decide(self, n: int, current: Allocation | None) -> Decision:
            d = Decider.decide(self, n, current)
            co = d.table.candidate(0)
            if not want["split"]:
                return replace(d, target=co.allocation, predicted_makespan_s=co.makespan_s,
                               switched=current != co.allocation, forced=False, reason="test: colocation")
            if current is None or current.mode is not Mode.COLOCATED or n < 2:
                return d
            split = Allocation.disaggregated(n // 2, n - n // 2)
            return replace(d, target=split, switched=True, forced=False, predicted_makespan_s=co.makespan_s / 1.2,
                           reason="test: a split 20 % faster")

    async def main():
        clock = LoopClock()
        el, r = _scheduler(clock, _cfg(**{"policy.gate_enabled": True, "policy.weigh_pool_schedule": False}))
        el.decider = lambda: Steered(el.cfg.workload.batch_size, el.tracker.hardware, el.tracker.workload,
                                     el.policy)
        await _started(el)
        batch = asyncio.ensure_future(r.pipeline.run_batch(0))  # a batch in flight: the borrow pays
        await clock.sleep(30.0)
        await el.submit(TrainingFinished(1, 0, expected_idle_s=600.0, event_id="tf1"), wait=True)  # lends t0, t1
        n_lent = el.slots(el.budget())
        hold = (hold_s(el.outlook(), n_lent, True, 100.0), el.costs.deactivation_s)
        want["split"] = True
        out = await el.replan("batch boundary with lent GPUs", batch_boundary=True)
        held = (out, el.allocation, dict(el.reconfigurations), [g for g in el.gate_log if g["kind"] == "switch"])
        want["split"] = False
        await el.submit(TrainingStarted(2, event_id="ts2"), wait=True)  # the lent GPUs go back
        want["split"] = True
        free = await el.replan("no lent GPUs")
        after = (free, el.allocation, [g for g in el.gate_log if g["kind"] == "switch"])
        batch.cancel()
        await asyncio.gather(batch, return_exceptions=True)
        await el.close()
        return n_lent, hold, held, after

    n_lent, (hold, c_d), (out, alloc, reconf, gates), (free, alloc2, gates2) = run_virtual(main())
    assert n_lent == 4 and hold == c_d
    assert out.switch is not None and out.switch.held and out.decision is out.switch.decision
    assert alloc == Allocation.colocated(4) and "mode_switch" not in reconf
    (g,) = gates
    assert not g["admit"] and g["outcome"] == "window_too_short" and g["from"] == "coloc" and g["to"] == "2P2D"
    # no shrink known: no gate entry, the switch is made
    assert free.switch is not None and free.switch.gate is None
    assert alloc2 == Allocation.disaggregated(1, 1) and gates2 == gates


def test_a_switch_on_the_pool_a_training_step_leaves_is_weighed_over_its_return() -> None:
    """While a training step holds the overlap GPUs the pool is the 2 reserved workers; the step
    gives 2 workers back ``d_act`` after its expected end. A split steered to be 20 % faster on 2
    workers, and no better than colocation on 4, is weighed over that schedule and held
    (``outlook.hold_for_schedule``): a ``schedule`` gate entry and ``switch_declined`` in the
    history. With ``weigh_pool_schedule`` off the same wish switches."""
    want = {"split": False}

    class Steered(Decider):
        def decide(self, n: int, current: Allocation | None) -> Decision:
            d = Decider.decide(self, n, current)
            co = d.table.candidate(0)
            if want["split"] and n == 2 and current is not None and current.mode is Mode.COLOCATED:
                return replace(d, target=Allocation.disaggregated(1, 1), switched=True, forced=False,
                               predicted_makespan_s=co.makespan_s / 1.2, reason="test: a split 20 % faster")
            return replace(d, target=co.allocation, predicted_makespan_s=co.makespan_s,
                           switched=current != co.allocation, forced=False, reason="test: colocation")

    async def main(weigh: bool):
        clock = LoopClock()
        el, r = _scheduler(clock, _cfg(**{"policy.weigh_pool_schedule": weigh}))
        el.decider = lambda: Steered(el.cfg.workload.batch_size, el.tracker.hardware, el.tracker.workload,
                                     el.policy)
        await _started(el)
        batch = asyncio.ensure_future(r.pipeline.run_batch(0))
        await el.submit(TrainingStarted(1, event_id="ts1"), wait=True)
        await clock.sleep(95.0)  # the step is expected to end 5 s from now
        o = el.outlook()
        want["split"] = True
        await el.replan("mid-step")
        want["split"] = False
        got = (o.returning_workers, el.allocation, [g for g in el.gate_log if g["kind"] == "schedule"],
               [h for h in el.history if h["kind"] == "switch_declined"])
        batch.cancel()
        await asyncio.gather(batch, return_exceptions=True)
        await el.close()
        return got

    returning, alloc, sched, declined = run_virtual(main(True))
    assert returning == 2 and alloc == Allocation.colocated(2)
    (g,) = sched
    assert not g["admit"] and g["outcome"] == "saving_below_threshold" and (g["from"], g["to"]) == ("coloc", "1P1D")
    assert g["saving"] <= g["threshold"] and g["reason"].startswith("hold coloc: 1P1D would save only")
    (h,) = declined
    assert h["current"] == "coloc" and h["target"] == "1P1D" and h["schedule"] == {k: g[k] for k in h["schedule"]}
    _returning, alloc_off, sched_off, _declined = run_virtual(main(False))
    assert alloc_off == Allocation.disaggregated(1, 1) and sched_off == []


def test_a_due_shrink_waits_on_the_queue_for_the_handler_in_progress() -> None:
    """A notice's timer queues its shrink: the shrink never runs beside a handler (here the return of
    lent GPUs, which takes the deactivation time), it runs right after it, before the events queued
    behind, and the timer ends with the shrink and the survivors' re-plan."""

    async def main():
        clock = LoopClock()
        el, _r = _scheduler(clock)
        await _started(el)
        await el.submit(_grant("p0", eid="g1"), wait=True)
        (grp,) = el.rebuilder.pending()
        assert grp.task is not None
        await grp.task
        await el.idle()
        await el.submit(TrainingFinished(0, 0, expected_idle_s=300.0, event_id="tf0"), wait=True)
        assert el.toggle.borrowed
        now = clock.now()
        await el.submit(ReclaimNotice(("p0",), deadline=now + 1.0, notice_id="n1"))  # shrink due at once
        started = asyncio.ensure_future(el.submit(TrainingStarted(1, event_id="ts1"), wait=True))
        await asyncio.sleep(0)
        (notice,) = el.notices.values()
        assert notice.timer is not None
        await notice.timer  # ends once the shrink and the survivors' re-plan were handled
        kinds = [h["kind"] for h in el.history if h["t"] >= now]
        await started
        await el.idle()
        await el.close()
        return el, kinds, now

    el, kinds, now = run_virtual(main())
    (shrink,) = el.shrinks
    ret = next(h for h in el.history if h["kind"] == "return")
    assert shrink["started_at"] >= ret["t"] > now  # after the return handler, not beside it
    assert kinds.index("return") < kinds.index("shrink")
    after = kinds[kinds.index("shrink") + 1:]
    assert after[0] == "replan" and el.notices == {}
    assert not {"p0"} & set(el.executor.state.gpus)


class _SlowShrink(ClusterRebuilder):
    """The rebuilder whose shrink takes ``took_s`` more (a server that is slow to drain and stop)."""

    took_s = 8.0

    async def shrink(self, gpu_ids, deadline):  # type: ignore[no-untyped-def]
        await self.clock.sleep(self.took_s)
        return await super().shrink(gpu_ids, deadline)


def test_a_slow_shrink_lengthens_the_lead_of_the_next_one() -> None:
    """The shrink lead is measured: the first shrink starts ``shrink_margin_s`` (5 s) before its
    deadline and, taking 8 s, misses it; the next starts 1.5 x 8 = 12 s before its deadline and meets it."""

    async def main():
        clock = LoopClock()
        r = rig(clock, _state(0), _cfg())
        rb = _SlowShrink(r.executor, r.engine, clock, r.latest_weights)
        tg = ToggleManager(r.executor, r.engine, clock, r.cfg.cluster.tp_size)
        el = ElasticScheduler(r.cfg, clock, r.executor, rb, tg, r.tracker, r.pipeline)
        await _started(el)
        await el.submit(_grant("p0", "p1", eid="g1"), wait=True)
        (grp,) = el.rebuilder.pending()
        assert grp.task is not None
        await grp.task
        await el.idle()
        assert el.book.lead_s == 5.0
        t1 = clock.now()
        await el.submit(ReclaimNotice(("p0",), deadline=t1 + 60.0, notice_id="n1"), wait=True)
        await clock.sleep(70.0)
        await el.idle()
        t2 = clock.now()
        await el.submit(ReclaimNotice(("p1",), deadline=t2 + 60.0, notice_id="n2"), wait=True)
        await clock.sleep(70.0)
        await el.idle()
        await el.close()
        return el, t1, t2

    el, t1, t2 = run_virtual(main())
    first, second = el.shrinks
    assert first["started_at"] == pytest.approx(t1 + 55.0 + 8.0) and not first["met_deadline"]
    assert el.book.lead_s == pytest.approx(12.0)
    assert second["started_at"] == pytest.approx(t2 + 48.0 + 8.0) and second["met_deadline"]
    assert [h["next_lead_s"] for h in el.history if h["kind"] == "shrink"] == [pytest.approx(12.0)] * 2
