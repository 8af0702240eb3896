"""Bad telemetry is screened out with a counted reason and the previous fit kept; the decision
never acts on a NaN or non-positive prediction (``telemetry`` module docstring; ``decision``
module docstring, 7.)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from pearl.config import RunConfig
from pearl.core.decision import Allocation, CandidateTable, decide, evaluate_table
from pearl.core.profile import HardwareProfile, TelemetryRecord, WorkloadProfile, fit_hardware, fit_workload
from pearl.core.telemetry import IterationRecord, Rejection, screen_iterations

Prof = tuple[HardwareProfile, WorkloadProfile]


def _clean(n_traj: int = 12, workers: int = 3) -> list[TelemetryRecord]:
    """Whole colocated trajectories of 1..4 turns on ``workers`` workers."""
    recs = []
    for t in range(n_traj):
        turns = 1 + t % 4
        for k in range(1, turns + 1):
            prompt = 2000 * k
            recs.append(TelemetryRecord(f"t{t}", k, prompt, 0 if k == 1 else prompt - 1500, 200 + 10 * t,
                                        prefill_s=0.05 + 1e-5 * prompt, decode_s=2.0 + 0.1 * t, env_s=3.0 + t,
                                        decode_concurrency=4.0, worker_id=f"w{t % workers}", final=k == turns))
    return recs


def _with(bad: TelemetryRecord) -> list[TelemetryRecord]:
    return [*_clean(), bad]


def test_each_bad_request_record_is_rejected_with_its_reason_and_the_fit_is_unchanged(prof8b: Prof) -> None:
    hw, wl = prof8b
    good_hw, good_wl = fit_hardware(hw, _clean()), fit_workload(wl, _clean())
    base = TelemetryRecord("x", 1, 3000, 0, 300, prefill_s=0.1, decode_s=3.0, worker_id="w0")
    cases = {
        Rejection.NON_FINITE: replace(base, decode_s=math.nan),
        Rejection.NEGATIVE_DURATION: replace(base, prefill_s=-0.2),
        Rejection.BAD_TOKENS: replace(base, cached_tokens=4000),
    }
    for reason, bad in cases.items():
        fh, fw = fit_hardware(hw, _with(bad)), fit_workload(wl, _with(bad))
        assert fh == good_hw and fw == good_wl, reason
        assert fh.rejected.to_dict() == fw.rejected.to_dict() == {reason.value: 1}


def test_a_request_served_in_no_time_teaches_no_cost_but_its_tokens_count(prof8b: Prof) -> None:
    hw, wl = prof8b
    zero = TelemetryRecord("z", 1, 3000, 0, 300, worker_id="w0", final=True)
    fh = fit_hardware(hw, _with(zero))
    assert fh == fit_hardware(hw, _clean())
    assert fh.rejected[Rejection.ZERO_DURATION] == 1
    fw = fit_workload(wl, _with(zero))
    assert fw.rejected.total == 0 and fw != fit_workload(wl, _clean())  # its prompt and output are workload


def test_overflowing_telemetry_is_a_non_physical_fit_and_the_previous_profile_is_kept(prof8b: Prof) -> None:
    hw, wl = prof8b
    prev_hw, prev_wl = fit_hardware(hw, _clean()), fit_workload(wl, _clean())
    huge = [replace(r, decode_s=1e308, env_s=1e308) for r in _clean()]
    fh, fw = fit_hardware(prev_hw, huge), fit_workload(prev_wl, huge)
    assert fh == prev_hw and fw == prev_wl
    assert fh.rejected[Rejection.NON_PHYSICAL_FIT] == 1 and fw.rejected[Rejection.NON_PHYSICAL_FIT] == 1
    assert all(math.isfinite(v) and v >= 0 for v in (fh.a0, fh.a1, fh.b0, fh.b2))


def test_rejections_accumulate_over_windows(prof8b: Prof) -> None:
    hw, _wl = prof8b
    nan = TelemetryRecord("x", 1, 3000, 0, 300, decode_s=math.nan)
    neg = TelemetryRecord("y", 1, 3000, 0, 300, decode_s=-1.0)
    out = fit_hardware(fit_hardware(fit_hardware(hw, [nan]), _clean()), [nan, neg])
    assert out.rejected.to_dict() == {"negative_duration": 1, "non_finite": 2}


def test_a_silent_worker_keeps_the_previous_tail_statistics(prof8b: Prof) -> None:
    _hw, wl = prof8b
    first = fit_workload(wl, _clean())
    assert first.tail_factor is not None and first.tail_paths
    shifted = [replace(r, env_s=r.env_s * 3.0 if r.traj_id == "t11" else r.env_s) for r in _clean()]
    heard = fit_workload(first, shifted, serving={"w0", "w1", "w2"})
    silent = fit_workload(first, shifted, serving={"w0", "w1", "w2", "w3"})
    assert heard.tail_factor != first.tail_factor and heard.rejected.total == 0
    assert silent.rejected.to_dict() == {"silent_worker": 1}
    assert (silent.tail_factor, silent.tail_paths, silent.tail_by_load) == (
        first.tail_factor, first.tail_paths, first.tail_by_load)
    assert silent.env_s == heard.env_s  # the per-turn statistics are still learned
    none_heard = fit_workload(first, [], serving={"w0", "w1"})  # every serving worker silent: nothing learned
    assert none_heard.rejected.to_dict() == {"silent_worker": 2}
    assert replace(none_heard, rejected=first.rejected) == first


def _it(worker: str, start: float, end: float, **kw: object) -> IterationRecord:
    fields: dict[str, object] = {"role": "decode", "batch": 8, "context_tokens": 8 * 4000.0, "new_tokens": 0,
                                 "start_s": start, "end_s": end}
    fields.update(kw)
    return IterationRecord(worker, **fields)  # type: ignore[arg-type]


def test_iteration_records_with_clocks_going_backwards_or_no_time_are_rejected() -> None:
    recs = [
        _it("w0", 0.0, 1.0),
        _it("w0", 1.0, 2.0),
        _it("w0", 1.5, 2.5),  # starts before w0's previous iteration ended
        _it("w1", 0.5, 0.4),  # ends before it starts
        _it("w1", 3.0, 3.0),  # no time
        _it("w1", 3.0, 4.0, context_tokens=math.nan),
        _it("w1", 4.0, 5.0, batch=-1),
        _it("w1", 5.0, 6.0),
        _it("w0", 2.0, 3.0),
    ]
    kept, why = screen_iterations(recs)
    assert [(r.worker_id, r.start_s) for r in kept] == [("w0", 0.0), ("w0", 1.0), ("w1", 5.0), ("w0", 2.0)]
    assert dict(why) == {Rejection.CLOCK_BACKWARDS: 2, Rejection.ZERO_DURATION: 1, Rejection.NON_FINITE: 1,
                         Rejection.BAD_TOKENS: 1}


def _table_with(table: CandidateTable, coloc: float, splits: dict[int, float]) -> CandidateTable:
    ms = table.makespan_s.copy()
    for n_p, v in splits.items():
        ms[n_p - int(table.n_prefill[0])] = v
    return CandidateTable(table.n_workers, table.batch, coloc, table.n_prefill, ms, table.prefill_ok, table.kv_ok,
                          table.kv_demand, table.kv_capacity, table.cache_ok, table.cache_demand)


def test_a_nan_or_negative_split_is_never_chosen(prof8b: Prof, cfg8b: RunConfig) -> None:
    hw, wl = prof8b
    pol = cfg8b.policy
    clean = decide(8, 64, hw, wl, pol)
    assert clean.target == Allocation.disaggregated(4, 4)

    def broken(n: int, b: int, h: HardwareProfile, w: WorkloadProfile, p: object, cw: float | None = None) -> CandidateTable:
        return _table_with(evaluate_table(n, b, h, w, pol, cw), clean.table.coloc_s, {4: math.nan, 3: -5.0})

    d = decide(8, 64, hw, wl, pol, evaluator=broken)
    assert d.target not in (Allocation.disaggregated(4, 4), Allocation.disaggregated(3, 5))
    assert math.isfinite(d.predicted_makespan_s) and d.predicted_makespan_s > 0
    reasons = {c.allocation.label: c.reason for c in d.candidates}
    assert "is not a positive number" in reasons["4P4D"] and "is not a positive number" in reasons["3P5D"]


def test_a_current_allocation_with_a_nan_prediction_is_held(prof8b: Prof, cfg8b: RunConfig) -> None:
    hw, wl = prof8b
    pol = cfg8b.policy

    def broken(n: int, b: int, h: HardwareProfile, w: WorkloadProfile, p: object, cw: float | None = None) -> CandidateTable:
        return _table_with(evaluate_table(n, b, h, w, pol, cw), math.nan, {})

    d = decide(8, 64, hw, wl, pol, Allocation.colocated(8), evaluator=broken)
    assert d.target == Allocation.colocated(8) and not d.switched
    assert "not a positive number" in d.reason


def test_profiles_that_predict_nan_everywhere_hold_the_current_allocation(prof8b: Prof, cfg8b: RunConfig) -> None:
    hw, wl = prof8b
    bad = replace(hw, a0=math.nan)
    t = evaluate_table(8, 64, bad, wl, cfg8b.policy)
    assert np.isnan(t.coloc_s) and not t.feasible.any() and t.best_index() is None
    held = decide(8, 64, bad, wl, cfg8b.policy, Allocation.disaggregated(2, 6))
    assert held.target == Allocation.disaggregated(2, 6) and not held.switched
    assert "no candidate has a positive finite predicted makespan" in held.reason
    first = decide(8, 64, bad, wl, cfg8b.policy)
    assert first.target == Allocation.colocated(8)
    assert first.to_dict()["telemetry_rejected"] == {"hardware": {}, "workload": {}}
