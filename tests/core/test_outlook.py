"""Forecasts over a frozen ``PoolOutlook`` (pearl/core/outlook.py) and the decision's overrides
(pearl/core/override.py), on the Qwen3-8B H200 profiles from the config."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from pearl.config import RunConfig
from pearl.core.decision import Allocation, Mode
from pearl.core.gate import CostModel
from pearl.core.outlook import (
    Expansion,
    PoolChange,
    PoolOutlook,
    Reclaim,
    Segment,
    TrainerView,
    batch_forecast,
    hold_for_schedule,
    hold_s,
    hold_switch,
    lent_leaving,
    pool_changes,
    pool_schedule,
    regrowth_admitted,
    remaining_s,
    speeds_since,
    sync_stall,
)
from pearl.core.override import Decider, apply_overrides
from pearl.core.profile import HardwareProfile, WorkloadProfile

COSTS = CostModel(activation_s=6.0, deactivation_s=4.0, expansion_prep_s=60.0, expansion_final_s=15.0,
                  weight_sync_s=2.0, alpha=0.3)


@pytest.fixture
def decider(cfg8b: RunConfig, prof8b: tuple[HardwareProfile, WorkloadProfile]) -> Decider:
    hw, wl = prof8b
    return Decider(8, hw, wl, cfg8b.policy)


def _outlook(decider: Decider, n: int = 4, **kw: object) -> PoolOutlook:
    d = decider.decide(n, None)
    base: dict[str, object] = {"now": 1000.0, "decider": decider, "costs": COSTS, "decision": d,
                               "allocation": d.target, "trainer": TrainerView(100.0)}
    base.update(kw)
    return PoolOutlook(**base)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------- pool changes
def test_lent_workers_leave_only_a_pool_they_do_not_fill(decider: Decider) -> None:
    o = _outlook(decider, lent_workers=2)
    assert (lent_leaving(o, 4), lent_leaving(o, 2), lent_leaving(o, 1)) == (2, 0, 0)
    assert lent_leaving(_outlook(decider), 4) == 0


def test_known_changes_are_the_return_regrowth_reclaims_and_expansions_in_time_order(decider: Decider) -> None:
    o = _outlook(decider, lent_workers=2,
                 reclaims=(Reclaim(1100.0, frozenset({"p0"}), 1),
                           Reclaim(1050.0, frozenset({"p1"}), 1, started=True),
                           Reclaim(1200.0, frozenset({"p2"}), 0)),
                 expansions=(Expansion(frozenset({"p3", "p4"}), 2, started_at=990.0),
                             Expansion(frozenset({"p5"}), 1, started_at=900.0, ready_at=1010.0),
                             Expansion(frozenset({"p1"}), 1, started_at=995.0)))  # under a notice: cancelled
    assert pool_changes(o, True, 6) == [
        PoolChange(4.0, -2, False),                # the return: d_ret
        PoolChange(25.0, 1, False),                # a ready group: ready_at + t_final - now
        PoolChange(65.0, 2, False),                # preparing: started_at + t_prep + t_final - now
        PoolChange(95.0, -1, False),               # the shrink start: deadline - shrink_margin_s - now
        PoolChange(110.0, 2, True),                # the regrowth: d_ret + T + d_act
    ]
    # the trainer has no batch waiting: the lent workers stay; a past shrink start is due now
    late = replace(o, now=1099.0)
    assert pool_changes(late, False, 6) == [PoolChange(0.0, -1, False), PoolChange(0.0, 1, False),
                                           PoolChange(0.0, 2, False)]


# ---------------------------------------------------------------------------------- composed makespan
def test_without_a_known_change_the_schedule_is_the_decision(decider: Decider) -> None:
    o = _outlook(decider)
    d = o.decision
    assert d is not None
    assert pool_schedule(o, d, True) == (d.predicted_makespan_s, (Segment(0.0, d.predicted_makespan_s, 4),))
    assert batch_forecast(o, True) == decider.decide(4, d.target).predicted_makespan_s


def test_a_reclaim_slows_the_rest_of_the_batch_to_the_smaller_pool(decider: Decider) -> None:
    o = _outlook(decider, reclaims=(Reclaim(1100.0, frozenset({"p0"}), 1),))
    d = o.decision
    assert d is not None
    m4, m3 = d.predicted_makespan_s, decider.decide(3, d.target).predicted_makespan_s  # against the one in force
    m_hat, segments = pool_schedule(o, d, False)
    assert segments == (Segment(0.0, m4, 4), Segment(95.0, m3, 3))
    assert m4 > 95.0 and m_hat == pytest.approx(95.0 + (1.0 - 95.0 / m4) * m3)  # linear progress
    assert batch_forecast(o, False) == pytest.approx(m_hat)  # no training step seen: no sync


def test_a_pool_that_empties_mid_batch_never_finishes(decider: Decider) -> None:
    o = _outlook(decider, n=1, reclaims=(Reclaim(1100.0, frozenset({"p0"}), 1),))
    assert o.decision is not None
    assert pool_schedule(o, o.decision, False)[0] == math.inf


def test_a_grown_colocated_pool_runs_the_in_flight_batch_at_its_placed_makespan(decider: Decider,
                                                                              cfg8b: RunConfig) -> None:
    from pearl.core.makespan import sticky_pool

    coloc_only = replace(decider, policy=cfg8b.policy.model_copy(update={"allow_disaggregation": False}))
    o = _outlook(coloc_only, n=2, placement_slack=4.0,
                 expansions=(Expansion(frozenset({"p0", "p1"}), 2, 990.0),))
    d = o.decision
    assert d is not None and d.target == Allocation.colocated(2)
    back = coloc_only.decide(4, o.allocation)
    n_eff = sticky_pool(8.0, 2.0, 4.0, 4.0)
    m_hat, segments = pool_schedule(o, d, False)
    assert segments == (Segment(0.0, d.predicted_makespan_s, 2),
                        Segment(65.0, back.colocated_curve[max(min(round(n_eff), 4), 1) - 1], 4))
    m2, m_placed = segments[0].makespan_s, segments[1].makespan_s
    assert m_hat == pytest.approx(65.0 + (1.0 - 65.0 / m2) * m_placed)
    # a split grows evenly (decode workers are picked by least load): its decided makespan
    split = _outlook(decider, n=2, expansions=(Expansion(frozenset({"p0", "p1"}), 2, 990.0),))
    assert split.decision is not None and split.decision.target.mode is Mode.DISAGGREGATED
    assert pool_schedule(split, split.decision, False)[1][1] == \
        Segment(65.0, decider.decide(4, split.allocation).predicted_makespan_s, 4)


def test_the_regrowth_is_admitted_when_the_batch_is_done_before_the_step_ends(decider: Decider) -> None:
    o = _outlook(decider, lent_workers=2)
    assert regrowth_admitted(o, [(0.0, 50.0)], 200.0, 2, 4)  # progress 1 at 194 s


def test_a_regrowth_the_borrow_gate_would_decline_is_left_out(decider: Decider, cfg8b: RunConfig) -> None:
    gated = replace(decider, policy=cfg8b.policy.model_copy(update={"gate_enabled": True}))
    o = _outlook(gated, lent_workers=2, trainer=TrainerView(100.0, idle_window_s=1.0))  # shorter than d_act
    d = o.decision
    assert d is not None
    schedule = [(0.0, d.predicted_makespan_s), (4.0, gated.fresh_makespan(2))]
    assert not regrowth_admitted(o, schedule, 110.0, 2, 4)
    _m_hat, segments = pool_schedule(o, d, True)
    # the smaller pool keeps the allocation in force (projected) within the hysteresis
    assert segments == (Segment(0.0, d.predicted_makespan_s, 4),
                        Segment(4.0, gated.decide(2, d.target).predicted_makespan_s, 2))
    # with the trainer's window unknown the gate weighs the batch's remaining time and lends again
    open_window = replace(o, trainer=TrainerView(100.0))
    assert regrowth_admitted(open_window, schedule, 110.0, 2, 4)
    assert pool_schedule(open_window, d, True)[1][2].workers == 4


# ---------------------------------------------------------------------------------- weight-sync stall
def test_no_sync_stall_without_a_trainer_a_waiting_batch_or_a_sync_inside_the_batch(decider: Decider) -> None:
    o = _outlook(decider, trainer=TrainerView(100.0, steps_seen=1))
    d = o.decision
    assert d is not None
    seg = (Segment(0.0, d.predicted_makespan_s, 4),)
    assert sync_stall(replace(o, trainer=TrainerView(100.0)), d, True, seg, d.predicted_makespan_s) == 0.0
    assert sync_stall(o, d, False, seg, d.predicted_makespan_s) == 0.0
    assert sync_stall(o, d, True, seg, 100.0) == 0.0  # t_s = T = 100 s >= M_hat
    assert sync_stall(replace(o, trainer=TrainerView(1.0, steps_seen=1)), d, True, seg, d.predicted_makespan_s) > COSTS.weight_sync_s


def test_forecast_is_nan_without_a_decision(decider: Decider) -> None:
    assert math.isnan(batch_forecast(replace(_outlook(decider), decision=None), True))


# ---------------------------------------------------------------------------------- trainer
def test_the_step_estimate_follows_the_observed_spans() -> None:
    t = TrainerView(100.0).started(10.0)
    assert (t.steps_seen, t.running, t.since) == (1, True, 10.0)
    done = t.finished(70.0, 0.5)
    assert done == TrainerView(100.0 + 0.5 * (60.0 - 100.0), steps_seen=1)
    assert TrainerView(100.0).finished(70.0, 0.5) == TrainerView(100.0)  # no start seen: no span
    assert t.finished(10.0, 0.5).step_s == 100.0  # an empty span is not a measurement


# ---------------------------------------------------------------------------------- remaining time
def test_speeds_keep_the_decision_in_force_at_the_batch_start() -> None:
    speeds = [(10.0, 1.0), (20.0, 2.0), (30.0, 3.0), (40.0, 4.0)]
    assert speeds_since(speeds, 35.0) == ((30.0, 3.0), (40.0, 4.0))
    assert speeds_since(speeds, 5.0) == tuple(speeds)
    assert speeds_since([], 5.0) == ()


def test_remaining_time_integrates_progress_over_the_decisions_in_force(decider: Decider) -> None:
    d = decider.decide(4, None)
    o = _outlook(decider, decision=replace(d, predicted_makespan_s=400.0), batch_started_at=1000.0,
                 now=1100.0, speeds=((950.0, 400.0),))
    assert remaining_s(o) == pytest.approx((1 - 100.0 / 400.0) * 400.0)  # one decision: M - elapsed
    grown = replace(o, decision=replace(d, predicted_makespan_s=200.0), now=1150.0,
                    speeds=((950.0, 400.0), (1100.0, 200.0)))
    assert remaining_s(grown) == pytest.approx((1 - 100.0 / 400.0 - 50.0 / 200.0) * 200.0)
    overrun = replace(grown, now=3000.0, remaining_trajectories=3)
    assert remaining_s(overrun) == pytest.approx(3 / 8 * 200.0)
    assert remaining_s(replace(o, decision=None)) == 0.0


# ---------------------------------------------------------------------------------- budget hold
def test_the_budget_holds_until_the_lent_gpus_or_a_reclaim_leave(decider: Decider) -> None:
    d = decider.decide(4, None)
    o = _outlook(decider, decision=replace(d, predicted_makespan_s=400.0), lent_workers=2,
                 batch_started_at=1000.0, now=1100.0, speeds=((1000.0, 400.0),))
    assert hold_s(o, 4, True, 123.0) == COSTS.deactivation_s  # the step starts now: after the return
    assert hold_s(o, 4, False, 200.0) == pytest.approx(300.0 * 200.0 / 400.0)  # R at this budget's speed
    assert hold_s(replace(o, trainer=TrainerView(100.0, 1, running=True, since=1050.0)), 4, False, 200.0) == math.inf  # lent GPUs already gone
    assert hold_s(replace(o, lent_workers=0), 4, False, 200.0) == math.inf
    noticed = replace(o, reclaims=(Reclaim(1060.0, frozenset({"p0"}), 1),))
    assert hold_s(noticed, 4, False, 200.0) == 0.0  # its shrink start (t = 1055) has passed
    assert hold_s(replace(noticed, lent_workers=0, now=1000.0), 4, True, 1.0) == 55.0


def _split_wish(decider: Decider, o: PoolOutlook, faster: float = 1.2):
    d = decider.decide(4, o.allocation)
    co = d.table.candidate(0)
    return replace(d, target=Allocation.disaggregated(2, 2), switched=True, forced=False,
                   predicted_makespan_s=co.makespan_s / faster)


def test_a_switch_the_lent_gpus_would_end_is_held(decider: Decider, cfg8b: RunConfig) -> None:
    policy = cfg8b.policy.model_copy(update={"gate_enabled": True})
    dec = replace(decider, policy=policy)
    coloc = Allocation.colocated(4)
    o = _outlook(dec, allocation=coloc, lent_workers=2)
    wish = _split_wish(dec, o)
    held = hold_switch(o, wish, batch_boundary=True, stalled_fraction=1.0)
    assert held.held and held.projected == coloc and held.gate is not None
    assert held.gate.outcome.value == "window_too_short"
    assert held.decision.target == coloc and held.decision.predicted_makespan_s == wish.table.candidate(0).makespan_s
    assert held.decision.reason.startswith("hold coloc: 2P2D declined by the switch gate")
    # no shrink known: the switch is made, no gate evaluated
    free = hold_switch(replace(o, lent_workers=0), wish, batch_boundary=True, stalled_fraction=1.0)
    assert free.decision is wish and free.gate is None and not free.held
    # a first decision and an explicit schedule pass unchanged
    assert hold_switch(replace(o, allocation=None), wish, True, 1.0).decision is wish
    scheduled = replace(o, decider=replace(dec, policy=policy.model_copy(update={"allocation_overrides": {4: "2P2D"}})))
    assert hold_switch(scheduled, wish, True, 1.0).decision is wish


def test_a_running_steps_overlap_workers_come_back_after_it(decider: Decider) -> None:
    running = TrainerView(100.0, 1, running=True, since=950.0)
    o = _outlook(decider, returning_workers=2, trainer=running)
    assert pool_changes(o, False, 4) == [PoolChange(100.0 - 50.0 + COSTS.activation_s, 2, True)]
    overdue = replace(o, now=1100.0)  # the step is past its expected end: back after d_act
    assert pool_changes(overdue, False, 4) == [PoolChange(COSTS.activation_s, 2, True)]
    assert pool_changes(replace(o, trainer=TrainerView(100.0)), False, 4) == []  # no step runs


def test_a_switch_the_returning_workers_would_reverse_is_held(decider: Decider, cfg8b: RunConfig) -> None:
    """The wish: a split 20 % faster than colocation on the 4 workers of the moment. A running training
    step holds 4 overlap workers that come back when it ends; on 8 workers colocation is the best
    and the split's projection is slower, so weighed over the batch the switch saves nothing."""
    coloc = Allocation.colocated(4)

    def training_since(since: float) -> PoolOutlook:
        return _outlook(decider, allocation=coloc, returning_workers=4,
                        trainer=TrainerView(100.0, 1, running=True, since=since))

    soon = training_since(900.0)  # the step ends now: the workers are back after d_act
    wish = _split_wish(decider, soon)
    got = hold_for_schedule(soon, wish, False)
    kept = replace(wish, target=coloc, predicted_makespan_s=wish.table.candidate(0).makespan_s)
    old_s, new_s = pool_schedule(soon, kept, False)[0], pool_schedule(soon, wish, False)[0]
    assert got.weighed and got.held and (got.old_s, got.new_s) == (old_s, new_s)
    assert got.saving == pytest.approx((old_s - new_s) / old_s) and not got.saving > got.threshold
    assert got.decision.target == coloc and got.decision.predicted_makespan_s == kept.predicted_makespan_s
    assert got.decision.reason.startswith("hold coloc: 2P2D would save only")
    assert got.to_dict()["outcome"] == "saving_below_threshold"
    # the step ends late in the batch: most of it runs on 4 workers and the switch stands
    late = training_since(1000.0)
    stands = hold_for_schedule(late, _split_wish(decider, late), False)
    assert stands.weighed and not stands.held and stands.decision.target == Allocation.disaggregated(2, 2)
    assert stands.saving > stands.threshold and stands.to_dict()["outcome"] == "admitted"
    # not weighed: no pool change known, a forced switch, no allocation in force, the policy's knob off
    assert not hold_for_schedule(replace(soon, returning_workers=0), wish, False).weighed
    forced = replace(wish, forced=True)
    assert hold_for_schedule(soon, forced, False).decision is forced
    assert hold_for_schedule(replace(soon, allocation=None), wish, False).decision is wish
    off = replace(soon, decider=replace(decider, policy=cfg8b.policy.model_copy(update={"weigh_pool_schedule": False})))
    assert hold_for_schedule(off, wish, False).decision is wish


# ---------------------------------------------------------------------------------- overrides
def test_an_allocation_override_replaces_the_decision(decider: Decider, cfg8b: RunConfig) -> None:
    d = decider.decide(4, None)
    policy = cfg8b.policy.model_copy(update={"allocation_overrides": {4: "1P3D"}})
    got = apply_overrides(d, policy, Allocation.colocated(4))
    idx = d.table.index_of(Allocation.disaggregated(1, 3))
    assert idx is not None
    assert got.target == Allocation.disaggregated(1, 3) and got.switched and not got.forced
    assert got.predicted_makespan_s == d.table.candidate(idx).makespan_s
    assert got.reason == "override: allocation_overrides[4] = 1P3D"
    assert apply_overrides(d, cfg8b.policy, None) is d  # nothing to apply
    assert Decider(8, decider.hw, decider.wl, policy).decide(4, None).target == Allocation.disaggregated(1, 3)


def test_forced_disaggregation_takes_the_best_feasible_split(decider: Decider, cfg8b: RunConfig) -> None:
    d = decider.decide(4, None)
    coloc = replace(d, target=Allocation.colocated(4))
    policy = cfg8b.policy.model_copy(update={"force_disaggregation": True})
    got = apply_overrides(coloc, policy, None)
    splits = [c for c in d.candidates if c.allocation.mode is Mode.DISAGGREGATED and c.feasible]
    assert splits  # 1P3D, 2P2D, 3P1D are feasible for 8 trajectories on 4 workers
    best = min(splits, key=lambda c: c.makespan_s)
    assert got.target == best.allocation and got.predicted_makespan_s == best.makespan_s
    assert got.reason == f"forced disaggregation: best feasible split {best.allocation.label}"
    no_split = replace(decider, policy=cfg8b.policy.model_copy(update={"allow_disaggregation": False})).decide(4, None)
    assert apply_overrides(no_split, policy, None) is no_split  # no split to take: colocation stays


def test_the_fresh_makespan_is_the_decision_with_no_allocation_in_force(decider: Decider) -> None:
    assert decider.fresh_makespan(0) == math.inf
    assert decider.fresh_makespan(3) == decider.decide(3, None).predicted_makespan_s
