"""Cost-aware conversation affinity (pearl/core/affinity.py): the move rule's closed form and
the direction of each of its terms."""

from __future__ import annotations

import math

import pytest

from pearl.config import load_config
from pearl.core.affinity import TurnCost, effective_slack, move_gain_s, turn_cost, typical_turn
from pearl.core.profile import HardwareProfile, WorkloadProfile


@pytest.fixture(scope="module")
def dense() -> HardwareProfile:
    cfg = load_config("qwen3-8b-h200")
    return HardwareProfile.from_specs(cfg.model, cfg.hardware)


@pytest.fixture(scope="module")
def moe() -> HardwareProfile:
    cfg = load_config("qwen3-30b-a3b-h200")
    return HardwareProfile.from_specs(cfg.model, cfg.hardware)


def test_dense_gain_matches_the_closed_form(dense: HardwareProfile) -> None:
    """G = o (n_p - n_b) b2 (L + o/2) - [P(L, 0) - P(L - c, c)] for a dense model (memory-bound decode)."""
    t = TurnCost(context=20_000, cached=14_000, output=600)
    for n_p, n_b in [(3, 1), (6, 2), (9, 0)]:
        mid = t.context + t.output / 2
        want = t.output * (n_p - n_b) * dense.b2 * mid - (
            dense.prefill_s(t.context, 0) - dense.prefill_s(t.context - t.cached, t.cached))
        assert math.isclose(move_gain_s(dense, t, n_p, n_b), want, rel_tol=1e-9, abs_tol=1e-12)


def test_nothing_cached_any_load_gap_moves(dense: HardwareProfile, moe: HardwareProfile) -> None:
    t = TurnCost(context=8_000, cached=0, output=300)
    for hw in (dense, moe):
        assert move_gain_s(hw, t, 2, 1) > 0
        assert move_gain_s(hw, t, 1, 1) == pytest.approx(0.0, abs=1e-12)  # no gap: nothing to gain


def test_a_cached_prefix_holds_a_turn_across_a_small_gap_not_a_large_one(dense: HardwareProfile) -> None:
    """A long cached context and a short answer: one more neighbour costs less than prefilling the
    whole conversation again; a large load gap on a long answer pays for it."""
    short = TurnCost(context=30_000, cached=29_000, output=50)
    assert move_gain_s(dense, short, 2, 1) < 0
    long = TurnCost(context=30_000, cached=29_000, output=2_000)
    assert move_gain_s(dense, long, 12, 0) > 0
    # the gain grows with the load gap and shrinks with the cached share
    gains = [move_gain_s(dense, long, n, 0) for n in range(1, 8)]
    assert gains == sorted(gains)
    less_cached = TurnCost(context=30_000, cached=10_000, output=2_000)
    assert move_gain_s(dense, less_cached, 3, 1) > move_gain_s(dense, long, 3, 1)


def test_turn_cost_takes_the_profiles_cached_share_and_output() -> None:
    wp = WorkloadProfile(survival=(1.0, 0.8, 0.5), new_tokens=(2000.0, 500.0, 400.0),
                         cached_tokens=(0.0, 1500.0, 3600.0), output_tokens=(300.0, 250.0, 200.0),
                         env_s=(1.0, 1.0, 1.0), k_seq=5000.0)
    assert turn_cost(wp, 1, 2000) == TurnCost(2000.0, 0.0, 300.0)
    assert turn_cost(wp, 2, 4000) == TurnCost(4000.0, 3000.0, 250.0)
    assert turn_cost(wp, 9, 1000) == TurnCost(1000.0, 900.0, 200.0)  # beyond the profile: its last turn
    assert turn_cost(wp, 0, -5).context == 0.0


def test_effective_slack_counts_the_gaps_the_rule_tolerates(dense: HardwareProfile) -> None:
    assert effective_slack(dense, TurnCost(8_000, 0, 300), 4) == 0  # nothing cached: any gap moves
    held = TurnCost(30_000, 29_000, 50)
    s = effective_slack(dense, held, 64)
    assert 0 < s < 64
    assert move_gain_s(dense, held, s, 0) <= 0 < move_gain_s(dense, held, s + 1, 0)
    assert effective_slack(dense, held, 2) == min(s, 2)


def test_typical_turn_is_the_middle_turn_at_its_mean_context() -> None:
    wp = WorkloadProfile(survival=(1.0, 1.0, 1.0, 0.5), new_tokens=(2000.0, 500.0, 400.0, 400.0),
                         cached_tokens=(0.0, 1500.0, 3600.0, 4000.0), output_tokens=(300.0, 250.0, 200.0, 100.0),
                         env_s=(1.0, 1.0, 1.0, 1.0), k_seq=5000.0)
    assert typical_turn(wp) == turn_cost(wp, 2, 2000)  # mean turns 3.5 -> turn 2
