"""Report folder and the GPU ledger, on hand-made data (no runtime needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pearl.config import PricesSpec
from pearl.sim.metrics import GpuLedger, category_of, cost_usd
from pearl.sim.replay_report import throughput_curve, write_report


def state(workers: list[tuple[str, list[str], str, str]], gpus: list[tuple[str, str, bool]]) -> dict:
    return {
        "gpus": [{"gpu_id": g, "zone": z, "lent": lent} for g, z, lent in gpus],
        "workers": [{"worker_id": w, "gpus": gs, "role": r, "status": s} for w, gs, r, s in workers],
    }


def test_category_of() -> None:
    st = state(
        [("w0", ["r0"], "prefill", "active"), ("w1", ["s0"], "decode", "initializing"),
         ("w2", ["t0"], "colocated", "active")],
        [("r0", "reserved", False), ("r1", "reserved", False), ("s0", "preemptible", False),
         ("t0", "overlap", True), ("t1", "overlap", False)],
    )
    assert category_of(st) == {
        "r0": ("reserved", "prefill"), "r1": ("reserved", "idle"), "s0": ("preemptible", "idle"),
        "t0": ("overlap", "borrowed"),
    }


def test_ledger_integrates_and_segments() -> None:
    led = GpuLedger()
    led.observe(0.0, {"r0": ("reserved", "colocated")})
    led.observe(10.0, {"r0": ("reserved", "colocated"), "s0": ("preemptible", "idle")})
    led.observe(30.0, {"r0": ("reserved", "decode"), "s0": ("preemptible", "prefill")})
    led.close(40.0)
    assert led.gpu_s == {"reserved": 40.0, "preemptible": 30.0, "borrowed": 0.0}
    assert led.role_s == {"colocated": 30.0, "idle": 20.0, "decode": 10.0, "prefill": 10.0}
    assert sorted(led.segments) == sorted([
        ["r0", 0.0, 30.0, "colocated"], ["r0", 30.0, 40.0, "decode"],
        ["s0", 10.0, 30.0, "idle"], ["s0", 30.0, 40.0, "prefill"],
    ])


def test_cost() -> None:
    p = PricesSpec(reserved=10.0, preemptible=2.0, overlap=10.0)
    assert cost_usd({"reserved": 1.0, "preemptible": 3.0, "training": 2.0, "borrowed": 5.0}, p) == 36.0


def test_throughput_curve() -> None:
    xs, ys = throughput_curve([100.0 * i for i in range(1, 37)], 3600.0, window_s=1200.0, step_s=600.0)
    assert xs[-1] == 1.0 and ys[-1] == pytest.approx(36.0)


def test_write_report(tmp_path: Path) -> None:
    summary = {"trajectories_per_hour": 100.0, "rollout_steps": 3, "train_steps": 2,
               "gpu_hours": {"reserved": 4.0}, "cost_per_1k_trajectories": 12.0,
               "reconfigurations": {"expand": 1}, "makespan_prediction_error": 0.05}
    series = {"completions": [60.0, 120.0], "timeline": [["r0", 0.0, 100.0, "colocated"]],
              "modes": [[0.0, "coloc"], [50.0, "2P2D"]], "budget": [[0.0, 0], [60.0, 4]]}
    gated = {**summary, "gates": {"borrow": {"admitted": 3, "saving_below_cost": 2}, "expansion": {"admitted": 1}}}
    result = {"systems": {"roll": summary, "pearl": gated}, "series": {"roll": series, "pearl": series},
              "meta": {"duration_s": 200.0, "config": "c", "trace": "t"}, "wall_s": 1.0}
    md = write_report(result, tmp_path / "rep")
    text = md.read_text()
    assert "| pearl | 100 | 1.00x |" in text
    assert "- **pearl**: borrow admitted: 3, saving_below_cost: 2; expansion admitted: 1" in text
    assert "- **roll**: borrow" not in text  # no gate decisions, no line
    for f in ("throughput.png", "modes.png", "timeline-roll.png", "timeline-pearl.png"):
        assert (tmp_path / "rep" / f).stat().st_size > 1000
