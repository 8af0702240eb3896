"""The one-pass evaluation of a budget's splits (``disaggregated.disaggregated_makespan``) against
the term-by-term reference (``makespan_reference``): the same predictions (relative 1e-9) and the
same feasibility over many budgets, batches and fitted profiles, and the same decisions."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from pearl.config import RunConfig
from pearl.core.decision import Allocation, decide, evaluate_table
from pearl.core.disaggregated import _memory_bound, disaggregated_makespan
from pearl.core.makespan_reference import reference_disaggregated_makespan, reference_table
from pearl.core.profile import HardwareProfile, TelemetryRecord, WorkloadProfile, fit_hardware, fit_workload

Prof = tuple[HardwareProfile, WorkloadProfile]


def _window(seed: int, n_traj: int = 48, workers: int = 6) -> list[TelemetryRecord]:
    """One colocated rollout step of synthetic trajectories: varied turn counts and lengths, every
    trajectory seen whole (so the fit measures a tail factor and keeps slowest paths)."""
    rnd = random.Random(seed)
    recs: list[TelemetryRecord] = []
    for t in range(n_traj):
        turns = rnd.randint(1, 14)
        ctx = 0
        for k in range(1, turns + 1):
            obs = rnd.randint(100, 1500)
            prompt = ctx + obs + (1500 if k == 1 else 0)
            cached = 0 if k == 1 else int(ctx * rnd.uniform(0.6, 1.0))
            out = rnd.randint(40, 900)
            n = float(rnd.randint(1, 8))
            recs.append(TelemetryRecord(
                f"s{seed}t{t}", k, prompt, cached, out, prefill_s=2e-4 * (prompt - cached) + 0.01,
                decode_s=out * (0.009 + 2e-8 * n * (prompt + out / 2)) * rnd.uniform(0.9, 1.2),
                env_s=rnd.uniform(0.5, 30.0), decode_concurrency=n, worker_id=f"w{t % workers}",
                final=k == turns))
            ctx = prompt + out
    return recs


def _fitted(prof: Prof, windows: int) -> Prof:
    hw, wl = prof
    for s in range(windows):
        recs = _window(s)
        hw, wl = fit_hardware(hw, recs), fit_workload(wl, recs)
    return hw, wl


@pytest.fixture(scope="module")
def profiles(prof8b: Prof, prof30b: Prof) -> list[Prof]:
    compute_bound = replace(prof30b[0], b1=prof30b[0].b1 * 400.0)  # the roofline's compute branch binds
    fitted = [_fitted(prof8b, 1), _fitted(prof8b, 4), _fitted(prof30b, 3)]
    # the fitted workloads on the data-sheet decode step: memory-bound, with slowest paths
    return [prof8b, prof30b, *fitted, (prof30b[0], fitted[2][1]), (prof8b[0], fitted[1][1]),
            (compute_bound, fitted[2][1])]


def test_the_profiles_exercise_both_decode_branches_and_the_slowest_paths(profiles: list[Prof]) -> None:
    bound = [_memory_bound(hw, wl, 64) for hw, wl in profiles]
    assert bound[:2] == [True, True] and bound[-1] is False
    assert {b for b, (_hw, wl) in zip(bound, profiles, strict=True) if wl.tail_paths} == {True, False}
    assert all(wl.tail_paths for _hw, wl in profiles[2:])
    assert len(profiles[3][1].tail_history) == 3  # four windows kept


@pytest.mark.parametrize("batch", [1, 7, 32, 64, 96])
def test_one_pass_equals_the_reference_over_many_budgets(profiles: list[Prof], batch: int) -> None:
    budgets = [*range(2, 41), 63, 64, 65, 97, 130, 300]
    for hw, wl in profiles:
        for n in budgets:
            n_p = np.arange(1, n, dtype=np.float64)
            new = disaggregated_makespan(hw, wl, batch, n_p, n - n_p, 0.9)
            ref = reference_disaggregated_makespan(hw, wl, batch, n_p, n - n_p, 0.9)
            np.testing.assert_allclose(new.makespan_s, ref.makespan_s, rtol=1e-9, atol=0.0)
            np.testing.assert_allclose(new.prefill_util, ref.prefill_util, rtol=1e-9, atol=0.0)
            for a, b in ((new.prefill_ok, ref.prefill_ok), (new.kv_ok, ref.kv_ok), (new.cache_ok, ref.cache_ok)):
                assert (a == b).all()
            assert new.cache_demand == ref.cache_demand


def test_pools_past_the_batch_are_evaluated_once_and_agree(profiles: list[Prof]) -> None:
    """At 300 workers and a batch of 32 every split with both pools >= 32 has the same state, and
    the one-pass makespan equals the reference's there too (W_start = 0, no queue)."""
    hw, wl = profiles[3]
    n_p = np.arange(1, 300, dtype=np.float64)
    new = disaggregated_makespan(hw, wl, 32, n_p, 300 - n_p, 0.9).makespan_s
    both_big = (n_p >= 32) & (300 - n_p >= 32)
    assert np.unique(new[both_big]).size == 1
    ref = reference_disaggregated_makespan(hw, wl, 32, n_p, 300 - n_p, 0.9).makespan_s
    np.testing.assert_allclose(new, ref, rtol=1e-9, atol=0.0)


@pytest.mark.parametrize("n", [1, 2, 8, 12, 28, 36, 150])
def test_decisions_are_the_same_on_both_evaluations(profiles: list[Prof], cfg8b: RunConfig, n: int) -> None:
    for hw, wl in profiles:
        for current in (None, Allocation.colocated(n), Allocation.disaggregated(1, 1)):
            a = decide(n, 64, hw, wl, cfg8b.policy, current)
            b = decide(n, 64, hw, wl, cfg8b.policy, current, evaluator=reference_table)
            assert (a.target, a.switched, a.forced) == (b.target, b.switched, b.forced)
            assert a.predicted_makespan_s == pytest.approx(b.predicted_makespan_s, rel=1e-9)
            ta = evaluate_table(n, 64, hw, wl, cfg8b.policy)
            tb = reference_table(n, 64, hw, wl, cfg8b.policy)
            assert ta.coloc_s == tb.coloc_s and (ta.feasible == tb.feasible).all()
