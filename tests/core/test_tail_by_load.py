"""Session 9: the tail factor rho = slowest / mean trajectory duration depends on the colocated
load (trajectories per worker); the profile keeps it per load and the colocated makespan reads it
at each candidate pool's load (pearl/core/profile.py ``WorkloadProfile.tail_factor_at``)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from pearl.core.makespan import Stages, colocated_makespan
from pearl.core.profile import (
    HardwareProfile,
    TelemetryRecord,
    WorkloadProfile,
    _blend_tail_by_load,
    _colocated_load,
    fit_workload,
)

Prof = tuple[HardwareProfile, WorkloadProfile]


def _window(n_traj: int, n_workers: int, slow: float, mode: str = "colocated",
            weights: list[int] | None = None) -> list[TelemetryRecord]:
    """``n_traj`` 3-turn trajectories, round-robin over ``n_workers`` (or by ``weights``: worker w
    gets ``weights[w]`` trajectories); trajectory 0 takes ``slow`` x the others' 10 s turns."""
    owners = [i % n_workers for i in range(n_traj)]
    if weights is not None:
        owners = [w for w, k in enumerate(weights) for _ in range(k)]
    recs = []
    for i, w in enumerate(owners):
        turn_s = 10.0 * (slow if i == 0 else 1.0)
        recs += [TelemetryRecord(f"t{i}", k, 1000 * k, 900 * (k - 1), 100, decode_s=turn_s - 1.0, env_s=1.0,
                                 mode=mode, worker_id=f"w{w}", final=k == 3) for k in range(1, 4)]
    return recs


def test_colocated_load_is_trajectories_per_effective_worker() -> None:
    assert _colocated_load(_window(64, 16, 1.0)) == pytest.approx(4.0)
    assert _colocated_load(_window(64, 4, 1.0)) == pytest.approx(16.0)
    # a worker that served a sliver of the turns counts for its share (participation ratio):
    # 60 / 4 trajectories -> N_eff = 64^2 / (60^2 + 4^2) ~ 1.14 workers, m0 ~ 56
    skew = _colocated_load(_window(64, 2, 1.0, weights=[60, 4]))
    assert skew == pytest.approx(64 / (64 ** 2 / (60 ** 2 + 4 ** 2)))
    # a P:D window, a record without its worker, too few whole trajectories: no load
    assert _colocated_load(_window(64, 16, 1.0, mode="disaggregated")) is None
    recs = _window(64, 16, 1.0)
    assert _colocated_load([*recs[:-1], replace(recs[-1], worker_id="")]) is None
    assert _colocated_load(_window(4, 2, 1.0)) is None


def test_blend_keeps_one_ema_per_load_bucket() -> None:
    t = _blend_tail_by_load((), 2.0, 1.2, 0.5)
    assert t == ((4, 2.0, 1.2),)
    t = _blend_tail_by_load(t, 2.1, 1.3, 0.5)  # same bucket (width 0.5 in log2 m0): EMA of both
    assert t == ((4, pytest.approx(2.05), pytest.approx(1.25)),)
    t = _blend_tail_by_load(t, 4.0, 1.1, 0.5)  # another bucket
    assert [k for k, _x, _y in t] == [4, 8]


def test_tail_factor_at_interpolates_in_log_load_and_is_flat_outside(prof8b: Prof) -> None:
    _hw, wl = prof8b
    assert wl.tail_factor_at(np.array([4.0])) is None  # nothing measured yet
    one = replace(wl, tail_factor=1.2)
    assert one.tail_factor_at(np.array([2.0, 16.0])) == pytest.approx([1.2, 1.2])  # no table: the global rho
    two = replace(one, tail_by_load=((2, 1.0, 1.25), (8, 4.0, 1.10)))  # m0 = 2 -> 1.25, m0 = 16 -> 1.10
    got = two.tail_factor_at(np.array([1.0, 2.0, 4.0, 16.0, 64.0]))
    assert got == pytest.approx([1.25, 1.25, 1.25 - 0.15 / 3, 1.10, 1.10])


def test_fit_records_rho_at_the_window_load_and_the_makespan_reads_it_per_pool(prof8b: Prof) -> None:
    hw, wl = prof8b
    on16 = fit_workload(wl, _window(64, 16, 1.5), alpha=0.5)
    on4 = fit_workload(on16, _window(64, 4, 1.2), alpha=0.5)
    rho16 = 1.5 * 3 * 10.0 / ((63 * 30.0 + 45.0) / 64)
    rho4 = 1.2 * 30.0 / ((63 * 30.0 + 36.0) / 64)
    assert [(k, 2 ** x) for k, x, _y in on4.tail_by_load] == [(4, pytest.approx(4.0)), (8, pytest.approx(16.0))]
    assert [y for _k, _x, y in on4.tail_by_load] == pytest.approx([rho16, rho4])
    # the global EMA still blends every window (the fallback, and what P:D windows update)
    assert on4.tail_factor == pytest.approx(rho16 + 0.5 * (rho4 - rho16))
    # colocation on 16 workers (m0 = 4) takes rho16, on 4 workers rho4: the per-pool ratio of the
    # makespans carries the two measured factors, not one shared one
    n = np.array([4.0, 16.0])
    m = colocated_makespan(hw, Stages.of(on4), on4, 64, n)
    flat = replace(on4, tail_by_load=(), tail_factor=1.0)
    m1 = colocated_makespan(hw, Stages.of(flat), flat, 64, n)
    assert m / m1 == pytest.approx([rho4, rho16])
    assert all(math.isfinite(v) for v in m)
