"""Replays through the real Controller (emulated engine, virtual time) on a short, small segment."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pearl.config import load_config
from pearl.sim.cli import main
from pearl.sim.simulate import run_simulation
from pearl.sim.systems import SYSTEMS, apply_system
from pearl.sim.traces import Trace, gpu_timeline
from tests.conftest import SHIPPED_TRACE

SMALL = {"workload.batch_size": 16, "workload.max_trajectory_tokens": 8192}
B = 16


@pytest.fixture(scope="module")
def result() -> dict[str, Any]:
    cfg = load_config("qwen3-8b-h200", SMALL)
    tl = gpu_timeline(Trace("t", 120.0, (0, 4, 4, 2, 2, 6, 6, 6)), cfg.cluster)
    return run_simulation(cfg, tl, [SYSTEMS[s] for s in ("roll", "roll-large", "rlboost+", "pearl")])


def test_summary_fields(result: dict[str, Any]) -> None:
    for s in result["systems"].values():
        for k in ("trajectories_per_hour", "rollout_steps", "train_steps", "gpu_hours", "cost_per_1k_trajectories",
                  "reconfigurations", "makespan_prediction_error"):
            assert k in s
        assert s["rollout_steps"] >= 2 and s["train_steps"] >= 1
        assert s["trajectories_per_hour"] > 0
        assert set(s["gpu_hours"]) >= {"reserved", "preemptible", "borrowed", "training"}
        # whole batches per hour: B * rollout_steps up to the last whole batch's end, which is
        # before the segment's end, so at least the whole batches' share of the counted figure
        assert s["batch_rate_per_hour"] * (1 + 1e-9) >= B * s["rollout_steps"] / (960.0 / 3600)
        assert set(s["router_moves"]) == {"slack", "cost"} and s["placement_slack"] >= 0


def test_nothing_lost(result: dict[str, Any]) -> None:
    for name, s in result["systems"].items():
        admitted = B * (s["rollout_steps"] + (1 if s["trajectories_in_flight"] else 0))
        total = s["trajectories_completed"] + s["trajectories_in_flight"] + s["trajectories_failed"]
        assert total == admitted, name
        assert s["trajectories_failed"] == 0, name
        assert s["trajectories_trained"] <= B * s["rollout_steps"]


def test_roll_is_fixed(result: dict[str, Any]) -> None:
    r = result["systems"]["roll"]
    assert r["gpu_hours"]["preemptible"] == 0 and r["gpu_hours"]["borrowed"] == 0
    assert "borrow" not in r["reconfigurations"] and "expansion_started" not in r["reconfigurations"]
    assert set(r["role_hours"]) <= {"colocated", "idle"}
    hours = result["meta"]["duration_s"] / 3600
    assert r["gpu_hours"]["reserved"] == pytest.approx(4 * hours, rel=0.02)


def test_roll_large_pool(result: dict[str, Any]) -> None:
    r = result["systems"]["roll-large"]
    pool = 4 + round(result["meta"]["mean_preemptible_gpus"])
    assert r["fixed_pool"] == pool
    assert r["gpu_hours"]["reserved"] == pytest.approx(pool * result["meta"]["duration_s"] / 3600, rel=0.02)
    assert r["gpu_hours"]["preemptible"] == 0


def test_rlboost_uses_everything_colocated(result: dict[str, Any]) -> None:
    r = result["systems"]["rlboost+"]
    assert r["gpu_hours"]["preemptible"] > 0
    assert r["reconfigurations"].get("borrow", 0) >= 1 and r["gpu_hours"]["borrowed"] > 0
    assert "prefill" not in r["role_hours"] and "decode" not in r["role_hours"]
    assert "mode_switch" not in r["reconfigurations"]


def test_each_batch_names_the_allocations_it_ran_under(result: dict[str, Any]) -> None:
    """``batch_allocations``: per predicted batch, the allocation in force at its start and end."""
    roll = result["systems"]["roll"]
    assert roll["batch_allocations"] == [["coloc/4", "coloc/4"]] * len(roll["batch_makespans_s"])
    r = result["systems"]["rlboost+"]
    assert len(r["batch_allocations"]) == len(r["batch_makespans_s"]) >= 2
    assert {a for pair in r["batch_allocations"] for a in pair} > {"coloc/4"}  # it grew on the grants


def test_a_batch_closes_the_loop_on_the_configurations_it_ran(result: dict[str, Any]) -> None:
    """A pool that grew and shrank back mid-batch ends on the allocation it started on but did not
    run it throughout (``batch_one_configuration`` false); the closed loop takes such a batch as the
    pieces it ran (``pearl.core.makespan_correction``), each batch once."""
    rlb = result["systems"]["rlboost+"]
    pairs = list(zip(rlb["batch_allocations"], rlb["batch_one_configuration"], rlb["batch_closed_loop"], strict=True))
    assert any(a == b and not one and closed for (a, b), one, closed in pairs)  # this segment's grant, then reclaim
    for name, s in result["systems"].items():
        assert all(closed for one, closed in zip(s["batch_one_configuration"], s["batch_closed_loop"], strict=True)
                   if one), name
        assert not any(one for (a, b), one in zip(s["batch_allocations"], s["batch_one_configuration"], strict=True)
                       if a != b), name
        assert s["closed_loop_batches"] == sum(s["batch_closed_loop"]), name
    assert all(result["systems"]["roll"]["batch_one_configuration"])


def test_pearl_uses_preemptible(result: dict[str, Any]) -> None:
    p = result["systems"]["pearl"]
    assert p["gpu_hours"]["preemptible"] > 0
    assert p["reconfigurations"].get("shrink", 0) >= 1  # the trace drops 4 -> 2


def test_gate_decisions_are_counted_per_gate_and_outcome(result: dict[str, Any]) -> None:
    """``gates``: every borrow / expansion / switch decision of the run by outcome; the borrows it
    admits are the borrows it made. RLBoost+ runs ungated, ROLL never asks."""
    from pearl.core.gate import GateOutcome

    names = {o.value for o in GateOutcome}
    assert result["systems"]["roll"]["gates"] == {}
    rlb = result["systems"]["rlboost+"]["gates"]
    assert set(rlb["borrow"]) <= {"ungated", "no_speedup", "window_too_short", "batch_ends_first"}
    assert rlb["borrow"].get("ungated", 0) == result["systems"]["rlboost+"]["reconfigurations"]["borrow"]
    pearl = result["systems"]["pearl"]
    assert set(pearl["gates"]) <= {"borrow", "expansion", "switch", "schedule"} and "borrow" in pearl["gates"]
    for per in pearl["gates"].values():
        assert set(per) <= names and "ungated" not in per
    assert pearl["gates"]["borrow"].get("admitted", 0) == pearl["reconfigurations"].get("borrow", 0)
    # with 64 trajectories on the 4 reserved workers (2 preemptible GPUs at times) borrowing pays
    # at least once: the admitted decisions are the borrows made (B = 16 above leaves the pool at
    # its latency floor: r ~ 1). With 4-6 preemptible GPUs the 8K-token batch of 64 is near its
    # floor too (r = 1.02-1.05) and the gate declines every borrow; this timeline offers at most 2.
    cfg = load_config("qwen3-8b-h200", {**SMALL, "workload.batch_size": 64})
    tl = gpu_timeline(Trace("t", 120.0, (0, 0, 2, 2, 0, 0, 2, 2)), cfg.cluster)
    big = run_simulation(cfg, tl, [SYSTEMS["pearl"]])["systems"]["pearl"]
    assert big["gates"]["borrow"].get("admitted", 0) >= 1
    assert big["gates"]["borrow"]["admitted"] == big["reconfigurations"]["borrow"]
    assert big["gates"]["expansion"].get("admitted", 0) == big["reconfigurations"].get("expansion_started", 0)
    for per in big["gates"].values():
        assert set(per) <= names and "ungated" not in per


def test_series_for_report(result: dict[str, Any]) -> None:
    for s in result["series"].values():
        assert s["completions"] == sorted(s["completions"])
        assert all(c in {"prefill", "decode", "colocated", "idle", "borrowed"} for *_x, c in s["timeline"])
        assert s["budget"][0] == [0.0, 0]


def test_apply_system_knobs() -> None:
    cfg = load_config("qwen3-8b-h200")
    c = apply_system(cfg, SYSTEMS["rlboost+"])
    assert (c.policy.use_preemptible, c.policy.borrow_enabled, c.policy.allow_disaggregation,
            c.policy.gate_enabled) == (True, True, False, False)
    c = apply_system(cfg, SYSTEMS["roll-large"], fixed_pool=12)
    assert c.cluster.reserved_gpus == 12 and c.cluster.max_preemptible_gpus == 0


def test_cli_json_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tr = tmp_path / "t.csv"
    tr.write_text("time_s,available\n0,0\n120,4\n480,4\n")
    rc = main(["simulate", "--config", "qwen3-8b-h200", "--trace", str(tr), "--hours", "0.15",
               "--systems", "roll,oracle", "--json", "--set", "workload.batch_size=16",
               "--set", "workload.max_trajectory_tokens=8192",
               "--set", "workload.system_prompt_tokens=2048", "--set", "workload.turns.mean=8"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"systems", "wall_s"} and set(out["systems"]) == {"roll", "oracle"}
    plan = out["systems"]["oracle"]["oracle_plan"]
    # the plan covers the segment: 4 workers, then 8 once the grant's workers are ready (120 + 76 s)
    assert [iv[2] for iv in plan["intervals"]] == [4, 8] and plan["intervals"][1][0] == 196.0
    assert plan["planned_switches"] >= 0 and plan["planned_trajectories"] > 0


def test_cli_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("time_s,available\n0,x\n")
    assert main(["simulate", "--trace", str(bad), "--json"]) == 2
    err = capsys.readouterr().err
    assert "bad.csv" in err and "line 2" in err
    good = tmp_path / "g.csv"
    good.write_text("time_s,available\n0,1\n7200,1\n")
    assert main(["simulate", "--trace", str(good), "--systems", "roll,nope", "--json"]) == 2
    assert "unknown system 'nope'" in capsys.readouterr().err


def test_cli_paper_matched_segment(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--segment like-10: the window matched to the paper's segment with a 10-GPU ROLL-Large pool
    (6 preemptible GPUs on average next to the 4 reserved); a trace too short for three disjoint
    windows is refused with the reason."""
    assert main(["simulate", "--trace", str(SHIPPED_TRACE), "--segment", "like-10", "--hours", "0.25",
                 "--systems", "roll", "--json"]) == 0
    meta = json.loads(capsys.readouterr().out)["meta"]
    assert meta["mean_preemptible_gpus"] == pytest.approx(6.0)  # the shipped trace has such a window
    short = tmp_path / "short.csv"
    short.write_text("time_s,available\n0,1\n3600,8\n")
    assert main(["simulate", "--trace", str(short), "--segment", "like-14", "--hours", "1", "--json"]) == 2
    assert "no 1.0 h window left for segment 'like-12'" in capsys.readouterr().err


def test_piecewise_prediction_follows_the_allocations_in_force() -> None:
    from pearl.sim.simulate import _piecewise_error

    def rp(t: float, m: float) -> dict[str, object]:
        return {"t": t, "kind": "replan", "decision": {"label": "coloc", "n_workers": 4, "predicted_makespan_s": m}}

    # batch [100, 400]: 100 s at a 400-s allocation (1/4 done), then a 200-s one: 3/4 x 200 = 150 s more
    raw = {"history": [rp(0.0, 400.0), rp(200.0, 200.0)], "batch_ends": [400.0], "batch_makespans": [300.0]}
    err, n = _piecewise_error(raw)
    assert n == 1 and err == pytest.approx(abs(250.0 - 300.0) / 300.0, abs=1e-4)
    # a batch that ends before its predicted progress reaches 1 is extrapolated at the last rate
    raw = {"history": [rp(0.0, 600.0)], "batch_ends": [300.0], "batch_makespans": [300.0]}
    assert _piecewise_error(raw) == (pytest.approx(1.0), 1)
    # ... at the *last* allocation's rate: 100 s of 400 (1/4) + 200 s of 800 (1/4), then 1/2 x 800
    raw = {"history": [rp(0.0, 400.0), rp(100.0, 800.0)], "batch_ends": [300.0], "batch_makespans": [300.0]}
    assert _piecewise_error(raw)[0] == pytest.approx(abs(700.0 - 300.0) / 300.0, abs=1e-4)
    assert _piecewise_error({"history": [], "batch_ends": [], "batch_makespans": []}) == (None, 0)


def test_placed_prediction_runs_a_grown_pool_at_its_sticky_share() -> None:
    from pearl.sim.simulate import _piecewise_error

    curve = [1000.0 / n for n in range(1, 21)]  # M_coloc(n) = 1000 / n

    def rp(t: float, n: int) -> dict[str, object]:
        return {"t": t, "kind": "replan", "decision": {"label": "coloc", "mode": "colocated", "n_workers": n,
                                                       "batch": 64, "predicted_makespan_s": 1000.0 / n,
                                                       "colocated_by_workers": curve[:n]}}

    # a batch starts on 4 workers (250 s), 125 s later the pool grows to 20: the batch keeps 64/10
    # per old worker (sticky_pool = 10), so the rest (1/2) runs at M(10) = 100 s, not M(20) = 50 s
    raw = {"history": [rp(0.0, 4), rp(125.0, 20)], "batch_ends": [175.0], "batch_makespans": [175.0],
           "placement_slack": 4}
    assert _piecewise_error(raw, placed=True) == (pytest.approx(0.0, abs=1e-4), 1)
    assert _piecewise_error(raw)[0] == pytest.approx(abs(150.0 - 175.0) / 175.0, abs=1e-4)
    # a shrink rebalances over the survivors: the placed prediction is the plain one
    raw = {"history": [rp(0.0, 4), rp(50.0, 2)], "batch_ends": [500.0], "batch_makespans": [500.0],
           "placement_slack": 4}
    assert _piecewise_error(raw, placed=True) == _piecewise_error(raw)
    # ... but growing back is sticky again: 64/2 = 32 per old worker > 64/4 + 4 * 2/4 = 18
    raw["history"] = [rp(0.0, 4), rp(50.0, 2), rp(100.0, 4)]
    # plain: 0.2 + 0.1 done at 100 s, 0.7 x 250 = 175 s more; placed: M(64/18) = 281.25 s
    assert _piecewise_error(raw)[0] == pytest.approx(abs(275.0 - 500.0) / 500.0, abs=1e-4)
    assert _piecewise_error(raw, placed=True)[0] == pytest.approx(abs(100.0 + 0.7 * 281.25 - 500.0) / 500.0,
                                                                  abs=1e-4)
