"""One elastic step (pearl/core/elastic_step.py): the budget, the re-plan's one target (decide ->
overrides -> plan -> hold) and the gates' shared preamble, on the Qwen3-8B H200 profiles."""

from __future__ import annotations

import math

from pearl.config import RunConfig
from pearl.core.decision import Allocation
from pearl.core.elastic_step import (
    NO_WORKERS_MAKESPAN_S,
    borrow_step,
    costs_from_policy,
    gate_makespans,
    replan_step,
    rollout_budget,
    slots,
    switch_kind,
)
from pearl.core.gate import CostModel
from pearl.core.outlook import PoolOutlook, TrainerView, remaining_s
from pearl.core.override import Decider
from pearl.core.planner import StepKind
from pearl.core.profile import HardwareProfile, WorkloadProfile
from pearl.core.state import ClusterState, Gpu, Role, Zone


def _pool() -> ClusterState:
    return ClusterState.build([Gpu(f"r{i}", Zone.RESERVED, "rnode0") for i in range(4)]
                              + [Gpu("t0", Zone.OVERLAP, "tnode0"), Gpu("p0", Zone.PREEMPTIBLE, "pnode0", "i-1")])


def _outlook(decider: Decider, **kw: object) -> PoolOutlook:
    base: dict[str, object] = {"now": 1000.0, "decider": decider, "costs": CostModel(), "trainer": TrainerView(100.0)}
    base.update(kw)
    return PoolOutlook(**base)  # type: ignore[arg-type]


def test_the_budget_is_every_gpu_rollout_may_use_now() -> None:
    st = _pool()
    budget = rollout_budget(st)
    assert budget == {"r0", "r1", "r2", "r3"}  # not the overlap GPU (not lent), not the free preemptible one
    assert (slots(st, budget, 1), slots(st, budget, 2), slots(st, budget, 3)) == (4, 2, 1)


def test_the_replan_takes_the_override_and_plans_it_in_one_call(cfg8b: RunConfig,
                                                                prof8b: tuple[HardwareProfile, WorkloadProfile]) -> None:
    hw, wl = prof8b
    policy = cfg8b.policy.model_copy(update={"allocation_overrides": {4: "1P3D"}})
    st = _pool()
    step = replan_step(_outlook(Decider(8, hw, wl, policy)), st, rollout_budget(st), 1, batch_boundary=False)
    assert step.decision.target == Allocation.disaggregated(1, 3)
    assert step.decision.reason == "override: allocation_overrides[4] = 1P3D"
    assert step.wish is step.decision and step.switch.gate is None  # a first decision is never held
    adds = step.plan.of_kind(StepKind.ADD)
    assert sorted(s.role for s in adds) == [Role.DECODE, Role.DECODE, Role.DECODE, Role.PREFILL]
    assert {g for s in adds for g in s.gpus} == {"r0", "r1", "r2", "r3"}
    plain = replan_step(_outlook(Decider(8, hw, wl, cfg8b.policy)), st, rollout_budget(st), 1, False)
    alone = Decider(8, hw, wl, cfg8b.policy).decide(4, None)
    assert (plain.decision.target, plain.decision.predicted_makespan_s) == (alone.target, alone.predicted_makespan_s)


def test_the_gates_share_one_preamble(cfg8b: RunConfig, prof8b: tuple[HardwareProfile, WorkloadProfile]) -> None:
    hw, wl = prof8b
    dec = Decider(8, hw, wl, cfg8b.policy)
    o = _outlook(dec)
    assert gate_makespans(o, 0, 2) == (NO_WORKERS_MAKESPAN_S, dec.fresh_makespan(2))
    assert gate_makespans(o, 2, 4) == (dec.fresh_makespan(2), dec.fresh_makespan(4))
    given, unknown = borrow_step(o, 2, 4, 300.0), borrow_step(o, 2, 4, None)
    assert given.window_s == 300.0 and unknown.window_s == remaining_s(o)
    assert math.isfinite(given.gate.saving_s)


def test_the_cost_emas_start_from_the_policys_priors(cfg8b: RunConfig) -> None:
    p = cfg8b.policy.model_copy(update={"initial_activation_s": 7.0, "initial_expansion_prep_s": 50.0,
                                        "cost_ema_alpha": 0.4})
    c = costs_from_policy(p)
    assert (c.activation_s, c.deactivation_s, c.expansion_prep_s, c.expansion_final_s, c.weight_sync_s, c.alpha) == (
        7.0, p.initial_deactivation_s, 50.0, p.initial_expansion_final_s, p.initial_weight_sync_s, 0.4)


def test_a_budget_change_that_also_changes_the_ratio_is_counted_as_a_ratio_switch(cfg8b: RunConfig) -> None:
    """A borrow takes 4P12D on 16 workers to 32: its projection 8P24D is no switch, 7P25D is a ratio
    switch (the decision chose another P:D); a return that projects 7P25D back is none."""
    pol, a = cfg8b.policy, Allocation.disaggregated
    assert switch_kind(a(4, 12), a(8, 24), pol) is None
    assert switch_kind(a(4, 12), a(7, 25), pol) == "ratio_switch"
    assert switch_kind(a(7, 25), a(4, 12), pol) is None  # round(7 / 32 * 16) = 4
    assert switch_kind(a(8, 24), a(7, 25), pol) == "ratio_switch"
    assert switch_kind(Allocation.colocated(16), a(4, 12), pol) == "mode_switch"
    assert switch_kind(a(4, 12), Allocation.colocated(32), pol) == "mode_switch"
    assert switch_kind(Allocation.colocated(16), Allocation.colocated(32), pol) is None
    assert switch_kind(None, a(4, 12), pol) is None
