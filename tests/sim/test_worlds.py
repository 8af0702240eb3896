"""The worlds sweep (``pearl.sim.worlds``, ``pearl.sim.worlds_report``): the design, the bad input,
one world end to end, the systems a fixed pool makes identical, and the summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pearl.sim import worlds as W
from pearl.sim import worlds_report as R
from pearl.sim.cli import main as sim_main

#: a small world that runs in a few CPU seconds
SMALL = W.WorldParams(id="s", model="qwen3-8b", gpus=4, batch=32, limit=16384, turns=10, tool_s=1.0)


def test_the_design_fills_each_axis_and_is_seeded() -> None:
    a, b = W.draw_worlds(20, seed=3), W.draw_worlds(20, seed=3)
    assert a == b and a != W.draw_worlds(20, seed=4)
    assert len({w.id for w in a}) == 20
    # a Latin hypercube: every fifth of each continuous axis holds 4 of the 20 worlds
    for d in W.SPACE:
        if d.choices:
            assert {getattr(w, d.name) for w in a} == set(d.choices)
            continue
        import math

        def cell(v: float, d: W.Dim = d) -> int:
            lo, hi, x = (math.log(d.lo), math.log(d.hi), math.log(v)) if d.log else (d.lo, d.hi, v)
            return min(int(5 * (x - lo) / (hi - lo)), 4)

        counts = [sum(cell(float(getattr(w, d.name))) == c for w in a) for c in range(5)]
        assert all(3 <= k <= 5 for k in counts), (d.name, counts)  # rounding may move a world across a cell edge
    assert all(w.batch % 8 == 0 and 4 <= w.gpus <= 64 for w in a)


def test_a_bad_world_is_an_error_naming_what_is_wrong() -> None:
    with pytest.raises(W.WorldError, match="gpus: Input should be less than or equal to 64"):
        W.parse_world("gpus=65")
    with pytest.raises(W.WorldError, match="colour"):
        W.parse_world("colour=red")
    with pytest.raises(W.WorldError, match="not key=value"):
        W.parse_world("gpus")
    with pytest.raises(W.WorldError, match="hardware 'tpu_v5' is not in the sweep's cost database systems"):
        W.world_config(W.parse_world("hardware=tpu_v5"))
    with pytest.raises(W.WorldError, match="batch 36 is not a multiple"):
        W.world_config(W.parse_world("batch=36"))


def test_a_world_config_is_the_paper_workload_on_the_worlds_pool() -> None:
    cfg, phys = W.world_config(W.parse_world("hardware=b200_sxm,model=qwen3-30b-a3b,gpus=12,batch=96,limit=65536,"
                                             "tool_s=3,host_cpu_factor=1.5"))
    assert cfg.hardware.name == "b200_sxm" and cfg.model.name == "qwen3-30b-a3b"
    assert cfg.cluster.reserved_gpus == 12 and cfg.cluster.max_preemptible_gpus == 0
    assert not cfg.policy.borrow_enabled and cfg.workload.batch_size == 96
    assert cfg.workload.max_trajectory_tokens == 65536 <= cfg.model.max_context
    assert cfg.workload.env_step_s.mean == 3.0 and phys.host_cpu_factor == 1.5
    short, _ = W.world_config(W.parse_world("limit=9216"))
    assert short.workload.system_prompt_tokens == 3072 and short.workload.shared_prompt_tokens <= 1536


def test_one_world_end_to_end_and_the_systems_a_fixed_pool_makes_identical() -> None:
    r = W.run_world(SMALL, batches=2, top_k=1)
    assert set(r["systems"]) == {"pearl", "rlboost+", "static-pd", "pearl-coloc"}
    best = r["best_static"]
    assert best["makespan_s"] == min(v["makespan_s"] for v in r["static"].values() if not v["failed"])
    assert r["pearl_regret"] == pytest.approx(r["systems"]["pearl"]["makespan_s"] / best["makespan_s"] - 1, abs=1e-4)
    assert r["systems"]["pearl"]["trajectories"] == 2 * 32
    # rlboost+ (always colocated, ungated) and static-pd (its split forced from the start) on this
    # fixed pool with borrowing off are the static runs they report: run as systems, the same
    cfg, phys = W.world_config(SMALL)
    rlboost = W.measure(cfg, phys, 2, None, {"allow_disaggregation": False, "gate_enabled": False})
    assert rlboost["makespans_s"] == W.measure(cfg, phys, 2, "coloc")["makespans_s"]
    assert r["systems"]["rlboost+"]["makespan_s"] == r["static"]["coloc"]["makespan_s"] == rlboost["makespan_s"]
    pd = r["systems"]["static-pd"]
    if "same_as" in pd:
        label = pd["same_as"].split(":")[1]
        forced = W.measure(cfg, phys, 2, None, {"force_disaggregation": True, "allocation_overrides": {4: label}})
        assert forced["makespans_s"] == W.measure(cfg, phys, 2, label)["makespans_s"]


def test_the_climb_finds_the_exhaustive_best_in_a_world_it_searches_whole() -> None:
    r = W.run_world(SMALL.model_copy(update={"id": "x"}), batches=1, top_k=1, exhaustive=True)
    assert set(r["static"]) == {"coloc", "1P3D", "2P2D", "3P1D"}
    assert isinstance(r["climb_agrees"], bool)
    if r["climb_agrees"]:
        assert r["static"][r["climb"]]["makespan_s"] == r["best_static"]["makespan_s"]


def test_the_summary_counts_modes_losses_and_separation() -> None:
    def world(i: int, best: str, m: float, pearl: float, batch: int) -> dict:
        mode = "colocated" if best == "coloc" else "split"
        return {"id": f"w{i}", "params": {"gpus": 8, "batch": batch, "limit": 32768, "hardware": "h200_sxm",
                                          "model": "qwen3-8b", "paper": ""},
                "best_static": {"allocation": best, "makespan_s": m, "mode": mode},
                "systems": {"pearl": {"makespan_s": pearl}, "rlboost+": {"makespan_s": m * 1.1},
                            "static-pd": {"makespan_s": m * 1.05}, "pearl-coloc": {"makespan_s": m * 1.1}},
                "pearl_regret": pearl / m - 1}

    res = [world(0, "coloc", 100, 100, 256), world(1, "3P5D", 100, 101, 32), world(2, "2P6D", 100, 104, 48),
           {"id": "bad", "params": {}, "error": "world bad: no allocation"}]
    s = R.summarize(res)
    assert s["ran"] == 3 and s["errors"] == [{"id": "bad", "error": "world bad: no allocation"}]
    assert s["best_mode"] == {"colocated": 1, "split": 2, "split_prefill_shares": {"0.25": 1, "0.38": 1}}
    assert s["pearl_regret"]["worst"] == pytest.approx(0.04) and s["pearl_regret"]["worst_world"] == "w2"
    assert s["pearl_regret"]["median"] == pytest.approx(0.01)
    assert s["loss"]["rlboost+"]["mean"] == pytest.approx(0.1)
    assert s["separation_auc"]["batch"] == 0.0  # the split worlds are the small batches: perfect separation
    md = R.markdown(res, s, "python -m pearl experiments worlds")
    assert "| pearl | +1.67 % | +4.00 % (w2) | 67 % |" in md and "error: world bad" in md


def test_the_command_writes_the_json_table_and_picture_and_reports_bad_worlds(tmp_path: Path,
                                                                             capsys: pytest.CaptureFixture[str]) -> None:
    docs = tmp_path / "EXPERIMENTS.md"
    docs.write_text("# Experiments\n\n## Fig. 5\n\nold\n\n## Worlds\n\nstale\n\n## Table 3\n\nkept\n")
    rc = sim_main(["experiments", "worlds", "--worlds", "0", "--no-paper", "--batches", "1", "--top-k", "1",
                   "--world", "gpus=4,batch=32,limit=16384,turns=10", "--world", "hardware=tpu_v5",
                   "--out", str(tmp_path), "--docs", str(docs), "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert [w.get("error", "") != "" for w in out["worlds"]] == [False, True]
    assert "tpu_v5" in out["worlds"][1]["error"] and out["summary"]["ran"] == 1
    for name in ("worlds.json", "worlds.md", "worlds.png"):
        assert (tmp_path / name).is_file()
    text = docs.read_text()
    assert "stale" not in text and "## Worlds" in text and "kept" in text and "old" in text
    assert "![worlds: the best static mode and PEARL's regret](worlds.png)" in text
    assert sim_main(["experiments", "worlds", "--batches", "0"]) == 2


def test_a_world_where_no_allocation_can_hold_a_trajectory_is_an_error_naming_why(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU that keeps ~20K tokens of KV beside Qwen3-30B-A3B's 61 GB of weights, a 64K-token
    trajectory fits on no worker, whatever the allocation; on one whose memory does not even hold
    the weights, nothing runs. Both are errors that say so (no GPU of the space is this small:
    the world's config is cut down at that one seam)."""
    real = W.world_config

    def small_gpu(memory_gb: float):
        def config(p: W.WorldParams):
            cfg, phys = real(p)
            return cfg.model_copy(update={"hardware": cfg.hardware.model_copy(update={"memory_gb": memory_gb})}), phys
        return config

    p = W.parse_world("model=qwen3-30b-a3b,gpus=4,batch=32,limit=65536,turns=40")
    monkeypatch.setattr(W, "world_config", small_gpu(68.6))
    with pytest.raises(W.WorldError, match=r"no allocation of 4 workers completes its batches \(coloc: \d+ "
                                           r"trajectories failed"):
        W.run_world(p, batches=1, top_k=1)
    monkeypatch.setattr(W, "world_config", small_gpu(60.0))
    with pytest.raises(W.WorldError, match="do not fit"):
        W.run_world(p, batches=1, top_k=1)


def test_a_run_is_the_same_whatever_ran_before_it_in_the_process() -> None:
    """Paired seeds need determinism: the radix cache orders two accesses at one virtual instant by
    the order they happened in (not by where its nodes sit in memory), so a world measured after
    another, or twice, gives the same makespans."""
    cfg, phys = W.world_config(SMALL)
    first = W.measure(cfg, phys, 2, "coloc")["makespans_s"]
    W.run_world(SMALL.model_copy(update={"id": "other", "gpus": 5, "batch": 40}), batches=1, top_k=1)
    assert W.measure(cfg, phys, 2, "coloc")["makespans_s"] == first
