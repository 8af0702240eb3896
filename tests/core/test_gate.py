from __future__ import annotations

import math

import pytest

from pearl.config import PolicySpec
from pearl.core.gate import CostKind, CostModel, borrow_gate, expansion_gate


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
    # r = 2, batch-bound: useful = min(164 - 10, (100 - 6) / 2) = 47; saving = 47 * 1 > return 4
    d = borrow_gate(200.0, 100.0, 164.0, 100.0, costs, pol)
    assert d.admit and d.useful_s == 47.0 and d.saving_s == 47.0 and d.cost_s == 4.0
    # r = 1.05: useful = min(154, 994 / 1.05); saving = 154 * 0.05 = 7.7 > 4 -> admitted
    d2 = borrow_gate(105.0, 100.0, 164.0, 1000.0, costs, pol)
    assert d2.admit and d2.saving_s == pytest.approx(7.7)
    # r = 1.02: saving = 154 * 0.02 = 3.08 < 4 -> refused
    assert not borrow_gate(102.0, 100.0, 164.0, 1000.0, costs, pol).admit
    # a window shorter than the handoff
    d3 = borrow_gate(200.0, 100.0, 8.0, 1000.0, costs, pol)
    assert not d3.admit and "too short" in d3.reason
    # a batch that ends before the activation does
    d4 = borrow_gate(200.0, 100.0, 164.0, 5.0, costs, pol)
    assert not d4.admit and "before the activation" in d4.reason
    # ungated: admits whenever there is a speedup
    assert borrow_gate(105.0, 100.0, 164.0, 1000.0, costs, PolicySpec(gate_enabled=False)).admit
    assert not borrow_gate(100.0, 100.0, 164.0, 1000.0, costs, PolicySpec(gate_enabled=False)).admit


@pytest.mark.parametrize("r", [1.2, 1.37, 2.0, 2.9])
@pytest.mark.parametrize("remaining", [10.0, 30.0, 45.0, 120.0])
def test_borrow_gate_saving_is_the_batch_end_difference(r: float, remaining: float) -> None:
    """Batch-bound borrowing, played out on a timeline: the batch has ``R`` seconds of work at
    speed 1; it goes on at speed 1 through the activation, then at speed ``r``. The gate's
    saving is exactly how much earlier the batch ends, and it admits exactly when that beats the
    return delay (the activation is paid once, inside the saving)."""
    c_a, c_d = 8.0, 4.4
    costs = CostModel(activation_s=c_a, deactivation_s=c_d)
    d = borrow_gate(100.0 * r, 100.0, 1e6, remaining, costs, PolicySpec(gate_margin=1.0))
    t, work, dt = 0.0, remaining, 1e-3  # integrate the batch's progress in small steps
    while work > 0:
        work -= (1.0 if t < c_a else r) * dt
        t += dt
    earlier = remaining - t
    if remaining > c_a:
        assert d.saving_s == pytest.approx(earlier, abs=2e-3)
    else:
        assert d.saving_s == 0.0 and earlier == pytest.approx(0.0, abs=2e-3)
    assert d.admit == (earlier - c_d > 1e-2) or abs(earlier - c_d) < 1e-2


def test_expansion_gate_needs_lifetime_beyond_preparation() -> None:
    pol = PolicySpec()
    costs = CostModel(expansion_prep_s=60.0, expansion_final_s=15.0)
    assert not expansion_gate(200.0, 150.0, 70.0, costs, pol).admit
    ok = expansion_gate(200.0, 150.0, 3600.0, costs, pol)
    assert ok.admit and ok.useful_s == 3525.0 and ok.saving_s == pytest.approx(3525.0 / 3)
