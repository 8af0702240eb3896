"""Toggle Manager alone: retained overlap workers, lending, and the mandatory return on the emulated engine."""

from __future__ import annotations

from pearl.core.decision import Allocation
from pearl.core.planner import Plan, PlanStep, StepKind
from pearl.core.state import ClusterState, Gpu, Role, WorkerStatus, Zone
from pearl.runtime.clock import LoopClock, run_virtual
from pearl.runtime.toggle import ToggleManager

from .helpers import Rig, config, rig


def _state(training: int = 2) -> ClusterState:
    return ClusterState.build([Gpu("r0", Zone.RESERVED)] + [Gpu(f"t{i}", Zone.OVERLAP, "tnode0") for i in range(training)])


def _lent(r: Rig) -> list[str]:
    return sorted(g for g, x in r.executor.state.gpus.items() if x.lent)


def test_prepare_launches_one_parked_worker_per_tp_group() -> None:
    async def main():
        clock = LoopClock()
        r = rig(clock, _state(4), config(**{"workload.batch_size": 4, "workload.group_size": 2,
                                            "cluster.tp_size": 2}))
        tg = ToggleManager(r.executor, r.engine, clock, tp_size=2)
        ids = await tg.prepare(0, "emulated://v0")
        return r, tg, ids, [await r.engine.healthy(w) for w in ids]

    r, tg, ids, healthy = run_virtual(main())
    assert ids == ["o-t0", "o-t2"] and healthy == [True, True]
    st = r.executor.state
    assert {w: (x.gpus, x.status) for w, x in st.workers.items()} == {
        "o-t0": (("t0", "t1"), WorkerStatus.INACTIVE), "o-t2": (("t2", "t3"), WorkerStatus.INACTIVE)}
    assert tg.overlap_gpus() == ["t0", "t1", "t2", "t3"] and not tg.borrowed
    assert r.pipeline.router.workers == {}  # parked: not dispatchable


def test_a_worker_that_fails_to_start_is_left_out() -> None:
    async def main():
        clock = LoopClock()
        r = rig(clock, _state())
        r.engine.fail_next_launch(gpu="t1")
        tg = ToggleManager(r.executor, r.engine, clock)
        return r, await tg.prepare(0, "emulated://v0")

    r, ids = run_virtual(main())
    assert ids == ["o-t0"] and set(r.executor.state.workers) == {"o-t0"} and r.engine.worker_ids() == ["o-t0"]


def test_lend_then_give_back_drains_parks_and_un_lends() -> None:
    async def main():
        clock = LoopClock()
        r = rig(clock, _state())
        tg = ToggleManager(r.executor, r.engine, clock)
        await tg.prepare(0, "emulated://v0")
        lent = tg.lend()
        during = (_lent(r), tg.borrowed)
        # the scheduler's plan activates the retained workers on the lent GPUs
        await r.executor.execute(Plan(tuple(PlanStep(StepKind.ACTIVATE, w, (g,), Role.COLOCATED)
                                            for w, g in (("o-t0", "t0"), ("o-t1", "t1"))), Allocation.colocated(2)))
        serving = sorted(r.pipeline.router.workers)
        rep = await tg.give_back()
        return r, tg, lent, during, serving, rep

    r, tg, lent, during, serving, rep = run_virtual(main())
    assert lent == ["t0", "t1"] and during == (["t0", "t1"], True) and serving == ["o-t0", "o-t1"]
    assert rep.workers == ("o-t0", "o-t1") and rep.aborted_requests == 0
    lo, hi = r.cfg.emulator.deactivation_s
    assert lo <= rep.delay_s <= hi  # the two deactivations run concurrently
    assert tg.returns == [rep] and not tg.borrowed and _lent(r) == []
    assert {x.status for x in r.executor.state.workers.values()} == {WorkerStatus.INACTIVE}
    assert r.pipeline.router.workers == {}


def test_a_return_with_nothing_serving_is_no_handoff() -> None:
    async def main():
        clock = LoopClock()
        r = rig(clock, _state())
        tg = ToggleManager(r.executor, r.engine, clock)
        await tg.prepare(0, "emulated://v0")
        tg.lend()
        t0 = clock.now()
        return r, tg, await tg.give_back(), t0

    r, tg, rep, t0 = run_virtual(main())
    assert rep.workers == () and rep.started_at == rep.returned_at == t0 and rep.delay_s == 0.0
    assert tg.returns == [] and _lent(r) == [] and not tg.borrowed


def test_lending_without_training_gpus_borrows_nothing() -> None:
    async def main():
        clock = LoopClock()
        r = rig(clock, _state(0))
        tg = ToggleManager(r.executor, r.engine, clock)
        return tg, tg.lend(), await tg.prepare(0, "emulated://v0")

    tg, lent, ids = run_virtual(main())
    assert lent == [] and ids == [] and not tg.borrowed
