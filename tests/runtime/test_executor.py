"""Plan executor alone: plan steps applied to the emulated engine, the pipeline's router and the state."""

from __future__ import annotations

import asyncio

from pearl.core.decision import Allocation
from pearl.core.planner import Plan, PlanStep, StepKind
from pearl.core.state import ClusterState, Gpu, Role, Worker, WorkerStatus, Zone
from pearl.engines.base import ServerSpec
from pearl.runtime.clock import LoopClock, run_virtual
from pearl.runtime.executor import ExecutionReport

from .helpers import Rig, rig

ACTIVE, INACTIVE = WorkerStatus.ACTIVE, WorkerStatus.INACTIVE


def _state(lent: bool = True) -> ClusterState:
    gpus = [Gpu("r0", Zone.RESERVED), Gpu("r1", Zone.RESERVED), Gpu("r2", Zone.RESERVED),
            Gpu("t0", Zone.OVERLAP, lent=lent)]
    workers = [Worker("w0", ("r0",), Role.COLOCATED, ACTIVE), Worker("w1", ("r1",), Role.COLOCATED, ACTIVE),
               Worker("w2", ("r2",), Role.COLOCATED, ACTIVE), Worker("o-t0", ("t0",), Role.COLOCATED, INACTIVE)]
    return ClusterState.build(gpus, workers)


async def _serving_rig(clock: LoopClock, lent: bool = True, response: int = 200) -> Rig:
    """w0-w2 serving on the engine and the router; o-t0 retained with its memory released (its GPU
    lent to rollout by the trainer unless ``lent`` is False)."""
    r = rig(clock, _state(lent), response=response)
    for w, g in (("w0", "r0"), ("w1", "r1"), ("w2", "r2")):
        await r.serve(w, (g,))
    await r.engine.launch(ServerSpec("o-t0", ("t0",), Role.COLOCATED, "emulated://v0", 0))
    await r.engine.release_memory("o-t0")
    return r


def _history(r: Rig, worker: str) -> list[tuple[str, str] | None]:
    """(status, role) of ``worker`` in every published state, consecutive repeats dropped."""
    out: list[tuple[str, str] | None] = []
    for s in r.states:
        w = s.workers.get(worker)
        cur = None if w is None else (w.status.value, w.role.value)
        if not out or out[-1] != cur:
            out.append(cur)
    return out


def test_a_plan_removes_re_roles_and_activates_and_leaves_additions_to_the_rebuilder() -> None:
    plan = Plan((PlanStep(StepKind.REMOVE, "w2", ("r2",), Role.COLOCATED),
                 PlanStep(StepKind.CHANGE_ROLE, "w0", ("r0",), Role.PREFILL, Role.COLOCATED),
                 PlanStep(StepKind.CHANGE_ROLE, "w1", ("r1",), Role.DECODE, Role.COLOCATED),
                 PlanStep(StepKind.ACTIVATE, "o-t0", ("t0",), Role.DECODE),
                 PlanStep(StepKind.ADD, "w-new", ("r9",), Role.DECODE)),
                Allocation.disaggregated(1, 2))

    async def main():
        clock = LoopClock()
        r = await _serving_rig(clock)
        rep = await r.executor.execute(plan)
        return r, rep, r.engine.worker_ids()

    r, rep, running = run_virtual(main())
    st = r.executor.state
    assert rep.steps == 4 and rep.errors == [] and rep.aborted_requests == 0
    assert {w: (x.role, x.status) for w, x in st.workers.items()} == {
        "w0": (Role.PREFILL, ACTIVE), "w1": (Role.DECODE, ACTIVE), "o-t0": (Role.DECODE, ACTIVE)}
    assert running == ["o-t0", "w0", "w1"]  # w2's server stopped; no server launched for w-new
    assert r.pipeline.router.workers == {"w0": Role.PREFILL, "w1": Role.DECODE, "o-t0": Role.DECODE}
    # a serving worker is drained before its role changes and serves again after it
    assert _history(r, "w0") == [("active", "colocated"), ("draining", "colocated"), ("draining", "prefill"),
                                 ("active", "prefill")]
    assert _history(r, "w2") == [None]
    assert rep.timings["change_role"] == [r.cfg.emulator.role_switch_s] * 2
    lo, hi = r.cfg.emulator.activation_s
    (act,) = rep.timings["activate"]
    assert lo <= act <= hi + r.cfg.emulator.role_switch_s  # resume memory, then the new role


def test_an_activated_worker_loads_the_latest_weights_first() -> None:
    plan = Plan((PlanStep(StepKind.ACTIVATE, "o-t0", ("t0",), Role.COLOCATED),), Allocation.colocated(4))

    async def main():
        clock = LoopClock()
        r = await _serving_rig(clock)
        r.weights = (3, "emulated://v3")  # the trainer published while o-t0 was parked
        rep = await r.executor.execute(plan)
        return r, rep, await r.engine.weight_version("o-t0")

    r, rep, version = run_virtual(main())
    assert rep.errors == [] and version == 3
    assert r.pipeline.worker_versions["o-t0"] == 3 and r.pipeline.router.workers["o-t0"] is Role.COLOCATED
    assert r.executor.state.workers["o-t0"].status is ACTIVE


def test_activating_a_worker_on_gpus_the_trainer_holds_is_an_error() -> None:
    plan = Plan((PlanStep(StepKind.ACTIVATE, "o-t0", ("t0",), Role.COLOCATED),), Allocation.colocated(4))

    async def main():
        clock = LoopClock()
        r = await _serving_rig(clock, lent=False)
        return r, await r.executor.execute(plan)

    r, rep = run_virtual(main())
    assert rep.errors == ["activate o-t0: overlap worker 'o-t0' is active but its GPUs are not all lent by the trainer"]
    assert r.executor.state.workers["o-t0"].status is INACTIVE and "o-t0" not in r.pipeline.router.workers


def test_deactivation_parks_a_lent_worker() -> None:
    async def main():
        clock = LoopClock()
        r = await _serving_rig(clock)
        await r.executor.execute(Plan((PlanStep(StepKind.ACTIVATE, "o-t0", ("t0",), Role.COLOCATED),),
                                      Allocation.colocated(4)))
        rep = await r.executor.execute(Plan((PlanStep(StepKind.DEACTIVATE, "o-t0", ("t0",), Role.COLOCATED),),
                                            Allocation.colocated(3)))
        return r, rep, await r.engine.healthy("o-t0")

    r, rep, healthy = run_virtual(main())
    lo, hi = r.cfg.emulator.deactivation_s
    assert rep.steps == 1 and rep.errors == [] and lo <= rep.timings["deactivate"][0] <= hi
    assert r.executor.state.workers["o-t0"].status is INACTIVE and "o-t0" not in r.pipeline.router.workers
    assert healthy  # the process is retained, memory released
    assert _history(r, "o-t0")[-3:] == [("active", "colocated"), ("draining", "colocated"), ("inactive", "colocated")]


def test_a_worker_whose_server_died_is_recorded_and_leaves_the_topology() -> None:
    plan = Plan((PlanStep(StepKind.CHANGE_ROLE, "w1", ("r1",), Role.PREFILL, Role.COLOCATED),),
                Allocation.colocated(3))

    async def main():
        clock = LoopClock()
        r = await _serving_rig(clock)
        await r.engine.stop("w1")  # the server died
        rep = await r.executor.execute(plan)
        return r, rep

    r, rep = run_virtual(main())
    (err,) = rep.errors
    assert err.startswith("change_role w1 -> prefill: ")
    assert "w1" not in r.executor.state.workers and "w1" not in r.pipeline.router.workers
    assert set(r.executor.state.workers) == {"w0", "w2", "o-t0"}


def test_removing_a_serving_worker_aborts_its_requests_and_the_batch_completes_elsewhere() -> None:
    async def main():
        clock = LoopClock()
        r = await _serving_rig(clock, response=4000)
        batch = asyncio.ensure_future(r.pipeline.run_batch(0))
        await clock.sleep(2.0)  # every trajectory's first turn is decoding (4000 tokens)
        busy = max(("w0", "w1", "w2"), key=r.pipeline.inflight_on)
        in_flight = r.pipeline.inflight_on(busy)
        rep = ExecutionReport()
        await r.executor.remove(busy, rep)
        records = await batch
        return r, busy, in_flight, rep, records

    r, busy, in_flight, rep, records = run_virtual(main())
    assert in_flight >= 1 and rep.aborted_requests == in_flight
    assert busy not in r.executor.state.workers and busy not in r.engine.worker_ids()
    assert len(records) == 4 and all(x.status.value == "completed" for x in records)
    assert r.pipeline.stats.interruptions == in_flight
