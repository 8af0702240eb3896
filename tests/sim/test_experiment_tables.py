"""Several workload seeds per experiment cell: per-seed ratios on completed trajectories, then the
mean and its spread; the CLI option and its bad input."""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from pearl.sim.cli import add_experiments_parser, experiments_main
from pearl.sim.experiment_tables import (
    fig5_seeds_markdown,
    fig7_seeds_rows,
    fig8_seeds_rows,
    fmt_spread,
    seed_overrides,
    spread,
)
from pearl.sim.experiments import bound_oracle


def _sys(done: int, rate: float | None = None, err: float | None = None) -> dict[str, Any]:
    return {"trajectories_completed": done, "trajectories_per_hour": done / 2, "batch_rate_per_hour": rate or done / 2,
            "makespan_prediction_error": err, "cpu_s": 1.0}


def test_spread_is_mean_sample_sd_and_range() -> None:
    m, sd, lo, hi = spread([1.0, 1.02, 0.99])
    assert m == pytest.approx(statistics.fmean([1.0, 1.02, 0.99])) and sd == pytest.approx(statistics.stdev([1.0, 1.02, 0.99]))
    assert (lo, hi) == (0.99, 1.02)
    assert spread([1.5]) == (1.5, 0.0, 1.5, 1.5)
    assert fmt_spread([1.0, 1.02, 0.99], "gain") == "+0.3 % ± 1.5 [-1.0, +2.0]"
    assert fmt_spread([0.97, 1.0], "share") == "98.5 % ± 2.1 [97.0, 100.0]"
    assert fmt_spread([2.0, 2.1], "ratio") == "2.05x ± 0.07 [2.00, 2.10]"
    assert fmt_spread([], "gain") == "-"
    with pytest.raises(ValueError, match="unknown spread kind"):
        fmt_spread([1.0], "pct")
    assert seed_overrides(5, 0) == {} and seed_overrides(5, 2) == {"workload.seed": 7}


def test_fig5_seed_table_takes_each_ratio_per_seed_and_bounds_each_seeds_oracle() -> None:
    """pearl vs rlboost+ per seed on completed trajectories (800/780, 790/800, 810/800), not the
    ratio of the means; each seed's oracle is bounded by that seed's systems (seed 1: its own plan
    did worse than rlboost+, so the bound takes rlboost+'s 800 and pearl / oracle is 98.75 %)."""
    by_seed = {
        "0": {"roll": _sys(400), "rlboost+": _sys(780), "pearl": _sys(800, err=0.04), "oracle": _sys(820)},
        "1": {"roll": _sys(410), "rlboost+": _sys(800), "pearl": _sys(790, err=0.06), "oracle": _sys(700)},
        "2": {"roll": _sys(390), "rlboost+": _sys(800), "pearl": _sys(810, err=0.05), "oracle": _sys(810)},
    }
    res = {"qwen3-8b/volatile": {"segment": {"mean_gpus": 10.75}, "systems": by_seed["0"], "by_seed": by_seed}}
    md = fig5_seeds_markdown(res, bound_oracle)
    gains = [800 / 780, 790 / 800, 810 / 800]
    assert f"{100 * (statistics.fmean(gains) - 1):+.1f} % ± {100 * statistics.stdev(gains):.1f}" in md
    assert fmt_spread([800 / 820, 790 / 800, 810 / 810], "share") in md
    assert "| qwen3-8b | volatile | 10.8 | 3 | 400 / 793 / 800 / 810 |" in md  # oracle mean after the bound
    assert "5.0 %" in md and "Over 3 workload seeds" in md
    assert fig5_seeds_markdown({"m/s": {"segment": {"mean_gpus": 1.0}, "systems": {}}}, bound_oracle) == ""
    del by_seed["2"]["oracle"]  # the oracle on 2 of the 3 seeds: said so
    assert fmt_spread([800 / 820, 790 / 800], "share") + " (2 of 3 seeds)" in fig5_seeds_markdown(res, bound_oracle)


def test_fig7_and_fig8_seed_rows() -> None:
    f7 = {"qwen3-8b/8": {"by_seed": {"0": {"roll": _sys(100), "+pd": _sys(110)}, "1": {"roll": _sys(100), "+pd": _sys(100)}}}}
    assert fig7_seeds_rows(f7, ["roll", "+pd"]) == [["qwen3-8b", "8", 2, fmt_spread([1.1, 1.0], "gain")]]
    f8 = {"batch 32": {"by_seed": {"0": {"rlboost+": _sys(500, rate=240), "pearl": _sys(510, rate=250)},
                                   "1": {"rlboost+": _sys(520, rate=250), "pearl": _sys(520, rate=250)}}}}
    (row,) = fig8_seeds_rows(f8)
    assert row == ["batch 32", 2, "510 / 515", fmt_spread([510 / 500, 1.0], "gain"), fmt_spread([250 / 240, 1.0], "gain")]


def test_the_seeds_option_and_its_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    ap = argparse.ArgumentParser()
    add_experiments_parser(ap.add_subparsers(dest="command"))
    assert ap.parse_args(["experiments", "fig5"]).seeds == 1
    args = ap.parse_args(["experiments", "fig8", "--seeds", "0"])
    assert args.seeds == 0 and experiments_main(args) == 2
    assert "--seeds 0: give at least 1 workload seed per cell" in capsys.readouterr().err


def test_fig5_keeps_the_replays_of_an_interrupted_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A (model, segment, system, seed) already in fig5.partial.json from the same trace is not
    replayed again; seed 0 of a one-seed run counts as seed 0 of a multi-seed one."""
    from pearl.sim import experiments as ex

    picks = ex.fig5_segments(ex.load_trace(str(ex.DEFAULT_TRACE)), ex._cfg("qwen3-8b-h200"), 2.0, "picker")
    part = {f"qwen3-8b/{label}": {"segment": p.to_dict(), "trace": ex.DEFAULT_TRACE.name,
                                  "systems": {"roll": _sys(400)},
                                  "by_seed": {"1": {"roll": _sys(410)}}} for label, p in picks.items()}
    (tmp_path / "fig5.partial.json").write_text(json.dumps(part))
    ran: list[Any] = []
    monkeypatch.setattr(ex, "_sim_job", lambda job: ran.append(job) or {"systems": {n: _sys(420) for n in job[5]}})
    said: list[str] = []
    _md, res = ex.fig5(tmp_path, quick=True, progress=said.append, systems=("roll",), seeds=3)
    assert len(ran) == 3 and {job[1]["workload.seed"] for job in ran} == {2}  # seed 2 of each segment only
    assert any("6 replays already in" in m for m in said)
    assert [res[k]["by_seed"][s]["roll"]["trajectories_completed"] for k in res for s in "012"] == [400, 410, 420] * 3
    ran.clear()
    _md, res = ex.fig5(tmp_path, quick=True, progress=said.append, systems=("rlboost+",))  # one seed, added
    assert len(ran) == 3 and all(not job[1] for job in ran)
    assert {res[k]["by_seed"]["0"]["rlboost+"]["trajectories_completed"] for k in res} == {420}


def test_fig7_runs_the_rungs_asked_for_on_every_seed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pearl.sim import experiments as ex
    from pearl.sim.systems import UnknownSystemError

    ran: list[Any] = []

    def job(j: Any) -> dict[str, Any]:
        ran.append(j)
        seed = j[1].get("workload.seed", 0)
        return {"systems": {"roll": _sys(100), "+pd": _sys(100 + 10 * seed)}}

    monkeypatch.setattr(ex, "_sim_job", job)
    md, res = ex.fig7(tmp_path, quick=True, progress=lambda _m: None, seeds=2, variants=("+pd",))
    assert len(ran) == 4 and {j[5] for j in ran} == {("roll", "+pd")}  # 2 pools x 2 seeds, roll always
    assert "| qwen3-8b | 4 | +0.0% | +0.0% |" in md and fmt_spread([1.0, 1.1], "gain") in md
    assert res["qwen3-8b/8/seeds"]["1"]["+pd"]["trajectories_completed"] == 110
    with pytest.raises(UnknownSystemError, match=r"fig7 variants \['pd'\] unknown; the ladder: roll, \+pd"):
        ex.fig7(tmp_path, quick=True, variants=("pd",))
