"""The tail factor rho = slowest / mean trajectory duration depends on the colocated load
(trajectories per worker); the profile keeps it per load and the colocated makespan reads it at
each candidate pool's load (pearl/core/workload.py ``WorkloadProfile.tail_factor_at``), never
predicting a bigger pool slower (``colocated.colocated_makespan_idle_bound``)."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest

from pearl.config import PolicySpec
from pearl.core.colocated import colocated_makespan, colocated_makespan_idle_bound
from pearl.core.decision import decide
from pearl.core.fitting import _blend_tail_by_load, _colocated_load, fit_workload
from pearl.core.hardware import HardwareProfile
from pearl.core.telemetry import TelemetryRecord
from pearl.core.workload import WorkloadProfile, _non_increasing

Prof = tuple[HardwareProfile, WorkloadProfile]


def _window(n_traj: int, n_workers: int, slow: float, mode: str = "colocated",
            weights: list[int] | None = None, whole: int | None = None) -> list[TelemetryRecord]:
    """``n_traj`` 3-turn trajectories, round-robin over ``n_workers`` (or by ``weights``: worker w
    gets ``weights[w]`` trajectories); trajectory 0 takes ``slow`` x the others' 10 s turns; only
    the first ``whole`` (default all) are seen whole (the others lack their first turn)."""
    owners = [i % n_workers for i in range(n_traj)]
    if weights is not None:
        owners = [w for w, k in enumerate(weights) for _ in range(k)]
    recs = []
    for i, w in enumerate(owners):
        turn_s = 10.0 * (slow if i == 0 else 1.0)
        first = 1 if whole is None or i < whole else 2
        recs += [TelemetryRecord(f"t{i}", k, 1000 * k, 900 * (k - 1), 100, decode_s=turn_s - 1.0, env_s=1.0,
                                 mode=mode, worker_id=f"w{w}", final=k == 3) for k in range(first, 4)]
    return recs


def test_colocated_load_is_trajectories_per_effective_worker() -> None:
    assert _colocated_load(_window(64, 16, 1.0)) == pytest.approx(4.0)
    assert _colocated_load(_window(64, 4, 1.0)) == pytest.approx(16.0)
    # every trajectory of the window counts, not only those seen whole (the query side is B / N)
    assert _colocated_load(_window(64, 8, 1.0, whole=40)) == pytest.approx(8.0)
    # a worker that served a sliver of the turns counts for its share (participation ratio):
    # 60 / 4 trajectories -> N_eff = 64^2 / (60^2 + 4^2) ~ 1.14 workers, m0 ~ 56
    skew = _colocated_load(_window(64, 2, 1.0, weights=[60, 4]))
    assert skew == pytest.approx(64 / (64 ** 2 / (60 ** 2 + 4 ** 2)))
    # a P:D window, a record without its worker, too few whole trajectories: no load
    assert _colocated_load(_window(64, 16, 1.0, mode="disaggregated")) is None
    recs = _window(64, 16, 1.0)
    assert _colocated_load([*recs[:-1], replace(recs[-1], worker_id="")]) is None
    assert _colocated_load(_window(4, 2, 1.0)) is None


def test_blend_keeps_one_ema_and_a_count_per_load_bucket() -> None:
    t = _blend_tail_by_load((), 2.0, 1.2, 0.5)
    assert t == ((4, 2.0, 1.2, 1),)
    t = _blend_tail_by_load(t, 2.1, 1.3, 0.5)  # same bucket (width 0.5 in log2 m0): EMA of both
    assert t == ((4, pytest.approx(2.05), pytest.approx(1.25), 2),)
    t = _blend_tail_by_load(t, 4.0, 1.1, 0.5)  # another bucket
    assert [(k, n) for k, _x, _y, n in t] == [(4, 2), (8, 1)]


def test_non_increasing_pools_violators() -> None:
    xs, ys = _non_increasing([(1.0, 1.25, 2), (2.0, 1.20, 2), (3.0, 1.30, 2), (4.0, 1.10, 2)])
    assert xs == [1.0, 2.0, 3.0, 4.0] and ys == pytest.approx([1.25, 1.25, 1.25, 1.10])
    assert all(a >= b for a, b in itertools.pairwise(ys))
    assert _non_increasing([(1.0, 1.3, 1), (2.0, 1.2, 3)])[1] == pytest.approx([1.3, 1.2])  # already fine


def test_tail_factor_at_interpolates_in_log_load_and_is_flat_outside(prof8b: Prof) -> None:
    _hw, wl = prof8b
    assert wl.tail_factor_at(np.array([4.0])) is None  # nothing measured yet
    one = replace(wl, tail_factor=1.2)
    assert one.tail_factor_at(np.array([2.0, 16.0])) == pytest.approx([1.2, 1.2])  # no table: the global rho
    two = replace(one, tail_by_load=((2, 1.0, 1.25, 2), (8, 4.0, 1.10, 3)))  # m0 = 2 -> 1.25, m0 = 16 -> 1.10
    assert two.tail_varies_with_load
    got = two.tail_factor_at(np.array([1.0, 2.0, 4.0, 16.0, 64.0]))
    assert got == pytest.approx([1.25, 1.25, 1.25 - 0.15 / 3, 1.10, 1.10])
    # a bucket seen once is not used yet; an inverted pair is pooled (rho does not rise with load)
    young = replace(one, tail_by_load=((2, 1.0, 1.25, 2), (8, 4.0, 1.10, 1)))
    assert not young.tail_varies_with_load and young.tail_factor_at(np.array([16.0])) == pytest.approx([1.25])
    inverted = replace(one, tail_by_load=((2, 1.0, 1.10, 2), (8, 4.0, 1.30, 2)))
    assert inverted.tail_factor_at(np.array([2.0, 16.0])) == pytest.approx([1.2, 1.2])
    # no global estimate: no rho at all, whatever the table says (the prior's reach weights apply)
    assert replace(two, tail_factor=None).tail_factor_at(np.array([4.0])) is None


def test_fit_records_rho_at_the_window_load_and_the_makespan_reads_it_per_pool(prof8b: Prof) -> None:
    hw, wl = prof8b
    p = wl
    for _ in range(2):  # two windows per load: each bucket is in use
        p = fit_workload(p, _window(64, 16, 1.5), alpha=0.5)
        p = fit_workload(p, _window(64, 4, 1.2), alpha=0.5)
    rho16 = 1.5 * 3 * 10.0 / ((63 * 30.0 + 45.0) / 64)
    rho4 = 1.2 * 30.0 / ((63 * 30.0 + 36.0) / 64)
    assert [(k, 2 ** x, n) for k, x, _y, n in p.tail_by_load] == [(4, pytest.approx(4.0), 2),
                                                                   (8, pytest.approx(16.0), 2)]
    assert [y for _k, _x, y, _n in p.tail_by_load] == pytest.approx([rho16, rho4])
    # colocation on 16 workers (m0 = 4) takes rho16, on 4 workers rho4: the per-pool ratio of the
    # makespans carries the two measured factors, not one shared one
    n = np.array([4.0, 16.0])
    m = colocated_makespan(hw, p, 64, n)
    flat = replace(p, tail_by_load=(), tail_factor=1.0)
    m1 = colocated_makespan(hw, flat, 64, n)
    assert m / m1 == pytest.approx([rho4, rho16])
    assert all(math.isfinite(v) for v in m)


def test_a_bigger_colocated_pool_is_never_predicted_slower(prof8b: Prof) -> None:
    """A steep rho table (1.05 at 16 per worker, 2.0 at 1 per worker) makes rho(B/N) T_mean(N) rise
    with N near the latency floor; the idle bound (a pool may leave workers idle) keeps the
    decision's colocated prediction and curve non-increasing, and leaves decreasing parts alone."""
    hw, wl = prof8b
    steep = replace(wl, tail_factor=1.2, tail_by_load=((0, 0.0, 2.0, 5), (8, 4.0, 1.05, 5)))
    ns = np.arange(1.0, 65.0)
    raw = colocated_makespan(hw, steep, 64, ns)
    assert np.any(np.diff(raw) > 0)  # the table alone does make a bigger pool slower somewhere
    bound = colocated_makespan_idle_bound(hw, steep, 64, ns)
    assert np.all(np.diff(bound) <= 1e-9) and np.all(bound <= raw + 1e-9)
    first_rise = int(np.argmax(np.diff(raw) > 0))
    assert bound[: first_rise + 1] == pytest.approx(raw[: first_rise + 1])
    pol = PolicySpec(allow_disaggregation=False)
    m = [decide(k, 64, hw, steep, pol).predicted_makespan_s for k in (8, 16, 32, 64)]
    assert all(a >= b - 1e-6 for a, b in itertools.pairwise(m))
    curve = decide(64, 64, hw, steep, pol).colocated_curve
    assert all(a >= b for a, b in itertools.pairwise(curve))
