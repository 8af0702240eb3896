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
    # r = 2: useful = min(164 - 10, 100/2) = 50; saving = 50 * 1 = 50 > 10
    d = borrow_gate(200.0, 100.0, 164.0, 100.0, costs, pol)
    assert d.admit and d.useful_s == 50.0 and d.saving_s == 50.0 and d.cost_s == 10.0
    # r = 1.05: useful = 154, saving = 7.7 < 10 -> refused
    d2 = borrow_gate(105.0, 100.0, 164.0, 1000.0, costs, pol)
    assert not d2.admit and d2.saving_s == pytest.approx(7.7)
    # a window shorter than the handoff
    d3 = borrow_gate(200.0, 100.0, 8.0, 1000.0, costs, pol)
    assert not d3.admit and "too short" in d3.reason
    # ungated: admits whenever there is a speedup
    assert borrow_gate(105.0, 100.0, 164.0, 1000.0, costs, PolicySpec(gate_enabled=False)).admit
    assert not borrow_gate(100.0, 100.0, 164.0, 1000.0, costs, PolicySpec(gate_enabled=False)).admit


def test_expansion_gate_needs_lifetime_beyond_preparation() -> None:
    pol = PolicySpec()
    costs = CostModel(expansion_prep_s=60.0, expansion_final_s=15.0)
    assert not expansion_gate(200.0, 150.0, 70.0, costs, pol).admit
    ok = expansion_gate(200.0, 150.0, 3600.0, costs, pol)
    assert ok.admit and ok.useful_s == 3525.0 and ok.saving_s == pytest.approx(3525.0 / 3)
