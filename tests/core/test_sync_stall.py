"""The weight sync after a training step aborts every request in flight and flushes the
prefix caches; ``makespan.sync_stall_s`` is what that adds to the slowest trajectory of the batch
it lands in (formula in its docstring), and the batch-start prediction adds it."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from pearl.core.makespan import sync_stall_s
from pearl.core.profile import HardwareProfile, WorkloadProfile
from pearl.core.stages import stages
from pearl.core.telemetry import Mode

Prof = tuple[HardwareProfile, WorkloadProfile]


def _by_hand(hw: HardwareProfile, wl: WorkloadProfile, batch: int, progress: float, div: float,
             pause: float, disaggregated: bool) -> float:
    """The docstring's formula, written out turn group by turn group without numpy."""
    st = stages(wl, Mode.DISAGGREGATED if disaggregated else Mode.COLOCATED)
    weights = [sum(g) for g in st.surv]
    total, acc, s = sum(weights), 0.0, len(weights) - 1
    for i, w in enumerate(weights):
        acc += w
        if acc / total >= progress:
            s = i
            break
    x, c, o, e, alive = (float(a[0, s]) for a in (st.x, st.c, st.o, st.e, st.alive))
    m = max(batch * alive / div, 1.0)
    ctx = x + c + o / 2
    p = hw.prefill_s(x, c)
    dec = o * hw.decode_step_s(m, ctx)
    f = dec / (p + dec + e)
    extra = f * hw.prefill_s(ctx, 0.0) + (1 - f) * (hw.prefill_s(x + c, 0.0) - p)
    return pause + ((m + 1) / 2 if disaggregated else m) * extra


@pytest.mark.parametrize("progress", [0.0, 0.3, 0.6, 0.95, 1.5])
@pytest.mark.parametrize("disaggregated", [False, True])
def test_stall_is_the_pause_plus_the_re_prefill_burst(prof8b: Prof, progress: float, disaggregated: bool) -> None:
    hw, wl = prof8b
    div = 4.0 if disaggregated else 16.0
    got = sync_stall_s(hw, wl, 64, progress, div, 2.0, disaggregated=disaggregated)
    assert got == pytest.approx(_by_hand(hw, wl, 64, progress, div, 2.0, disaggregated), rel=1e-9)


def test_stall_grows_with_the_pause_and_the_load_per_worker(prof30b: Prof) -> None:
    hw, wl = prof30b
    base = sync_stall_s(hw, wl, 64, 0.5, 16.0, 0.0)
    assert base > 0  # a re-prefill burst even without a pause
    assert sync_stall_s(hw, wl, 64, 0.5, 16.0, 3.0) == pytest.approx(base + 3.0)
    per_worker = [sync_stall_s(hw, wl, 64, 0.5, float(n), 0.0) for n in (4, 8, 16, 32, 64)]
    assert all(a > b for a, b in itertools.pairwise(per_worker))  # fewer trajectories each
    # a disaggregated trajectory waits out half its prefill worker's burst, not all of it
    assert sync_stall_s(hw, wl, 64, 0.5, 8.0, 0.0, disaggregated=True) < sync_stall_s(hw, wl, 64, 0.5, 8.0, 0.0)


def test_late_sync_meets_fewer_trajectories(prof8b: Prof) -> None:
    """Late in the batch most trajectories have ended: the burst is smaller than mid-batch."""
    hw, wl = prof8b
    st = stages(wl, Mode.COLOCATED)
    assert float(np.min(st.alive)) < 0.5  # the profile's tail thins out
    mid = sync_stall_s(hw, wl, 64, 0.5, 8.0, 0.0)
    end = sync_stall_s(hw, wl, 64, 1.0, 8.0, 0.0)
    assert end < mid


def test_negative_pause_and_progress_are_clamped(prof8b: Prof) -> None:
    hw, wl = prof8b
    assert sync_stall_s(hw, wl, 64, -1.0, 8.0, -5.0) == pytest.approx(sync_stall_s(hw, wl, 64, 0.0, 8.0, 0.0))


@pytest.mark.parametrize("disaggregated", [False, True])
def test_stall_reads_the_modes_view_at_its_mean_tokens(prof8b: Prof, disaggregated: bool) -> None:
    """The stall applies the mode's view (moved turns in the colocated one, the pool's cache in the
    disaggregated one) and takes P at the group's mean tokens: the colocated view's mixture term
    ``q`` is not used."""
    hw, wl = prof8b
    moved = replace(wl, moved_share=0.3, moved_hit=0.4)
    assert stages(moved, Mode.COLOCATED).q is not None
    for progress in (0.2, 0.7):
        got = sync_stall_s(hw, moved, 64, progress, 8.0, 1.0, disaggregated=disaggregated)
        assert got == pytest.approx(_by_hand(hw, moved, 64, progress, 8.0, 1.0, disaggregated), rel=1e-12)
    # the colocated view moves prompt tokens out of the cache: the burst differs from the raw profile's
    if not disaggregated:
        assert sync_stall_s(hw, moved, 64, 0.5, 8.0, 0.0) != sync_stall_s(hw, wl, 64, 0.5, 8.0, 0.0)
