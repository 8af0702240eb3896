"""The closed loop on measured makespans (``makespan_correction``) and its use by the decision
(``decision`` module docstring, 9.)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from pearl.config import RunConfig
from pearl.core.decision import Allocation, decide, evaluate_table, model_makespan
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
    # colocation, which no batch has measured, borrows the split's own term (at its anchors' mean
    # fraction) until it runs; then it has its own
    assert c.factor(8) == pytest.approx(at)
    assert c.observe(8, None, 100.0, 100.0).factor(8) < at
    # a new anchor starts from its neighbours' estimate, then follows its own measurements
    assert c.observe(8, 5, 100.0, 100.0).factor(8, 5) < near


def test_a_pool_change_corrects_the_shared_term_and_a_fixed_pool_its_mode() -> None:
    """``x(c) = s(N) + m(c)`` (module docstring): what batches on one configuration measure stays
    with their mode; what batches whose pool changed measure moves colocation and every split on
    those budgets alike, since nothing in them tells the mode's own error from the runtime's work."""
    fixed = MakespanCorrection()
    for _ in range(4):
        fixed = fixed.observe(16, None, 100.0, 110.0)
    x, p = 0.0, P0  # the scalar filter of the module docstring, four times on z = log 1.1
    for _ in range(4):
        p += Q
        x, p = x + p / (p + R) * (math.log(1.1) - x), R * p / (p + R)
    assert math.log(fixed.factor(16)) == pytest.approx(x, rel=1e-9) and not fixed.shared
    # colocation's own model error is the splits' only while no split has run: one that has keeps its own
    assert fixed.factor(16, 5) == pytest.approx(fixed.factor(16))
    assert fixed.observe(16, 5, 100.0, 100.0).factor(16, 5) < fixed.factor(16)
    # batches that went 32 -> 16 -> 32 workers, 10 % over their models: the shared term takes the
    # overrun, so colocation and every split move together and none is ranked ahead for it
    cycle = MakespanCorrection()
    for _ in range(4):
        cycle = cycle.observe_pieces([(32, None, 110.0, 200.0), (16, None, 165.0, 300.0)])
    assert len(cycle.shared) == 2 and not cycle.colocated and not cycle.split
    for n in (16, 32):
        assert 1.05 < cycle.factor(n) < 1.11
        for p in (1, n // 3, n - 1):
            assert cycle.factor(n, p) == cycle.factor(n)
    # and, cycle after cycle, the shared term settles on the overrun itself
    settled = cycle
    for _ in range(16):
        settled = settled.observe_pieces([(32, None, 110.0, 200.0), (16, None, 165.0, 300.0)])
    assert settled.factor(16) == pytest.approx(1.1, abs=0.002) and settled.factor(32) == pytest.approx(1.1, abs=0.002)
    # after them, a split's batch on a fixed pool measures its own model: at its model, its own
    # term stays at nought; 20 % over it, its own term learns that
    at_model = cycle.observe(16, 5, 100.0, 100.0)
    assert at_model.factor(16, 5) == pytest.approx(cycle.factor(16, 5), rel=1e-12)
    slow = cycle.observe(16, 5, 100.0, 120.0)
    assert cycle.factor(16, 5) * 1.1 < slow.factor(16, 5) < cycle.factor(16, 5) * 1.2
    # colocation, which no batch of this loop has run on one configuration, borrows that own term
    assert slow.factor(16) == pytest.approx(slow.factor(16, 5), rel=1e-12)
    # the pieces are weighed against each mode's own term: a cycle that ran just as colocation's
    # own corrections say has nothing to share
    f16, f32 = fixed.factor(16), fixed.factor(32)
    both = fixed.observe_pieces([(16, None, 0.5 * 200.0 * f16, 200.0), (32, None, 0.5 * 100.0 * f32, 100.0)])
    assert both.factor(16) == pytest.approx(f16, rel=0.015) and both.factor(32) == pytest.approx(f32, rel=0.015)
    assert [a[2] for a in both.colocated] == [a[2] for a in fixed.colocated]  # the mode's own term is not moved


def test_a_batch_over_two_pools_is_measured_against_both() -> None:
    """A batch that ran half its work on 32 workers (model 200 s) and half on 16 (model 300 s) took
    100 + 150 s: just what the models say (``phi = 1``), so nothing is corrected. Taken as 250 s on
    32 workers (what the pool at its start and end says) it would read as a 25 % overrun."""
    c = MakespanCorrection().observe_pieces([(32, None, 100.0, 200.0), (16, None, 150.0, 300.0)])
    assert c.batches == 1 and c.factor(32) == pytest.approx(1.0) and c.factor(16) == pytest.approx(1.0)
    assert len(c.shared) == 2 and not c.colocated and not c.split
    assert MakespanCorrection().observe(32, None, 200.0, 250.0).factor(32) > 1.15
    # a 10 % overrun on both: phi = 1.1; the piece that did more of the work learns more
    slow = MakespanCorrection().observe_pieces([(32, None, 220.0, 200.0), (16, None, 110.0, 300.0)])
    x32, x16 = math.log(slow.factor(32)), math.log(slow.factor(16))
    z = math.log(220.0 / 200.0 + 110.0 / 300.0)
    assert 0.0 < x16 < x32 < z
    # one piece is ``observe``
    one = MakespanCorrection().observe_pieces([(8, 2, 115.0, 100.0)])
    assert one == MakespanCorrection().observe(8, 2, 100.0, 115.0)


def test_broken_measurements_change_nothing() -> None:
    c = MakespanCorrection().observe(8, None, 100.0, 110.0)
    for model, measured in ((math.nan, 100.0), (100.0, math.inf), (0.0, 100.0), (100.0, -5.0)):
        assert c.observe(8, None, model, measured) is c
        assert c.observe_pieces([(8, None, 50.0, 100.0), (16, None, measured, model)]) is c
    assert c.observe_pieces([]) is c


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


def test_the_borrow_cycles_overhead_ranks_no_mode_ahead(prof8b: Prof, cfg8b: RunConfig) -> None:
    """Colocated batches that each went 32 -> 16 -> 32 workers and ran 8 % over their models (the
    runtime's work of a return and a borrow): every candidate's prediction moves by the same
    factor, so the decision at 16 workers against colocation is what the models alone decide."""
    hw, wl = prof8b
    m32, m16 = (model_makespan(Allocation.colocated(n), 64, hw, wl) for n in (32, 16))
    corr = MakespanCorrection()
    for _ in range(8):
        corr = corr.observe_pieces([(32, None, 0.4 * m32 * 1.08, m32), (16, None, 0.6 * m16 * 1.08, m16)])
    assert corr.factor(16) > 1.05
    cwl = replace(wl, correction=corr)
    plain, fixed = evaluate_table(16, 64, hw, wl, cfg8b.policy), evaluate_table(16, 64, hw, cwl, cfg8b.policy)
    np.testing.assert_allclose(fixed.makespan_s / fixed.coloc_s, plain.makespan_s / plain.coloc_s, rtol=1e-12)
    coloc = Allocation.colocated(16)
    assert (decide(16, 64, hw, cwl, cfg8b.policy, coloc).target == decide(16, 64, hw, wl, cfg8b.policy, coloc).target)


def test_the_tracker_measures_a_batch_against_the_pieces_it_ran(prof8b: Prof) -> None:
    """``RuntimeTracker.observe_batch``: each piece's model makespan on the tracker's profiles; a
    batch that changed mode is not taken (its re-roling is in no model)."""
    from pearl.runtime.tracker import RuntimeTracker

    hw, wl = prof8b
    t = RuntimeTracker(hw, wl)
    m32, m16 = (model_makespan(Allocation.colocated(n), 64, hw, wl) for n in (32, 16))
    assert not t.observe_batch([(Allocation.colocated(16), 50.0, 16.0), (Allocation.disaggregated(5, 11), 200.0, 16.0)],
                               64)
    assert t.workload.correction.batches == 0
    assert t.observe_batch([(Allocation.colocated(32), 0.5 * m32, 32.0), (Allocation.colocated(16), 0.5 * m16, 16.0)],
                           64)
    corr = t.workload.correction
    assert corr.batches == 1 and corr.factor(32) == pytest.approx(1.0) and corr.factor(16) == pytest.approx(1.0)
    split = Allocation.disaggregated(5, 11)
    assert t.observe_batch([(split, 1.2 * model_makespan(split, 64, hw, wl), 16.0)], 64)
    # the split's own term learns it; colocation, measured by no batch of its own, borrows it
    corr = t.workload.correction
    assert corr.factor(16, 5) > 1.1 and corr.factor(16) == pytest.approx(corr.factor(16, 5))
    # a colocated pool that grew mid-batch is measured on its effective workers (``batch_pieces``)
    m24 = model_makespan(Allocation.colocated(24), 64, hw, wl)
    t2 = RuntimeTracker(hw, wl)
    assert t2.observe_batch([(Allocation.colocated(32), m24, 24.0)], 64)
    assert t2.workload.correction.factor(32) == pytest.approx(1.0)


def test_a_batch_is_cut_into_the_allocations_it_ran() -> None:
    """``outlook.batch_pieces``: the allocation at the start, then each change in turn; a colocated
    pool that grew past the fewest workers the batch had runs on ``sticky_pool``'s workers."""
    from pearl.core.makespan import sticky_pool
    from pearl.core.outlook import batch_pieces

    c32, c16, split = Allocation.colocated(32), Allocation.colocated(16), Allocation.disaggregated(10, 22)
    got = batch_pieces(c32, [(105.0, c16), (200.0, c32)], 100.0, 300.0, 64.0, 2.0)
    assert got == [(c32, 5.0, 32.0), (c16, 95.0, 16.0), (c32, 100.0, sticky_pool(64.0, 16.0, 32.0, 2.0))]
    assert 16.0 < got[2][2] < 32.0
    assert batch_pieces(split, [(150.0, Allocation.disaggregated(5, 11)), (200.0, split)], 100.0, 300.0, 64.0, 2.0) == [
        (split, 50.0, 32.0), (Allocation.disaggregated(5, 11), 50.0, 16.0), (split, 100.0, 32.0)]
    assert batch_pieces(c16, [], 0.0, 250.0, 64.0, 2.0) == [(c16, 250.0, 16.0)]
    assert batch_pieces(c16, [(10.0, None), (20.0, c16)], 0.0, 250.0, 64.0, 2.0) is None
    # grown the instant it started: its trajectories were placed on the 16 workers
    assert batch_pieces(c16, [(0.0, c32)], 0.0, 250.0, 64.0, 2.0) == [(c32, 250.0, sticky_pool(64.0, 16.0, 32.0, 2.0))]
