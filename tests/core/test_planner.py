"""Minimal-change planning: exact cases and a property test against brute force."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pearl.core.decision import Allocation
from pearl.core.planner import PlanError, StepKind, apply_plan, plan, target_roles
from pearl.core.state import ClusterState, Gpu, Role, Worker, WorkerStatus, Zone

A, INACT, N, D = WorkerStatus.ACTIVE, WorkerStatus.INACTIVE, WorkerStatus.INITIALIZING, WorkerStatus.DRAINING
C, P, DEC = Role.COLOCATED, Role.PREFILL, Role.DECODE


def cluster(n_res: int, n_pre: int, n_ovl: int, lent: int = 0) -> list[Gpu]:
    return ([Gpu(f"r{i}", Zone.RESERVED) for i in range(n_res)] + [Gpu(f"p{i}", Zone.PREEMPTIBLE) for i in range(n_pre)]
            + [Gpu(f"o{i}", Zone.OVERLAP, lent=i < lent) for i in range(n_ovl)])


def test_colocated_to_2p2d_changes_only_two_roles() -> None:
    s = ClusterState.build(cluster(4, 0, 0), [Worker(f"w{i}", (f"r{i}",), C, A) for i in range(4)])
    p = plan(s, Allocation.disaggregated(2, 2), ["r0", "r1", "r2", "r3"])
    assert p.n_changes == 4  # every colocated worker must change role
    assert {st.kind for st in p.steps} == {StepKind.CHANGE_ROLE}
    s2 = ClusterState.build(cluster(4, 0, 0), [Worker("w0", ("r0",), P, A), Worker("w1", ("r1",), DEC, A),
                                                Worker("w2", ("r2",), DEC, A), Worker("w3", ("r3",), DEC, A)])
    p2 = plan(s2, Allocation.disaggregated(2, 2), ["r0", "r1", "r2", "r3"])
    assert p2.n_changes == 1 and p2.steps[0].kind is StepKind.CHANGE_ROLE and p2.steps[0].role is P


def test_reclaim_removes_only_the_reclaimed_worker_and_grant_adds() -> None:
    s = ClusterState.build(cluster(2, 2, 0), [Worker("w0", ("r0",), C, A), Worker("w1", ("r1",), C, A),
                                              Worker("w2", ("p0",), C, A)])
    p = plan(s, Allocation.colocated(3), ["r0", "r1", "p1"])
    kinds = [(st.kind, st.worker_id) for st in p.steps]
    assert kinds[0] == (StepKind.REMOVE, "w2")
    assert kinds[1][0] is StepKind.ADD and p.steps[1].gpus == ("p1",)
    assert p.n_changes == 2


def test_overlap_workers_are_deactivated_not_removed_and_reactivated_in_role() -> None:
    gpus = cluster(2, 0, 2, lent=2)
    s = ClusterState.build(gpus, [Worker("w0", ("r0",), P, A), Worker("w1", ("r1",), DEC, A),
                                  Worker("wo0", ("o0",), DEC, A), Worker("wo1", ("o1",), DEC, INACT)])
    back = plan(s, Allocation.disaggregated(1, 1), ["r0", "r1"])
    assert [(st.kind, st.worker_id) for st in back.steps] == [(StepKind.DEACTIVATE, "wo0")]
    borrow = plan(s, Allocation.disaggregated(1, 3), ["r0", "r1", "o0", "o1"])
    assert [(st.kind, st.worker_id) for st in borrow.steps] == [(StepKind.ACTIVATE, "wo1")]


def test_tp_groups_stay_on_one_node() -> None:
    gpus = [Gpu(f"n{n}g{g}", Zone.PREEMPTIBLE, node=f"n{n}") for n in range(2) for g in range(3)]
    s = ClusterState.build(gpus)
    p = plan(s, Allocation.colocated(2), [g.gpu_id for g in gpus], tp_size=2)
    assert [st.gpus for st in p.steps] == [("n0g0", "n0g1"), ("n1g0", "n1g1")]


def test_unreachable_target_and_stale_plan_are_refused() -> None:
    s = ClusterState.build(cluster(2, 0, 0))
    with pytest.raises(PlanError, match="needs 3 workers but only 2 fit"):
        plan(s, Allocation.colocated(3), ["r0", "r1"])
    with pytest.raises(PlanError, match="not in the cluster state"):
        plan(s, Allocation.colocated(1), ["zz"])
    p = plan(s, Allocation.colocated(2), ["r0", "r1"])
    s2 = apply_plan(s, p)
    with pytest.raises(PlanError, match="made for state version"):
        apply_plan(s2, p)


# ----------------------------------------------------------------------------- brute force
def brute_force_min(state: ClusterState, target: Allocation, pool: frozenset[str], tp: int) -> int:
    from pearl.core.planner import free_groups

    want = target_roles(target)
    fixed = 0
    slots: list[tuple[str, Role | None]] = []
    for w in state.workers.values():
        live = w.status in (A, N)
        if not all(g in pool for g in w.gpus):
            if live or state.zone_of(w) is not Zone.OVERLAP:
                fixed += 1
            continue
        slots.append(("live" if live else "parked", w.role))
    slots += [("new", None)] * len(free_groups(state, pool, tp))
    best = None
    for assign in itertools.product([None, C, P, DEC], repeat=len(slots)):
        if any(sum(1 for a in assign if a is r) != want[r] for r in (C, P, DEC)):
            continue
        cost = 0
        for (kind, role), a in zip(slots, assign, strict=True):
            if kind == "live":
                cost += 1 if a is None or a is not role else 0
            elif kind == "parked":
                cost += 0 if a is None else 1 + (a is not role)
            else:
                cost += 0 if a is None else 1
        best = cost if best is None else min(best, cost)
    assert best is not None
    return fixed + best


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[ClusterState, Allocation, frozenset[str]]:
    n_res, n_pre, n_ovl = draw(st.integers(0, 2)), draw(st.integers(0, 2)), draw(st.integers(0, 2))
    if n_res + n_pre + n_ovl == 0:
        n_res = 1
    lent_flags = [draw(st.booleans()) for _ in range(n_ovl)]
    gpus = cluster(n_res, n_pre, 0) + [Gpu(f"o{i}", Zone.OVERLAP, lent=lent_flags[i]) for i in range(n_ovl)]
    workers = []
    for g in gpus:
        if draw(st.booleans()):
            role = draw(st.sampled_from([C, P, DEC]))
            statuses = [INACT, A, N, D] if (g.zone is not Zone.OVERLAP or g.lent) else [INACT, N]
            workers.append(Worker(f"w{g.gpu_id}", (g.gpu_id,), role, draw(st.sampled_from(statuses))))
    state = ClusterState.build(gpus, workers)
    usable = [g.gpu_id for g in gpus if g.zone is not Zone.OVERLAP or g.lent]
    pool = frozenset(g for g in usable if draw(st.booleans()))
    n = len(pool)
    if n >= 2 and draw(st.booleans()):
        n_p = draw(st.integers(1, n - 1))
        target = Allocation.disaggregated(n_p, n - n_p)
    else:
        target = Allocation.colocated(draw(st.integers(0, n)))
    return state, target, pool


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_plan_is_minimal_and_reaches_the_target(sc: tuple[ClusterState, Allocation, frozenset[str]]) -> None:
    state, target, pool = sc
    p = plan(state, target, pool)
    assert p.n_changes == brute_force_min(state, target, pool, 1)
    after = apply_plan(state, p)
    serving = [w for w in after.workers.values() if w.status in (A, N) and all(g in pool for g in w.gpus)]
    want = target_roles(target)
    for r in (C, P, DEC):
        assert sum(1 for w in serving if w.role is r) == want[r]
    # no worker outside the pool serves; bindings of surviving workers never change
    for w in after.workers.values():
        if w.worker_id in state.workers:
            assert w.gpus == state.workers[w.worker_id].gpus
        if not all(g in pool for g in w.gpus):
            assert w.status in (INACT, D)
