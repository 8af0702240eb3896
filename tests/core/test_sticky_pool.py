"""An in-flight batch after a mid-batch pool change (sticky placement under the router's affinity
slack; formula in pearl/core/makespan.py, ``sticky_pool``)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pearl.config import PolicySpec
from pearl.core.colocated import colocated_makespan
from pearl.core.decision import decide
from pearl.core.makespan import batch_progress, compose_makespan, sticky_pool
from pearl.core.profile import HardwareProfile, WorkloadProfile

Prof = tuple[HardwareProfile, WorkloadProfile]


def test_growth_fills_new_workers_only_up_to_the_slack() -> None:
    # 64 trajectories on 4 workers, pool grown to 20, slack 4: old workers keep 3.2 + 4 * 16/20 = 6.4
    assert sticky_pool(64, 4, 20, 4) == pytest.approx(64 / 6.4)
    # 16 placed workers (4 each) grown to 32: 2 + 4 * 16/32 = 4 = what they hold -> nothing moves
    assert sticky_pool(64, 16, 32, 4) == pytest.approx(16.0)
    # no slack: the new pool is used evenly; a huge slack: nothing moves
    assert sticky_pool(64, 4, 20, 0) == pytest.approx(20.0)
    assert sticky_pool(64, 4, 20, 1000) == pytest.approx(4.0)


def test_a_shrink_rebalances_over_the_survivors() -> None:
    assert sticky_pool(64, 20, 4, 4) == 4.0
    assert sticky_pool(64, 8, 8, 4) == 8.0
    assert sticky_pool(0, 4, 20, 4) == 20.0


def test_the_decision_carries_the_colocated_curve(prof8b: Prof) -> None:
    hw, wl = prof8b
    d = decide(20, 64, hw, wl, PolicySpec())
    curve = d.colocated_curve
    assert len(curve) == 20 and d.to_dict()["colocated_by_workers"] == list(curve)
    direct = colocated_makespan(hw, wl, 64, np.array([10.0, 20.0]))
    # equal up to the fixed point's stopping rule (1e-4 relative, ``stages.converged``): the
    # iteration stops when every candidate evaluated together has converged
    assert curve[9] == pytest.approx(direct[0], rel=2e-4) and curve[19] == pytest.approx(direct[1], rel=2e-4)
    assert all(a >= b for a, b in itertools.pairwise(curve))  # more workers never hurt


def test_compose_makespan_runs_each_allocation_at_its_rate() -> None:
    assert compose_makespan([(0.0, 400.0)]) == 400.0
    # 100 s of a 400-s allocation (1/4), then a 200-s one: 3/4 x 200 = 150 s more
    assert compose_makespan([(0.0, 400.0), (100.0, 200.0)]) == pytest.approx(250.0)
    # progress reaches 1 before a later change: the change does not matter
    assert compose_makespan([(0.0, 100.0), (150.0, 1.0)]) == pytest.approx(100.0)
    with pytest.raises(ValueError, match="empty schedule"):
        compose_makespan([])
    with pytest.raises(ValueError, match="need M > 0"):
        compose_makespan([(0.0, 0.0), (10.0, 5.0)])


def test_decide_predicts_colocation_on_the_placed_pool(prof8b: Prof) -> None:
    hw, wl = prof8b
    pol = PolicySpec()
    fresh = decide(20, 64, hw, wl, pol)
    placed = decide(20, 64, hw, wl, pol, coloc_workers=sticky_pool(64, 4, 20, 4))
    curve = fresh.colocated_curve
    assert fresh.table.coloc_s == pytest.approx(curve[19], rel=1e-3)
    assert placed.table.coloc_s == pytest.approx(curve[9], rel=1e-3)  # n_eff = 10 (the fixed point stops per call)
    # the splits keep their fresh-batch predictions
    assert np.array_equal(placed.table.makespan_s, fresh.table.makespan_s)
    assert decide(20, 64, hw, wl, pol, coloc_workers=None).table.coloc_s == fresh.table.coloc_s


def test_batch_progress_is_the_inverse_of_compose_makespan() -> None:
    sched = [(0.0, 400.0), (100.0, 200.0)]
    assert batch_progress(sched, 50.0) == 50.0 / 400.0
    assert batch_progress(sched, 150.0) == 100.0 / 400.0 + 50.0 / 200.0
    assert batch_progress(sched, compose_makespan(sched)) == 1.0  # done exactly at the composed makespan
    assert batch_progress([(0.0, float("nan")), (10.0, 100.0)], 60.0) == 0.5  # no decision: no progress
    assert batch_progress(sched, 0.0) == 0.0
