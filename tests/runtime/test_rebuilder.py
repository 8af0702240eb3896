"""Cluster Rebuilder alone: all-or-nothing background expansion and urgent shrink on the emulated engine."""

from __future__ import annotations

from pearl.core.state import ClusterState, Gpu, Role, Worker, WorkerStatus, Zone
from pearl.runtime.clock import LoopClock, run_virtual
from pearl.runtime.rebuilder import ClusterRebuilder, ExpansionGroup, GroupStatus

from .helpers import Rig, rig


def _state() -> ClusterState:
    gpus = [Gpu("r0", Zone.RESERVED)] + [Gpu(f"p{i}", Zone.PREEMPTIBLE, "pnode0", "i-1") for i in range(4)]
    return ClusterState.build(gpus, [Worker("w0", ("r0",), Role.COLOCATED, WorkerStatus.ACTIVE)])


async def _rig(clock: LoopClock) -> tuple[Rig, ClusterRebuilder]:
    r = rig(clock, _state())
    await r.serve("w0", ("r0",))
    return r, ClusterRebuilder(r.executor, r.engine, clock, r.latest_weights)


MEMBERS = {"w-p0": (("p0",), Role.PREFILL), "w-p1": (("p1",), Role.DECODE)}


def test_a_group_prepares_outside_the_state_and_is_admitted_whole() -> None:
    async def main():
        clock = LoopClock()
        r, rb = await _rig(clock)
        settled: list[tuple[str, GroupStatus]] = []
        grp = rb.expand(dict(MEMBERS), lambda g: settled.append((g.group_id, g.status)))
        preparing = (set(r.executor.state.workers), rb.preparing_gpus(), [g.group_id for g in rb.pending()])
        assert grp.task is not None
        await grp.task
        staged = await rb.stage(grp)
        staged_state = {w: x.status for w, x in r.executor.state.workers.items()}
        admitted = rb.admit(grp)
        return r, rb, grp, settled, preparing, staged, staged_state, admitted

    r, rb, grp, settled, preparing, staged, staged_state, admitted = run_virtual(main())
    assert preparing == ({"w0"}, {"p0", "p1"}, ["x1"])  # nothing partial is visible
    assert settled == [("x1", GroupStatus.READY)]
    assert staged and staged_state == {"w0": WorkerStatus.ACTIVE, "w-p0": WorkerStatus.INITIALIZING,
                                       "w-p1": WorkerStatus.INITIALIZING}
    assert admitted == ["w-p0", "w-p1"] and grp.status is GroupStatus.ADMITTED and rb.pending() == []
    assert r.pipeline.router.workers == {"w0": Role.COLOCATED, "w-p0": Role.PREFILL, "w-p1": Role.DECODE}
    lo, hi = r.cfg.emulator.launch_s
    assert set(grp.prep_s) == set(grp.final_s) == {"w-p0", "w-p1"}
    assert all(lo <= s <= hi for s in grp.prep_s.values())
    # the state went from no member to every member at once, and then every member serving at once
    members = set(MEMBERS)
    assert all(not (set(s.workers) & members) or members <= set(s.workers) for s in r.states)


def test_a_failed_member_fails_and_stops_the_whole_group() -> None:
    async def main():
        clock = LoopClock()
        r, rb = await _rig(clock)
        r.engine.fail_next_launch(gpu="p1")
        settled: list[ExpansionGroup] = []
        grp = rb.expand(dict(MEMBERS), settled.append)
        assert grp.task is not None
        await grp.task
        return r, rb, grp, settled, await rb.stage(grp)

    r, rb, grp, settled, staged = run_virtual(main())
    assert grp.status is GroupStatus.FAILED and settled == [grp] and not staged
    assert grp.error.startswith("w-p1: ") and "injected" in grp.error
    assert r.engine.worker_ids() == ["w0"]  # the member that started was stopped too
    assert set(r.executor.state.workers) == {"w0"} and rb.preparing_gpus() == set()


def test_a_retry_never_reuses_an_earlier_members_id() -> None:
    async def main():
        clock = LoopClock()
        _r, rb = await _rig(clock)
        first = rb.expand({"w-p0": (("p0",), Role.COLOCATED)})
        await rb.cancel(first, "test")
        second = rb.expand({"w-p0": (("p0",), Role.COLOCATED), "w-p2": (("p2",), Role.COLOCATED)})
        third = rb.expand({"w-p0": (("p3",), Role.COLOCATED)})
        await rb.close()
        return first, second, third

    first, second, third = run_virtual(main())
    assert first.status is GroupStatus.CANCELLED and first.error == "test"
    assert (list(second.members), list(third.members)) == (["w-p0.2", "w-p2"], ["w-p0.3"])
    assert second.status is third.status is GroupStatus.CANCELLED  # close() cancels what is pending


def test_admission_reloads_a_member_behind_the_latest_weights() -> None:
    async def main():
        clock = LoopClock()
        r, rb = await _rig(clock)
        grp = rb.expand(dict(MEMBERS))
        assert grp.task is not None
        await grp.task
        r.weights = (2, "emulated://v2")  # the trainer published while the group prepared
        ok = await rb.stage(grp)
        rb.admit(grp)
        return r, ok, [await r.engine.weight_version(w) for w in MEMBERS]

    r, ok, versions = run_virtual(main())
    assert ok and versions == [2, 2]
    assert r.pipeline.worker_versions["w-p0"] == r.pipeline.worker_versions["w-p1"] == 2


def test_admission_fails_when_a_members_gpu_was_taken_meanwhile() -> None:
    async def main():
        clock = LoopClock()
        r, rb = await _rig(clock)
        grp = rb.expand(dict(MEMBERS))
        assert grp.task is not None
        await grp.task
        r.executor.set_state(r.executor.state.remove_gpus(["p1"]))
        ok = await rb.stage(grp)
        return r, grp, ok, rb.admit(grp)

    r, grp, ok, admitted = run_virtual(main())
    assert not ok and grp.status is GroupStatus.FAILED and admitted == []
    assert grp.error == "admission: GPUs ['p1'] are gone or taken"
    assert r.engine.worker_ids() == ["w0"] and set(r.executor.state.workers) == {"w0"}


def test_a_shrink_removes_the_workers_drops_the_gpus_and_cancels_groups_on_them() -> None:
    async def main():
        clock = LoopClock()
        r, rb = await _rig(clock)
        grp = rb.expand({"w-p0": (("p0",), Role.COLOCATED)})
        assert grp.task is not None
        await grp.task
        assert await rb.stage(grp)
        rb.admit(grp)
        settled: list[ExpansionGroup] = []
        pending = rb.expand({"w-p2": (("p2",), Role.COLOCATED)}, settled.append)
        t0 = clock.now()
        rep = await rb.shrink(["p0", "p2", "p0"], deadline=t0 + 120.0)
        return r, rep, pending, settled, t0

    r, rep, pending, settled, t0 = run_virtual(main())
    assert rep.gpus == ("p0", "p2") and rep.workers == ("w-p0",) and rep.cancelled_groups == ("x2",)
    assert rep.started_at == t0 and rep.met_deadline and rep.deadline == t0 + 120.0
    assert pending.status is GroupStatus.CANCELLED and settled == []  # a cancelled group is not "settled"
    assert set(r.executor.state.gpus) == {"r0", "p1", "p3"} and set(r.executor.state.workers) == {"w0"}
    assert r.engine.worker_ids() == ["w0"] and "w-p0" not in r.pipeline.router.workers
