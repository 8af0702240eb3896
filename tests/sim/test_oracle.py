"""Oracle knowledge: grant lifetimes, short grants declined, reachable budgets."""

from __future__ import annotations

import pytest

from pearl.config import ClusterSpec, PolicySpec
from pearl.core.events import GpusGranted, ReclaimNotice
from pearl.sim.oracle import (
    EXPANSION_S,
    Interval,
    budget_intervals,
    grant_lifetimes,
    oracle_events,
    plan_allocations,
    reachable_budgets,
)
from pearl.sim.traces import Trace, gpu_timeline, trace_events


def test_lifetimes_and_short_grant_declined() -> None:
    tl = gpu_timeline(Trace("x", 60.0, (0, 4, 6, 4, 4, 4)), ClusterSpec())
    ev = trace_events(tl, notice_s=30.0)
    life = grant_lifetimes(ev, end_s=tl.duration_s)
    assert life == {"grant-1": 360.0 - 60.0, "grant-2": 180.0 - 120.0}
    kept = oracle_events(ev, tl.duration_s, expansion_s=76.0)
    assert [type(e.event) for e in kept] == [GpusGranted]  # 60 s grant and its reclaim dropped
    kept2 = oracle_events(ev, tl.duration_s, expansion_s=30.0)
    assert [type(e.event) for e in kept2] == [GpusGranted, GpusGranted, ReclaimNotice]


def test_reachable_budgets() -> None:
    tl = gpu_timeline(Trace("x", 60.0, (0, 4, 12)), ClusterSpec())
    assert reachable_budgets(tl, ClusterSpec()) == [4, 8, 16, 20, 24, 32]
    assert reachable_budgets(None, ClusterSpec(reserved_gpus=8), borrow=False) == [8]


def _iv(spec: list[tuple[float, float, int]]) -> list[Interval]:
    return [Interval(a, b, n, a) for a, b, n in spec]


def test_budget_intervals_follow_taken_grants_and_deadlines() -> None:
    cl = ClusterSpec()  # 4 reserved, tp 1
    tl = gpu_timeline(Trace("x", 600.0, (0, 4, 4, 0)), cl)
    ev = oracle_events(trace_events(tl, notice_s=120.0), tl.duration_s)
    ivs = budget_intervals(ev, cl, tl.duration_s, expansion_s=76.0)
    assert [(iv.start_s, iv.end_s, iv.n_workers) for iv in ivs] == [(0.0, 676.0, 4), (676.0, 1800.0, 8),
                                                                     (1800.0, 2400.0, 4)]
    assert ivs[1].event_s == 600.0 and ivs[2].event_s == 1680.0  # the grant / the reclaim notice


def test_plan_switches_only_when_the_interval_pays_for_it() -> None:
    pol = PolicySpec()
    rates = {4: {"coloc": 1.0, "2P2D": 0.9}, 8: {"coloc": 1.0, "3P5D": 1.2}}
    # a long 8-worker interval: worth switching to the split (gain 0.2/s x 1000 s > 10 s x 1.2/s)
    p = plan_allocations(_iv([(0, 100, 4), (100, 1100, 8), (1100, 1200, 4)]), rates, {4: 10.0, 8: 10.0}, pol)
    assert p.labels == ("coloc", "3P5D", "coloc") and p.switches == 2
    assert p.schedule[1] == (100, {4: "coloc", 8: "3P5D"}) and p.schedule[2] == (1100, {8: "3P5D", 4: "coloc"})
    # a short one is not: 0.2/s x 50 s < the two switches' cost
    q = plan_allocations(_iv([(0, 100, 4), (100, 150, 8), (150, 250, 4)]), rates, {4: 10.0, 8: 10.0}, pol)
    assert q.labels == ("coloc", "coloc", "coloc") and q.switches == 0
    assert abs(q.value - (100 + 50 + 100)) < 1e-9


def test_plan_keeps_a_projected_split_for_free_and_fills_borrowed_budgets() -> None:
    pol = PolicySpec()
    rates = {4: {"coloc": 1.0, "2P2D": 1.1}, 8: {"coloc": 1.0, "4P4D": 1.3}, 20: {"coloc": 2.0, "10P10D": 2.1},
             24: {"coloc": 2.0, "12P12D": 2.5}}
    p = plan_allocations(_iv([(0, 500, 4), (500, 1000, 8)]), rates, {n: 10.0 for n in rates}, pol,
                         borrow_workers=16, borrow_window_s=160.0)
    assert p.labels == ("2P2D", "4P4D") and p.switches == 0  # 2P2D -> 4P4D is the runtime's projection
    assert p.schedule[0][1] == {4: "2P2D", 20: "10P10D"} and p.schedule[1][1][24] == "12P12D"


def test_plan_needs_a_rate_for_every_budget() -> None:
    with pytest.raises(ValueError, match="12 workers"):
        plan_allocations(_iv([(0, 10, 12)]), {4: {"coloc": 1.0}}, {}, PolicySpec())


def test_a_segment_that_starts_with_spot_gpus_still_starts_on_the_reserved_pool() -> None:
    """The grant at t = 0 serves only after its expansion: the plan needs the reserved-only budget,
    which the trace's levels alone (``reachable_budgets``) do not list (oracle_plan adds it)."""
    cl = ClusterSpec()
    tl = gpu_timeline(Trace("x", 600.0, (4, 4)), cl)
    ivs = budget_intervals(oracle_events(trace_events(tl), tl.duration_s), cl, tl.duration_s)
    assert [iv.n_workers for iv in ivs] == [4, 8] and ivs[1].start_s == EXPANSION_S
    assert 4 not in reachable_budgets(tl, cl)


def test_oracle_bound_takes_the_best_schedule_on_the_trace() -> None:
    from pearl.sim.simulate import oracle_bound

    plan = {"intervals": [], "planned_switches": 0, "planned_trajectories": 10.0}
    runs = {
        "oracle": {"trajectories_per_hour": 600.0, "oracle_plan": plan},
        "pearl": {"trajectories_per_hour": 610.0, "gates": {"borrow": {}}},
        "rlboost+": {"trajectories_per_hour": 605.0},
        "roll-large": {"trajectories_per_hour": 900.0},  # a fixed pool sized off the trace
    }
    out = oracle_bound("oracle", runs, {"roll-large"})
    assert out["trajectories_per_hour"] == 610.0 and out["gates"] == {"borrow": {}}
    assert out["oracle_plan"] == {**plan, "plan_trajectories_per_hour": 600.0, "source": "pearl"}
    runs["oracle"]["trajectories_per_hour"] = 620.0
    out = oracle_bound("oracle", runs, {"roll-large"})
    assert out["trajectories_per_hour"] == 620.0 and out["oracle_plan"]["source"] == "plan"
