from __future__ import annotations

import math

import pytest

from pearl.config import PolicySpec
from pearl.core.gate import CostKind, CostModel, GateOutcome, borrow_gate, expansion_gate, switch_gate


def test_cost_ema_and_bad_observations() -> None:
    c = CostModel(activation_s=6.0, alpha=0.5)
    c2 = c.observe(CostKind.ACTIVATION, 10.0)
    assert c2.activation_s == 8.0 and c2.observations == 1
    assert c2.observe("activation", math.nan) is c2
    assert c2.observe("activation", -1.0) is c2
    assert c2.observe("deactivation", 4.8).deactivation_s == pytest.approx(3.8 + 0.5)
    with pytest.raises(ValueError):
        c.observe("bogus", 1.0)


def test_borrow_gate_arithmetic() -> None:
    pol = PolicySpec(gate_margin=1.0)
    costs = CostModel(activation_s=6.0, deactivation_s=4.0)
    # r = 2, batch-bound: useful = min(164 - 6, (100 - 6) / 2) = 47; saving = 47 * 1 > return 4
    d = borrow_gate(200.0, 100.0, 164.0, 100.0, costs, pol)
    assert d.admit and d.useful_s == 47.0 and d.saving_s == 47.0 and d.cost_s == 4.0
    assert d.outcome is GateOutcome.ADMITTED
    # r = 1.05, window-bound: useful = min(158, 994 / 1.05) = 158; saving = 7.9 > 4 -> admitted
    d2 = borrow_gate(105.0, 100.0, 164.0, 1000.0, costs, pol)
    assert d2.admit and d2.useful_s == 158.0 and d2.saving_s == pytest.approx(7.9)
    # r = 1.02: saving = 158 * 0.02 = 3.16 < 4 -> refused
    d5 = borrow_gate(102.0, 100.0, 164.0, 1000.0, costs, pol)
    assert not d5.admit and d5.outcome is GateOutcome.SAVING_BELOW_COST
    # a window shorter than the activation
    d3 = borrow_gate(200.0, 100.0, 5.0, 1000.0, costs, pol)
    assert not d3.admit and "too short" in d3.reason and d3.outcome is GateOutcome.WINDOW_TOO_SHORT
    # a batch that ends before the activation does (whatever the window; a negative remaining reads 0)
    for remaining in (5.0, -3.0):
        d4 = borrow_gate(200.0, 100.0, 164.0, remaining, costs, pol)
        assert not d4.admit and d4.outcome is GateOutcome.BATCH_ENDS_FIRST and "-" not in d4.reason.split("left")[0]
    # ungated: admits whenever there is a speedup
    ung = borrow_gate(105.0, 100.0, 164.0, 1000.0, costs, PolicySpec(gate_enabled=False))
    assert ung.admit and ung.outcome is GateOutcome.UNGATED
    none = borrow_gate(100.0, 100.0, 164.0, 1000.0, costs, PolicySpec(gate_enabled=False))
    assert not none.admit and none.outcome is GateOutcome.NO_SPEEDUP


def _batch_end(work: float, c_a: float, r: float, window: float, dt: float = 1e-3) -> float:
    """When a batch with ``work`` seconds left (at speed 1) ends if it borrows: speed 1 through
    the activation, ``r`` until the batch ends or the window closes (the return), 1 after."""
    t = 0.0
    while work > 0:
        work -= (r if c_a <= t < window else 1.0) * dt
        t += dt
    return t


@pytest.mark.parametrize("r", [1.2, 1.37, 2.0, 2.9])
@pytest.mark.parametrize(("remaining", "window"), [(10.0, 1e6), (30.0, 1e6), (45.0, 1e6), (120.0, 1e6),
                                                   (120.0, 40.0), (300.0, 20.0), (60.0, 9.0)])
def test_borrow_gate_saving_is_the_batch_end_difference(r: float, remaining: float, window: float) -> None:
    """Borrowing played out on a timeline: the gate's saving is exactly how much earlier the batch
    ends, whether the batch ends first or the window closes first, and it admits exactly when
    that beats the return delay (the activation is paid once, inside the saving)."""
    c_a, c_d = 8.0, 4.4
    costs = CostModel(activation_s=c_a, deactivation_s=c_d)
    d = borrow_gate(100.0 * r, 100.0, window, remaining, costs, PolicySpec(gate_margin=1.0))
    earlier = remaining - _batch_end(remaining, c_a, r, window)
    if remaining > c_a and window > c_a:
        assert d.saving_s == pytest.approx(earlier, abs=5e-3)
    else:
        assert d.saving_s == 0.0 and earlier == pytest.approx(0.0, abs=5e-3)
    if abs(earlier - c_d) > 1e-2:
        assert d.admit == (earlier > c_d)


def test_expansion_gate_needs_lifetime_beyond_preparation() -> None:
    pol = PolicySpec()
    costs = CostModel(expansion_prep_s=60.0, expansion_final_s=15.0)
    short = expansion_gate(200.0, 150.0, 70.0, costs, pol)
    assert not short.admit and short.outcome is GateOutcome.LIFETIME_TOO_SHORT
    ok = expansion_gate(200.0, 150.0, 3600.0, costs, pol)
    assert ok.admit and ok.useful_s == 3525.0 and ok.saving_s == pytest.approx(3525.0 / 3)


def test_expansion_gate_pure_growth_costs_the_serving_pool_nothing() -> None:
    """c_f delays only the new workers (it is off T_useful): a growth that re-plans no serving
    worker is admitted at any speedup once the lifetime covers c_p + c_f. Charging c_f as a cost
    too would decline it (saving 0.9 s <= 14 s)."""
    pol = PolicySpec()
    costs = CostModel(expansion_prep_s=61.0, expansion_final_s=14.0)
    d = expansion_gate(300.0, 297.0, 165.0, costs, pol)  # r = 1.0101, T_useful = 90 s
    assert d.admit and d.outcome is GateOutcome.ADMITTED
    assert d.cost_s == 0.0 and d.useful_s == pytest.approx(90.0)
    assert d.saving_s == pytest.approx(90.0 * (300.0 / 297.0 - 1.0))
    assert not expansion_gate(300.0, 300.0, 3600.0, costs, pol).admit  # no speedup, nothing to gain


@pytest.mark.parametrize("k,n", [(1, 8), (4, 8), (8, 8), (3, 12)])
def test_expansion_gate_charges_the_re_planned_share_of_the_pool(k: int, n: int) -> None:
    """cost = c_f k / n, written out; the decision flips where the saving crosses it."""
    pol = PolicySpec()
    c_p, c_f = 60.0, 15.0
    costs = CostModel(expansion_prep_s=c_p, expansion_final_s=c_f)
    want_cost = c_f * k / n
    for life in (80.0, 90.0, 200.0, 1000.0):
        for m_with in (290.0, 297.0, 299.5):
            d = expansion_gate(300.0, m_with, life, costs, pol, stalled_fraction=k / n)
            saving = (life - c_p - c_f) * (300.0 / m_with - 1.0)
            assert d.cost_s == pytest.approx(want_cost)
            assert d.saving_s == pytest.approx(saving)
            assert d.admit == (saving > pol.gate_margin * want_cost)


def test_expansion_gate_stalled_fraction_is_clamped_and_checked() -> None:
    pol = PolicySpec()
    costs = CostModel(expansion_prep_s=60.0, expansion_final_s=15.0)
    assert expansion_gate(300.0, 200.0, 3600.0, costs, pol, stalled_fraction=3.0).cost_s == 15.0
    assert expansion_gate(300.0, 200.0, 3600.0, costs, pol, stalled_fraction=-1.0).cost_s == 0.0
    with pytest.raises(ValueError, match="stalled_fraction"):
        expansion_gate(300.0, 200.0, 3600.0, costs, pol, stalled_fraction=float("nan"))


def test_switch_gate_pays_back_within_the_known_budget() -> None:
    """saving = (T_hold - c_f)(r - 1) against cost = c_f k / n; no known change admits."""
    costs = CostModel(expansion_final_s=15.0)
    pol = PolicySpec()
    # nothing known: the hysteresis already decided
    g = switch_gate(300.0, 275.0, math.inf, costs, pol)
    assert g.admit and g.outcome is GateOutcome.ADMITTED
    # lent GPUs leave in 4 s: the re-roled workers would not serve at all
    g = switch_gate(300.0, 275.0, 4.0, costs, pol)
    assert not g.admit and g.outcome is GateOutcome.WINDOW_TOO_SHORT
    # 200 s left, r = 300 / 275: saving (200 - 15) * (300/275 - 1) = 16.8 s vs 15 s (all re-roled)
    g = switch_gate(300.0, 275.0, 200.0, costs, pol)
    assert g.admit and g.saving_s == pytest.approx(185.0 * (300.0 / 275.0 - 1.0)) and g.cost_s == 15.0
    # 179 s left: (179 - 15) * 0.0909 = 14.9 s <= 15 s
    g = switch_gate(300.0, 275.0, 179.0, costs, pol)
    assert not g.admit and g.outcome is GateOutcome.SAVING_BELOW_COST
    # half the serving workers re-roled halves the cost
    g = switch_gate(300.0, 275.0, 179.0, costs, pol, stalled_fraction=0.5)
    assert g.admit and g.cost_s == 7.5
    # no speedup, gate disabled, bad input
    assert switch_gate(275.0, 300.0, math.inf, costs, pol).outcome is GateOutcome.NO_SPEEDUP
    off = PolicySpec(gate_enabled=False)
    assert switch_gate(300.0, 275.0, 4.0, costs, off).outcome is GateOutcome.UNGATED
    with pytest.raises(ValueError, match="stalled_fraction"):
        switch_gate(300.0, 275.0, 10.0, costs, pol, stalled_fraction=math.nan)
    with pytest.raises(ValueError, match="NaN"):
        switch_gate(300.0, 275.0, math.nan, costs, pol)
