"""The closed loop on measured makespans (``makespan_correction``) and its use by the decision
(``decision`` module docstring, 9.)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from pearl.config import RunConfig
from pearl.core.decision import Allocation, evaluate_table, model_makespan
from pearl.core.makespan_correction import P0, MakespanCorrection, Q, R
from pearl.core.profile import HardwareProfile, WorkloadProfile

Prof = tuple[HardwareProfile, WorkloadProfile]


def test_a_persistent_overrun_is_learned_within_a_few_batches() -> None:
    c = MakespanCorrection()
    errors = []
    for _ in range(6):
        errors.append(abs(100.0 * c.factor(8, 2) / 115.0 - 1.0))  # the model says 100 s, the batch takes 115 s
        c = c.observe(8, 2, 100.0, 115.0)
    # the first update: x = K log(1.15), K = (P0 + Q) / (P0 + Q + R)
    k = (P0 + Q) / (P0 + Q + R)
    assert math.log(MakespanCorrection().observe(8, 2, 100.0, 115.0).factor(8, 2)) == pytest.approx(k * math.log(1.15))
    assert errors[0] == pytest.approx(1.0 - 100.0 / 115.0)
    assert errors[1] < 0.05 and errors[5] < 0.02 and errors == sorted(errors, reverse=True)


def test_neighbours_share_the_correction_and_other_modes_do_not() -> None:
    c = MakespanCorrection().observe(8, 4, 100.0, 120.0)
    at, near, far = c.factor(8, 4), c.factor(8, 5), c.factor(8, 1)
    assert at > near > far > 1.0 and far < 1.01
    assert c.factor(16, 8) < at  # another budget, same fraction: one octave away
    assert c.factor(8) == 1.0  # colocation has its own loop
    # a new anchor starts from its neighbours' estimate, then follows its own measurements
    assert c.observe(8, 5, 100.0, 100.0).factor(8, 5) < near


def test_broken_measurements_change_nothing() -> None:
    c = MakespanCorrection().observe(8, None, 100.0, 110.0)
    for model, measured in ((math.nan, 100.0), (100.0, math.inf), (0.0, 100.0), (100.0, -5.0)):
        assert c.observe(8, None, model, measured) is c


def test_the_decision_multiplies_each_prediction_by_its_correction(prof8b: Prof, cfg8b: RunConfig) -> None:
    hw, wl = prof8b
    corr = MakespanCorrection().observe(8, None, 100.0, 110.0).observe(8, 4, 100.0, 90.0)
    plain = evaluate_table(8, 64, hw, wl, cfg8b.policy)
    fixed = evaluate_table(8, 64, hw, replace(wl, correction=corr), cfg8b.policy)
    assert fixed.coloc_s == pytest.approx(plain.coloc_s * corr.factor(8))
    want = plain.makespan_s * np.array([corr.factor(8, int(p)) for p in plain.n_prefill])
    np.testing.assert_allclose(fixed.makespan_s, want, rtol=1e-12)
    # the models' own prediction, which the loop measures against, is uncorrected
    assert model_makespan(Allocation.colocated(8), 64, hw, replace(wl, correction=corr)) == pytest.approx(plain.coloc_s)
    assert model_makespan(Allocation.disaggregated(4, 4), 64, hw, wl) == pytest.approx(float(plain.makespan_s[3]))
