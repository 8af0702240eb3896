"""The batch's slowest-trajectory path (reach weights, measured tail factor, the slowest observed
paths of a split), the stall-free decode fit and the batch-start burst (formulas in
pearl/core/colocated.py, disaggregated.py, stages.py, fitting.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from pearl.core.colocated import colocated_makespan
from pearl.core.disaggregated import disaggregated_makespan
from pearl.core.profile import (
    TAIL_WINDOWS,
    HardwareProfile,
    TelemetryRecord,
    WorkloadProfile,
    fit_hardware,
    fit_workload,
)
from pearl.core.stages import stages
from pearl.core.telemetry import Mode
from pearl.core.workload import prefill_pool_windows

Prof = tuple[HardwareProfile, WorkloadProfile]


def _traj(tid: str, turns: int, turn_s: float) -> list[TelemetryRecord]:
    return [TelemetryRecord(tid, k, 1000 * k, 900 * k if k > 1 else 0, 100, decode_s=turn_s - 1.0, env_s=1.0,
                            final=k == turns) for k in range(1, turns + 1)]


def test_reach_weights_count_the_expected_longest_trajectory() -> None:
    wl = WorkloadProfile((1.0, 1.0, 0.5, 0.01), (10.0,) * 4, (0.0,) * 4, (10.0,) * 4, (1.0,) * 4, 100.0)
    st = stages(wl, Mode.COLOCATED, 4)
    r = st.reach(64)
    # R_k = 1 - (1 - S_k)^B: turns 1-3 are all but certain with 64 trajectories, the 1 % tail is not
    assert r[0, :3] == pytest.approx([1.0, 1.0, 1.0]) and r[0, 3] == pytest.approx(1 - 0.99 ** 64)
    assert st.reach(1)[0] == pytest.approx([1.0, 1.0, 0.5, 0.01])


def test_tail_factor_is_fitted_from_whole_trajectories_and_scales_the_mean_path(prof8b: Prof) -> None:
    hw, wl = prof8b
    assert wl.tail_factor is None  # the prior has not seen a trajectory
    recs = [r for i in range(10) for r in _traj(f"t{i}", 3, 10.0 + i)]
    fitted = fit_workload(wl, recs)
    durations = [3 * (10.0 + i) for i in range(10)]
    assert fitted.tail_factor == pytest.approx(max(durations) / (sum(durations) / 10))
    # too few whole trajectories (or only partial ones): no estimate, the prior's is kept
    assert fit_workload(wl, recs[:21]).tail_factor is None
    assert fit_workload(fitted, [r for r in recs if r.turn > 1]).tail_factor == fitted.tail_factor
    # EMA blend once an estimate exists
    again = fit_workload(fitted, [r for i in range(10) for r in _traj(f"u{i}", 3, 10.0)], alpha=0.5)
    assert again.tail_factor == pytest.approx(1.0 + 0.5 * (fitted.tail_factor - 1.0))
    # the makespan is rho x the mean trajectory (weights S_k), for both modes
    base = replace(wl, tail_factor=1.0)
    scaled = replace(wl, tail_factor=1.2)
    n = np.array([8.0])
    a = colocated_makespan(hw, base, 64, n)[0]
    b = colocated_makespan(hw, scaled, 64, n)[0]
    assert b == pytest.approx(1.2 * a)
    da = disaggregated_makespan(hw, base, 64, np.array([3.0]), np.array([5.0]), 0.95).makespan_s[0]
    db = disaggregated_makespan(hw, scaled, 64, np.array([3.0]), np.array([5.0]), 0.95).makespan_s[0]
    assert db == pytest.approx(1.2 * da)


def test_colocated_decode_fit_removes_the_prefill_stall(prof8b: Prof) -> None:
    """A colocated worker whose decode wall time is inflated by other requests' prefills: the fit
    must recover the stall-free step time (the makespan model adds the stall back itself)."""
    hw, _wl = prof8b
    recs = []
    for i in range(40):
        n, ctx, out = 8.0, 20_000, 500
        pure = out * hw.decode_step_s(n, ctx + out / 2)
        # 8 requests decode in lockstep on one worker; each turn, each of them prefills 20K
        # uncached tokens first, and every request's decode window is stalled by the 7 others'
        p = hw.prefill_s(20_000, 0)
        stalled = pure + (n - 1) * p
        recs.append(TelemetryRecord(f"t{i}", 2, 20_000, 0, out, prefill_s=p, decode_s=stalled,
                                    decode_concurrency=n, worker_id="w0", mode="colocated"))
    fitted = fit_hardware(hw, recs, alpha=1.0)
    ratio = fitted.decode_step_s(8, 20_250) / hw.decode_step_s(8, 20_250)
    raw = recs[0].decode_s / (500 * hw.decode_step_s(8, 20_250))
    assert raw > 1.2  # the raw per-token time is far above the step time ...
    assert ratio == pytest.approx(1.0, rel=1e-6)  # ... the fit recovers it


def test_colocation_sees_the_share_of_survivors_on_its_worker(prof8b: Prof) -> None:
    """With few survivors, a surviving trajectory still shares its worker (size-biased), so more
    workers than survivors does not make the tail free."""
    hw, wl = prof8b
    few, many = colocated_makespan(hw, wl, 64, np.array([8.0, 64.0]))
    assert few > many > 0


def test_disaggregation_runs_the_slowest_observed_paths(prof8b: Prof) -> None:
    hw, wl = prof8b
    recs = [r for i in range(10) for r in _traj(f"t{i}", 3, 10.0 + i)]
    # a prior that has seen telemetry: the window blends in and the profile keeps the prior's
    # later turns (a batch front of many stages for the lagging path below)
    fitted = fit_workload(replace(wl, samples=1), recs)
    # the 4 slowest whole trajectories, slowest first, each as its turns' (x, c, o, e) in order
    assert len(fitted.tail_paths) == 4
    assert fitted.tail_paths[0] == ((1000.0, 0.0, 100.0, 1.0), (200.0, 1800.0, 100.0, 1.0), (300.0, 2700.0, 100.0, 1.0))
    assert fit_workload(wl, recs[:21]).tail_paths == ()  # too few whole trajectories

    def pd(w: WorkloadProfile) -> float:
        return float(disaggregated_makespan(hw, w, 64, np.array([3.0]), np.array([5.0]), 0.95).makespan_s[0])

    short = ((5000.0, 0.0, 300.0, 1.0),) * 6
    long = ((5000.0, 0.0, 600.0, 1.0),) * 6
    slow_env = ((5000.0, 0.0, 300.0, 6.0), *short[1:])
    one = replace(fitted, tail_paths=(short,))
    both = replace(fitted, tail_paths=(short, long))
    assert pd(both) == pytest.approx(max(pd(one), pd(replace(fitted, tail_paths=(long,))))) and pd(both) > pd(one)
    # 5 s more environment time on the path's first turn: slower, though by less than 5 s
    # stretched when its later turns meet an emptier stage (time-indexed stages)
    assert pd(replace(fitted, tail_paths=(slow_env,))) > pd(one)
    # a path that lags far behind the batch front runs its later turns in the last stage's state
    # (the fewest survivors: the smallest decode batches), not in the stage their turn number
    # says: its decode-heavy later turns cost less than they do on time
    lag = 10_000.0
    heavy = ((5000.0, 0.0, 300.0, 1.0), *((5000.0, 0.0, 3000.0, 1.0),) * 5)
    lagging = ((5000.0, 0.0, 300.0, 1.0 + lag), *heavy[1:])
    assert pd(replace(fitted, tail_paths=(lagging,))) < pd(replace(fitted, tail_paths=(heavy,))) + lag
    # with paths, the split ignores the colocated tail factor; colocation still scales with it
    assert pd(replace(one, tail_factor=1.5)) == pytest.approx(pd(one))
    n = np.array([8.0])
    c1 = colocated_makespan(hw, one, 64, n)[0]
    c2 = colocated_makespan(hw, replace(one, tail_factor=1.5), 64, n)[0]
    assert c2 > c1


def test_split_averages_the_slowest_paths_of_recent_windows(prof8b: Prof) -> None:
    """One window's slowest paths are one draw of the batch maximum, so a split's makespan is the
    EMA over the last ``TAIL_WINDOWS`` windows of the per-window maximum
    (``fitting.blend_tail_windows``)."""
    hw, wl = prof8b

    def window(tag: str) -> list[TelemetryRecord]:
        return [r for i in range(10) for r in _traj(f"{tag}{i}", 3, 10.0 + i)]

    w1 = fit_workload(wl, window("a"), alpha=0.5)
    assert w1.tail_weights == (1.0,) and w1.tail_history == ()
    w2 = fit_workload(w1, window("b"), alpha=0.5)
    assert w2.tail_history == (w1.tail_paths,) and w2.tail_weights == pytest.approx((0.5, 0.5))
    last = w2
    for tag in "cdef":
        last = fit_workload(last, window(tag), alpha=0.5)
    assert len(last.tail_history) == TAIL_WINDOWS - 1
    assert last.tail_weights == pytest.approx((0.5, 0.25, 0.125, 0.125))  # the oldest carries the rest
    # a window with too few whole trajectories adds none and keeps the weights
    assert fit_workload(last, window("g")[:21]).tail_windows() == last.tail_windows()

    def pd(w: WorkloadProfile) -> float:
        return float(disaggregated_makespan(hw, w, 64, np.array([3.0]), np.array([5.0]), 0.95).makespan_s[0])

    short = ((5000.0, 0.0, 300.0, 1.0),) * 6
    long = ((5000.0, 0.0, 600.0, 1.0),) * 6
    brief = short[:3]  # paths of different lengths advance together
    only = replace(w1, tail_history=(), tail_weights=(1.0,))
    mixed = replace(w1, tail_paths=(short, brief), tail_history=((long,), (brief, long)), tail_weights=(0.5, 0.25, 0.25))
    expected = (0.5 * pd(replace(only, tail_paths=(short,))) + 0.25 * pd(replace(only, tail_paths=(long,)))
                + 0.25 * pd(replace(only, tail_paths=(long,))))
    assert pd(mixed) == pytest.approx(expected)
    assert pd(replace(only, tail_paths=(brief, short))) == pytest.approx(pd(replace(only, tail_paths=(short,))))
    # weights that do not match the kept windows (a hand-made profile) fall back to the newest window
    assert pd(replace(mixed, tail_weights=())) == pytest.approx(pd(replace(only, tail_paths=(short, brief))))
    # the prefill pool's view restates every kept window
    v = prefill_pool_windows(mixed)
    assert [len(ps) for _w, ps in v] == [2, 1, 2] and tuple(w for w, _ps in v) == mixed.tail_weights
