"""The calibration: targets, bounds, grid, scoring, the written file, the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pearl.engines.emulated_physics import EmulatorPhysics, PhysicsFile, load_physics
from pearl.sim import calibrate as cal
from pearl.sim.cli import main as sim_main


def test_targets_are_the_in_sample_list() -> None:
    names = [t.name for t in cal.TARGETS]
    assert names == ["rollout-share", "gpus-16-24", "gpus-24-32", "unlimited", "prefill-share", "prompt-token-share",
                     "bs32", "bs96",
                     "bs48-4P4D", "bs64-5P3D", *(f"fig7-{m}-{n}" for m in ("8b", "30b") for n in (4, 8, 12, 16))]
    by = {t.name: t for t in cal.TARGETS}
    assert by["fig7-8b-4"].paper == -0.206 and by["fig7-30b-4"].paper == -0.309
    assert by["fig7-8b-12"].paper == pytest.approx(0.1405) and by["fig7-8b-12"].sigma == pytest.approx(0.0225)
    assert by["bs96"].paper == -0.061 and by["prefill-share"].paper == 0.2648
    assert [t.name for t in cal.select_targets("fig7-30b,bs9")] == ["bs96", *(f"fig7-30b-{n}" for n in (4, 8, 12, 16))]
    with pytest.raises(cal.CalibrationError, match="unknown targets"):
        cal.select_targets("fig9")
    colocated = [t.name for t in cal.select_targets("colocated")]
    assert colocated == ["rollout-share", "gpus-16-24", "gpus-24-32", "unlimited", "prefill-share",
                         "prompt-token-share"]


def test_residuals_rank_targets_one_sided() -> None:
    by = {t.name: t for t in cal.TARGETS}
    assert by["bs48-4P4D"].residual(0.0) == 0.0 and by["bs48-4P4D"].residual(-0.5) == 0.0
    assert by["bs48-4P4D"].residual(0.04) == pytest.approx(2.0)
    assert by["bs32"].residual(0.097 + 0.01) == pytest.approx(0.5)


def test_params_carry_the_pydantic_bounds_and_the_grid_is_cell_centres() -> None:
    p = cal.PARAMS["kv_read_efficiency"]
    assert (p.lo, p.hi, p.section) == (0.55, 1.8, "engine")
    assert cal.PARAMS["env_step_s"].section == "workload"
    assert "moe_floor" not in cal.PARAMS  # fitted to kernel tables, never to the paper
    grid = cal._grid([cal.PARAMS["host_cpu_factor"], cal.PARAMS["launch_per_layer_s"]], 2)
    assert grid == [{"host_cpu_factor": pytest.approx(a), "launch_per_layer_s": pytest.approx(b)}
                    for a in (0.875, 1.625) for b in (9e-5, 2.3e-4)]
    with pytest.raises(cal.CalibrationError, match="grid=0"):
        cal._grid([p], 0)


def test_memory_floor_is_applied() -> None:
    base = PhysicsFile(model="qwen3-30b-a3b", hardware="h200")
    phys, _ = cal._apply(base, {"memory_utilization": 0.85}, "qwen3-30b-a3b-h200")
    assert phys.memory_utilization == pytest.approx(0.92, abs=0.001)


def test_evaluate_scores_a_target_on_paired_seeds() -> None:
    targets = cal.select_targets("fig7-8b-4")
    ev = cal.evaluate({}, targets, seeds=1)
    assert ev.batches == 4  # coloc + 3 splits, one seed
    ms = {k.label: ev.runs[(k, 0)][0] for k in targets[0].allocations()}
    assert ev.values["fig7-8b-4"] == pytest.approx(ms["coloc"] / min(v for k, v in ms.items() if k != "coloc") - 1)
    assert ev.residuals["fig7-8b-4"] == pytest.approx((ev.values["fig7-8b-4"] + 0.206) / 0.02)
    assert ev.loss == pytest.approx(ev.residuals["fig7-8b-4"] ** 2)


def test_write_fit_records_constants_and_residuals(tmp_path: Path) -> None:
    targets = cal.select_targets("rollout-share")
    ev = cal.Evaluation({"host_cpu_factor": 1.5, "env_step_s": 2.0}, 1.0, {"rollout-share": 0.8},
                        {"rollout-share": -0.9}, 1, 0.0)
    paths = cal.write_fit(ev, targets, {"command": "python -m pearl calibrate", "seeds": 8}, tmp_path)
    assert [p.name for p in paths] == ["qwen3-8b-h200.yaml", "qwen3-30b-a3b-h200.yaml"]
    pf = load_physics("qwen3-8b", "h200", tmp_path)
    assert pf.engine.host_cpu_factor == 1.5 and pf.workload.env_step_s == 2.0
    assert pf.fit["targets"]["rollout-share"] == {"section": "Sec. 2.1", "paper": 0.818, "emulated": 0.8,
                                                  "residual_sigma": -0.9}
    assert yaml.safe_load(paths[1].read_text())["model"] == "qwen3-30b-a3b"


def test_cli_rejects_unknown_targets_and_constants(capsys: pytest.CaptureFixture[str]) -> None:
    assert sim_main(["calibrate", "--targets", "nope", "--dry-run"]) == 2
    assert "unknown targets" in capsys.readouterr().err
    assert sim_main(["calibrate", "--targets", "rollout-share", "--params", "nope", "--seeds", "1", "--grid", "1",
                     "--dry-run"]) == 2
    assert "unknown constants ['nope']" in capsys.readouterr().err
    # the measured kernel tables (the default emulator.costs) cover the datasheet formulas' constants
    assert sim_main(["calibrate", "--params", "prefill_mfu,kv_read_efficiency", "--seeds", "1", "--dry-run"]) == 2
    assert "prefill_mfu, kv_read_efficiency: the measured kernel tables" in capsys.readouterr().err


@pytest.mark.parametrize("model", sorted(cal.MODELS))
def test_shipped_memory_utilization_holds_the_papers_5p3d_at_batch_64(model: str) -> None:
    """The emulated memory (the file's value, else the run config's) is at least the floor at which
    5P3D holds batch 64 at the trajectory limit, as the paper ran it (Sec. 3.3); the calibration
    keeps any point of its search there too."""
    from pearl.config import load_config

    cfg_name = cal.MODELS[model]
    cfg = load_config(cfg_name)
    mem = load_physics(cfg.model.name, cfg.hardware.name).engine.memory_utilization
    floor = cal._memory_floor(cfg_name)
    assert (mem if mem is not None else cfg.hardware.memory_utilization) >= floor
    base = PhysicsFile(model=cfg.model.name, hardware=cfg.hardware.name)  # no constants: the run config's 0.9
    eng, _ = cal._apply(base, {}, cfg_name)
    assert eng.memory_utilization == (pytest.approx(floor) if floor > cfg.hardware.memory_utilization else None)
    eng, _ = cal._apply(base, {"memory_utilization": 0.8}, cfg_name)
    assert eng.memory_utilization == pytest.approx(max(0.8, floor))


def test_worker_processes_measure_what_this_process_does() -> None:
    from concurrent.futures import ProcessPoolExecutor

    targets = cal.select_targets("fig7-8b-4")
    serial = cal.evaluate({"host_cpu_factor": 1.5}, targets, seeds=2)
    with ProcessPoolExecutor(max_workers=2) as pool:
        parallel = cal.evaluate({"host_cpu_factor": 1.5}, targets, seeds=2, pool=pool)
    assert parallel.runs == serial.runs and parallel.loss == serial.loss


def test_the_search_can_start_from_the_files() -> None:
    def files(kv_30b: float) -> dict[str, PhysicsFile]:
        return {"8b": PhysicsFile(model="qwen3-8b", hardware="h200", engine=EmulatorPhysics(kv_read_efficiency=1.2)),
                "30b": PhysicsFile(model="qwen3-30b-a3b", hardware="h200",
                                   engine=EmulatorPhysics(kv_read_efficiency=kv_30b, memory_utilization=0.92))}

    bases = files(1.2)
    names = ["kv_read_efficiency", "memory_utilization", "decode_step_s", "response_tokens", "env_step_s"]
    theta = cal.start_theta([cal.PARAMS[n] for n in names], bases)
    # 8B's memory is the run config's 0.9; 30B's 0.92 is its floor, so one value holds both; the
    # workload means are these files' (none: the preset's), not the shipped files'
    assert theta == pytest.approx({"kv_read_efficiency": 1.2, "memory_utilization": 0.9, "decode_step_s": 0.004,
                                   "response_tokens": 1000, "env_step_s": 1.0})
    targets = cal.select_targets("fig7-30b-4")
    assert cal.evaluate(theta, targets, 1, bases).runs == cal.evaluate({}, targets, 1, bases).runs
    # a constant the two files set differently cannot be one start
    with pytest.raises(cal.CalibrationError, match=r"kv_read_efficiency is 1\.2 for 8b but 1 for 30b"):
        cal.start_theta([cal.PARAMS["kv_read_efficiency"]], files(1.0))


def test_local_search_from_the_files_steps_a_sixth_of_the_bounds() -> None:
    lines: list[str] = []
    start, fit, hist = cal.calibrate(["host_cpu_factor"], cal.select_targets("fig7-8b-4"), seeds=1, grid=0,
                                     local_rounds=1, progress=lines.append)
    start_value = load_physics("qwen3-8b", "h200").engine.host_cpu_factor or 1.0
    assert [e.theta for e in hist[:2]] == [{"host_cpu_factor": start_value},
                                          {"host_cpu_factor": round(max(start_value - 1.5 / 6, 0.5), 6)}]
    assert start.runs == hist[0].runs  # the files' values are the start: scored once
    assert fit.loss <= start.loss and any(line.startswith("final") for line in lines)
    with pytest.raises(cal.CalibrationError, match="jobs=0"):
        cal.calibrate([], cal.select_targets("fig7-8b-4"), jobs=0)
