from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pearl.config import PolicySpec, RunConfig
from pearl.core.colocated import colocated_makespan
from pearl.core.decision import Allocation, DecisionError, Mode, decide, evaluate, mode_change_s, project
from pearl.core.disaggregated import disaggregated_makespan
from pearl.core.profile import HardwareProfile, WorkloadProfile
from pearl.core.stages import stages

Prof = tuple[HardwareProfile, WorkloadProfile]


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 24), st.sampled_from([16, 32, 64, 128]))
def test_more_workers_never_hurt(prof30b: Prof, n: int, batch: int) -> None:
    """Backs the decision engine's choice to enumerate only N_P + N_D = N."""
    hw, wl = prof30b
    co = colocated_makespan(hw, wl, batch, np.array([n, n + 1], dtype=float))
    assert co[1] <= co[0] * (1 + 1e-9)
    n_p = np.arange(1, n, dtype=float)
    base = disaggregated_makespan(hw, wl, batch, n_p, n - n_p, 0.95).makespan_s
    more_p = disaggregated_makespan(hw, wl, batch, n_p + 1, n - n_p, 0.95).makespan_s
    more_d = disaggregated_makespan(hw, wl, batch, n_p, n - n_p + 1, 0.95).makespan_s
    assert np.all(more_p <= base * (1 + 1e-6)) and np.all(more_d <= base * (1 + 1e-6))


def test_environment_time_and_batch_raise_makespan(prof8b: Prof) -> None:
    hw, wl = prof8b
    slow_env = replace(wl, env_s=tuple(e * 3 for e in wl.env_s))
    a = colocated_makespan(hw, wl, 64, np.array([8.0]))[0]
    b = colocated_makespan(hw, slow_env, 64, np.array([8.0]))[0]
    c = colocated_makespan(hw, wl, 128, np.array([8.0]))[0]
    assert b > a and c > a


def test_kv_constraint_marks_splits_infeasible(prof8b: Prof) -> None:
    hw, wl = prof8b
    batch = 256
    cands = {c.allocation.label: c for c in evaluate(8, batch, hw, wl, PolicySpec())}
    assert len(cands) == 8  # coloc + 1P7D..7P1D
    assert cands["coloc"].feasible  # colocation only queues when KV overflows
    for n_d in range(1, 8):
        c = cands[f"{8 - n_d}P{n_d}D"]
        kv_ok = batch * wl.k_seq <= n_d * hw.kv_capacity_tokens
        assert ("KV memory" in c.reason) == (not kv_ok)
    assert not cands["4P4D"].feasible


def test_prefill_capacity_is_checked_over_the_batch(prof8b: Prof) -> None:
    """A split is prefill-feasible iff the batch's prefill work over the time its turns take at the
    decode side's pace, u_batch, is within u_max (a stage may run over: its backlog drains later)."""
    hw, wl = prof8b
    n_p = np.arange(1, 8, dtype=float)
    for batch in (64, 256):
        res = disaggregated_makespan(hw, wl, batch, n_p, 8 - n_p, 0.95)
        assert np.array_equal(res.prefill_ok, res.prefill_util <= 0.95)
    big = disaggregated_makespan(hw, wl, 256, n_p, 8 - n_p, 0.95)
    assert not big.prefill_ok[0] and big.prefill_ok[-1]  # 1P7D cannot keep up at B = 256, 7P1D can
    # at B = 64, 1P7D cannot keep up; 3P5D keeps up over the batch with little to spare
    small = disaggregated_makespan(hw, wl, 64, n_p, 8 - n_p, 0.95)
    assert not small.prefill_ok[0] and small.prefill_ok[2] and 0.75 < small.prefill_util[2] <= 0.95
    assert np.all(np.diff(small.prefill_util) < 0)  # more prefill workers, less utilised


def test_a_prefill_pool_must_hold_every_running_conversations_prefix(prof8b: Prof) -> None:
    """``max_s B_s (x_s + c_s) <= N_P H_max``; past it the prefill workers' caches evict
    prefixes about to be reused, and the re-prefills can collapse the pool (measured: 1P3D on 4
    workers). The bound names itself in the reason; a pool that holds them all is unaffected."""
    hw, wl = prof8b
    s = stages(wl, Mode.DISAGGREGATED)
    n_p = np.arange(1, 8, dtype=float)
    for batch in (32, 64, 128):
        res = disaggregated_makespan(hw, wl, batch, n_p, 8 - n_p, 0.95)
        demand = float((batch * s.alive * (s.x + s.c)).max())
        assert res.cache_demand == pytest.approx(demand)
        assert np.array_equal(res.cache_ok, demand <= n_p * hw.kv_capacity_tokens)
    # a small cache: one prefill worker cannot hold the batch's prefixes, more can
    small = replace(hw, kv_capacity_tokens=0.6 * float((64 * s.alive * (s.x + s.c)).max()))
    cands = {c.allocation.label: c for c in evaluate(8, 64, small, wl, PolicySpec(max_prefill_utilization=1.0))}
    assert not cands["1P7D"].feasible and "prefix cache" in cands["1P7D"].reason
    assert "prefix cache" not in cands["2P6D"].reason
    assert decide(8, 64, small, wl, PolicySpec(max_prefill_utilization=1.0)).target.label != "1P7D"


def test_sec33_trend_ratio_moves_toward_prefill(prof8b: Prof) -> None:
    hw, wl = prof8b
    pol = PolicySpec()
    small = min((c for c in evaluate(8, 16, hw, wl, pol)[1:] if c.feasible), key=lambda c: c.makespan_s)
    large = min((c for c in evaluate(8, 64, hw, wl, pol)[1:] if c.feasible), key=lambda c: c.makespan_s)
    assert large.allocation.n_prefill >= small.allocation.n_prefill


def test_initial_decision_takes_the_minimum(prof8b: Prof) -> None:
    hw, wl = prof8b
    d = decide(8, 64, hw, wl, PolicySpec())
    feasible = [c for c in d.candidates if c.feasible]
    assert d.predicted_makespan_s == min(c.makespan_s for c in feasible)
    assert d.switched and not d.forced and d.reason.startswith("initial")
    assert d.to_dict()["candidates"][0]["label"] == "coloc"


def test_hysteresis_is_mode_dependent(prof8b: Prof) -> None:
    hw, wl = prof8b
    cands = {c.allocation.label: c for c in evaluate(8, 64, hw, wl, PolicySpec())}
    best = min((c for c in cands.values() if c.feasible), key=lambda c: c.makespan_s)
    assert best.allocation.mode is Mode.DISAGGREGATED
    saving = 1 - best.makespan_s / cands["coloc"].makespan_s
    # the mode change's own cost as a share of the current makespan: T_mode = t_role + (B/N) P(K_seq/2, 0)
    t_mode = 1.0 + 64 / 8 * hw.prefill_s(wl.k_seq / 2, 0)
    assert mode_change_s(8, 64, hw, wl, 1.0) == pytest.approx(t_mode, rel=1e-12)
    charge = t_mode / cands["coloc"].makespan_s
    assert 0.01 < charge < saving
    # a mode threshold just above the saving less that charge holds colocation; just below switches
    hold = decide(8, 64, hw, wl, PolicySpec(mode_switch_threshold=saving - charge + 0.001, ratio_switch_threshold=0.0),
                  Allocation.colocated(8))
    assert hold.target.label == "coloc" and not hold.switched and "hold" in hold.reason
    assert f"+ switch cost {charge:.1%}" in hold.reason
    go = decide(8, 64, hw, wl, PolicySpec(mode_switch_threshold=saving - charge - 0.001, ratio_switch_threshold=0.0),
                Allocation.colocated(8))
    assert go.target == best.allocation and go.switched and "switch mode" in go.reason
    # a slower role switch raises the charge: the same threshold holds again
    slow = decide(8, 64, hw, wl, PolicySpec(mode_switch_threshold=saving - charge - 0.001, ratio_switch_threshold=0.0,
                                            role_switch_s=1.0 + 0.002 * cands["coloc"].makespan_s),
                  Allocation.colocated(8))
    assert slow.target.label == "coloc" and not slow.switched
    # a ratio change uses the smaller ratio threshold
    other = [c for c in cands.values() if c.feasible and c.allocation.mode is Mode.DISAGGREGATED
             and c.allocation != best.allocation]
    near = min(other, key=lambda c: c.makespan_s)
    r_saving = 1 - best.makespan_s / near.makespan_s
    pol = PolicySpec(mode_switch_threshold=0.5, ratio_switch_threshold=max(r_saving - 0.001, 0.0))
    moved = decide(8, 64, hw, wl, pol, near.allocation)
    assert moved.target == best.allocation and "switch ratio" in moved.reason


def test_forced_switch_when_current_becomes_infeasible(prof8b: Prof) -> None:
    hw, wl = prof8b
    pol = PolicySpec(mode_switch_threshold=0.9, ratio_switch_threshold=0.9)
    table = decide(8, 96, hw, wl, pol).candidates
    bad = [c.allocation for c in table if not c.feasible]
    assert bad, "expected an infeasible split at batch 96 on 8 workers (too little prefill or KV)"
    d = decide(8, 96, hw, wl, pol, bad[0])
    assert d.forced and d.target != bad[0] and "infeasible" in d.reason
    assert any(c.allocation == d.target and c.feasible for c in table)


def test_budget_change_projects_the_current_ratio() -> None:
    pol = PolicySpec()
    assert project(Allocation.disaggregated(4, 4), 12, pol) == Allocation.disaggregated(6, 6)
    assert project(Allocation.disaggregated(1, 3), 2, pol) == Allocation.disaggregated(1, 1)
    assert project(Allocation.disaggregated(1, 1), 1, pol) == Allocation.colocated(1)
    assert project(Allocation.colocated(4), 9, pol) == Allocation.colocated(9)


def test_bad_budgets_and_allocations_are_clear_errors(prof8b: Prof) -> None:
    hw, wl = prof8b
    with pytest.raises(DecisionError, match="at least 1 rollout worker"):
        decide(0, 64, hw, wl, PolicySpec())
    with pytest.raises(DecisionError, match="at least 1 trajectory"):
        decide(4, 0, hw, wl, PolicySpec())
    with pytest.raises(DecisionError, match="cannot parse allocation"):
        Allocation.parse("three", 4)
    with pytest.raises(DecisionError, match=">= 1 prefill and >= 1 decode"):
        Allocation.parse("0:4", 4)
    assert Allocation.parse("4P4D", 8) == Allocation.parse("4:4", 8) == Allocation.disaggregated(4, 4)


def test_one_worker_and_disaggregation_off(prof8b: Prof) -> None:
    hw, wl = prof8b
    d = decide(1, 8, hw, wl, PolicySpec())
    assert d.target == Allocation.colocated(1) and len(d.candidates) == 1
    d2 = decide(8, 64, hw, wl, PolicySpec(allow_disaggregation=False))
    assert d2.target == Allocation.colocated(8) and len(d2.candidates) == 1


def test_large_budget_is_handled(cfg30b: RunConfig, prof30b: Prof) -> None:
    hw, wl = prof30b
    d = decide(2048, 64, hw, wl, cfg30b.policy)
    assert len(d.candidates) == 2048 and d.target.n_workers == 2048


def test_splits_are_predicted_on_the_prefill_pools_cache(cfg8b: RunConfig,
                                                         prof8b: tuple[HardwareProfile, WorkloadProfile]) -> None:
    """A prefill worker does not hold the outputs its conversations decoded elsewhere
    (``workload.prefill_pool_tokens``): every split is predicted on that view, colocation on the
    colocated view. With a high hit ratio the pool's view prefills more than the colocated basis."""
    hw, wl = prof8b
    hi = replace(wl, new_tokens=tuple(x + c - 0.95 * (x + c) * (i > 0) for i, (x, c) in
                                      enumerate(zip(wl.new_tokens, wl.cached_tokens, strict=True))),
                 cached_tokens=tuple(0.95 * (x + c) * (i > 0) for i, (x, c) in
                                     enumerate(zip(wl.new_tokens, wl.cached_tokens, strict=True))))
    pol = cfg8b.policy
    cands = evaluate(8, 64, hw, hi, pol)
    splits = [c for c in cands if c.allocation.mode is Mode.DISAGGREGATED]
    n_p = np.array([c.allocation.n_prefill for c in splits], dtype=np.float64)
    want = disaggregated_makespan(hw, hi, 64, n_p, 8 - n_p, pol.max_prefill_utilization)
    assert [c.makespan_s for c in splits] == [float(v) for v in want.makespan_s]
    # the pool's view prefills more than the colocated basis (it recomputes the previous output)
    pool, co = stages(hi, Mode.DISAGGREGATED), stages(hi, Mode.COLOCATED)
    assert (pool.x >= co.x).all() and (pool.x[0, 1:] > co.x[0, 1:]).all()
    assert (pool.x + pool.c == pytest.approx(co.x + co.c))
    coloc = next(c for c in cands if c.allocation.mode is Mode.COLOCATED)
    assert coloc.makespan_s == float(colocated_makespan(hw, hi, 64, np.array([8.0]))[0])


def test_colocated_decode_sees_the_size_biased_batch() -> None:
    """A decoding trajectory shares its iteration with itself and each of the other m - 1
    trajectories of its worker that decode at that moment (probability n / m), so tau is charged
    at n_s = 1 + (m - 1) n / m, not at the time-average n (colocated.py). One turn,
    no prefill, decode cost d1 per sequence in the batch, env e: C = d1 n_s + e, n = m d1 n_s / C."""
    hw = HardwareProfile(a0=0.0, a1=0.0, a2=0.0, b0=0.0, b_e=0.0, b1=0.0, b2=1e-5, g0=0.0, g1=0.0,
                         experts_frac=0.0, kv_capacity_tokens=1e12)
    wl = WorkloadProfile(survival=(1.0,), new_tokens=(1000.0,), cached_tokens=(0.0,), output_tokens=(1000.0,),
                         env_s=(60.0,), k_seq=2000.0)
    d1, e = 1000 * 1e-5 * 1500.0, 60.0  # o b2 L with L = x + o / 2

    def by_hand(m: float, size_biased: bool) -> float:
        n = m
        for _ in range(500):
            ns = 1.0 + (m - 1.0) * n / m if size_biased else n
            c = d1 * ns + e
            n = min(max(m * d1 * ns / c, 1.0), m)
        return c

    for n_workers, m in ((64, 1.0), (8, 8.0), (4, 16.0)):
        got = float(colocated_makespan(hw, wl, 64, np.array([float(n_workers)]))[0])
        assert got == pytest.approx(by_hand(m, True), rel=1e-5)  # solved to stages.TOLERANCE
        if m > 1:  # the time-average batch would be visibly faster
            assert by_hand(m, False) < 0.99 * got
