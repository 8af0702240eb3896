"""The decode step fitted from per-iteration telemetry (``iteration_fit``), the bucketed sample
store (``telemetry.DecodeSamples``) and the extrapolated candidates (``decision`` module
docstring, 8.)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pearl.config import RunConfig
from pearl.core.decision import EXTRAPOLATION_MARGIN, Allocation, decide
from pearl.core.iteration_fit import MIN_SAMPLES, refit_decode
from pearl.core.profile import (
    HardwareProfile,
    IterationRecord,
    Rejection,
    TelemetryRecord,
    WorkloadProfile,
    fit_hardware,
)
from pearl.core.telemetry import BUCKET_SAMPLES, DecodeSamples

Prof = tuple[HardwareProfile, WorkloadProfile]


def _spans(truth: HardwareProfile, role: str, batches: list[int], contexts: list[float], t0: float = 0.0,
           steps: int = 10) -> list[IterationRecord]:
    """Decode spans timed by ``truth``'s own step at each (n, L): one per pair, back to back."""
    out, t = [], t0
    for n in batches:
        for ctx in contexts:
            rec = IterationRecord("w0", role, n, n * ctx, 0, t, t, steps)
            wall = steps * float(truth.decode_step_s(float(n), rec.mean_context))
            out.append(replace(rec, end_s=t + wall))
            t += wall
    return out


def test_the_decode_step_is_recovered_from_iteration_records(prof30b: Prof) -> None:
    hw, _ = prof30b
    truth = replace(hw, b0=hw.b0 * 1.3, b_e=hw.b_e * 1.3, b2=hw.b2 * 0.45)
    recs = _spans(truth, "colocated", [1, 2, 4, 8], [2000.0, 8000.0, 16000.0, 30000.0])
    fit = fit_hardware(hw, [], iterations=recs)
    assert fit.b0 == pytest.approx(truth.b0, rel=1e-6) and fit.b2 == pytest.approx(truth.b2, rel=1e-6)
    assert fit.b_e == pytest.approx(truth.b_e, rel=1e-6)
    assert fit.decode_measured == pytest.approx((1.0, 8.0, 2004.5, 30004.5))
    assert (fit.a0, fit.a1, fit.g1) == (hw.a0, hw.a1, hw.g1)  # the prefill and transfer are the requests'


def test_decode_workers_samples_are_used_once_a_split_runs(prof8b: Prof) -> None:
    hw, _ = prof8b
    coloc = replace(hw, b2=hw.b2 * 2.0)
    dec = replace(hw, b2=hw.b2 * 0.5)
    first = fit_hardware(hw, [], iterations=_spans(coloc, "colocated", [1, 2, 4, 8], [4000.0, 16000.0] * 2))
    assert first.b2 == pytest.approx(coloc.b2, rel=1e-6)
    few = _spans(dec, "decode", [16], [4000.0], t0=1e4, steps=5)[: MIN_SAMPLES - 1]
    assert fit_hardware(first, [], iterations=few).b2 == pytest.approx(coloc.b2, rel=1e-6)  # too few: colocated
    many = _spans(dec, "decode", [16, 32], [4000.0, 16000.0, 30000.0] * 3, t0=1e4)
    split = fit_hardware(first, [], iterations=many)
    assert split.b2 == pytest.approx(dec.b2, rel=1e-6)
    assert split.decode_measured[:2] == (16.0, 32.0)


def test_buckets_keep_their_newest_samples_so_the_range_stays_covered() -> None:
    old = [IterationRecord("w0", "colocated", 2, 2 * 3000.0, 0, float(i), i + 0.5) for i in range(5)]
    store, why = DecodeSamples().add(old)
    busy = [IterationRecord("w0", "colocated", 8, 8 * 20000.0, 0, 10.0 + i, 10.5 + i) for i in range(100)]
    store, why2 = store.add(busy)
    sizes = {key: len(b) for key, b in store.buckets}
    assert sizes == {("colocated", 1, 23): 5, ("colocated", 3, 28): BUCKET_SAMPLES}
    assert not why and not why2
    newest = dict(store.buckets)[("colocated", 3, 28)]
    assert newest[0][2] == pytest.approx(0.5) and len(newest) == BUCKET_SAMPLES


def test_a_non_physical_decode_fit_is_rejected_and_the_previous_step_kept(prof8b: Prof) -> None:
    hw, _ = prof8b
    first = fit_hardware(hw, [], iterations=_spans(hw, "colocated", [1, 2, 4, 8], [4000.0, 16000.0] * 2))
    # the step falls as the KV read grows: a negative per-sequence cost
    falling, t = [], 1e5
    for r in _spans(hw, "decode", [1, 2, 4, 8, 16], [4000.0, 16000.0, 30000.0] * 2):
        wall = r.steps * (0.02 - 2e-9 * r.context_tokens)
        falling.append(replace(r, start_s=t, end_s=t + wall))
        t += wall
    out = fit_hardware(first, [], iterations=falling)
    assert (out.b0, out.b2, out.b_e) == (first.b0, first.b2, first.b_e)
    assert out.rejected[Rejection.NON_PHYSICAL_FIT] == 1
    assert refit_decode(out) == (out, False)


def test_candidates_outside_the_fitted_range_are_flagged_and_need_more_saving(prof8b: Prof, cfg8b: RunConfig) -> None:
    hw, wl = prof8b
    fitted = replace(hw, decode_measured=(1.0, 10.5, 1000.0, 1e6))
    d = decide(8, 64, fitted, wl, cfg8b.policy)
    flags = {c.allocation.label: c.extrapolated for c in d.candidates}
    # decode batch B / N_D: 64 / 5 = 12.8 within 10.5 x 1.25 = 13.1; 64 / 4 = 16 past it
    assert flags["coloc"] is False and flags["3P5D"] is False
    assert flags["4P4D"] is True and flags["6P2D"] is True
    assert d.to_dict()["candidates"][4]["extrapolated"] is True  # type: ignore[index]
    assert not any(c.extrapolated for c in decide(8, 64, hw, wl, cfg8b.policy).candidates)  # nothing fitted yet
    # from 3P5D to the best (extrapolated) split: the ratio threshold plus the margin
    cur = next(c for c in d.candidates if c.allocation.label == "3P5D")
    best = next(c for c in d.candidates if c.allocation == d.best)
    assert best.extrapolated and cur.feasible
    saving = (cur.makespan_s - best.makespan_s) / cur.makespan_s
    pol = cfg8b.policy.model_copy(update={"ratio_switch_threshold": saving - EXTRAPOLATION_MARGIN / 2})
    held = decide(8, 64, fitted, wl, pol, Allocation.disaggregated(3, 5))
    assert held.target == Allocation.disaggregated(3, 5) and "4P4D is extrapolated" in held.reason
    moved = decide(8, 64, hw, wl, pol, Allocation.disaggregated(3, 5))  # not fitted: no margin
    assert moved.target == best.allocation


def test_a_worker_that_served_requests_but_logged_no_iteration_keeps_the_decode_fit(prof30b: Prof) -> None:
    """The window's iterations miss a worker that served requests: they are not used, the reason
    is counted once per such worker and the sample store and decode step stay as they were."""
    hw, _ = prof30b
    first = fit_hardware(hw, [], iterations=_spans(replace(hw, b2=hw.b2 * 0.5), "colocated", [1, 2, 4, 8],
                                                   [2000.0, 8000.0, 16000.0, 30000.0]))
    assert first.b2 == pytest.approx(hw.b2 * 0.5, rel=1e-6)
    slower = _spans(replace(hw, b2=hw.b2 * 2.0), "colocated", [1, 2, 4, 8], [2000.0, 8000.0, 16000.0, 30000.0],
                    t0=1e4)  # all logged by w0
    served = [TelemetryRecord(f"t{i}", 1, 3000, 0, 200, prefill_s=0.2, decode_s=4.0, decode_concurrency=4.0,
                              worker_id=w) for i, w in enumerate(("w0", "w1", "w2"))]
    heard = fit_hardware(first, served[:1], iterations=slower)
    assert heard.b2 > 2.0 * first.b2 and heard.rejected.total == 0  # the window moves the fit
    silent = fit_hardware(first, served, iterations=slower)
    assert silent.rejected.to_dict() == {Rejection.SILENT_WORKER.value: 2}
    assert silent.decode_samples == first.decode_samples
    assert (silent.b0, silent.b_e, silent.b2) == pytest.approx((first.b0, first.b_e, first.b2), rel=1e-12)
    assert silent.decode_measured == first.decode_measured
