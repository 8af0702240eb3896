"""Experiment plumbing that does not need long replays: Table 3 aggregation, presets, the parsers."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from pearl.config import load_config
from pearl.sim.cli import add_experiments_parser, add_simulate_parser
from pearl.sim.experiments import table3
from pearl.sim.presets import PRESETS, preset_overrides


def test_table3_aggregates_observed_costs(tmp_path: Path) -> None:
    fig5 = {
        "m/a": {"systems": {"pearl": {"reconfiguration_costs_s": {"activation": [6.0, 5.5],
                                                                   "expansion_preparation": [60.0]}}}},
        "m/b": {"systems": {"pearl": {"reconfiguration_costs_s": {"activation": [6.5]}}}},
    }
    md, samples = table3(tmp_path, fig5)
    assert samples == {"activation": [6.0, 5.5, 6.5], "expansion_preparation": [60.0]}
    assert "| activation | 3 | 5.5 | 6 | 6.5 |" in md
    assert json.loads((tmp_path / "table3.json").read_text()) == samples


def test_table3_reports_resume_prefill_and_reuses_saved_pearl_replays(tmp_path: Path) -> None:
    seg = {"label": "abundant", "start_hour": 3.25, "hours": 2.0}
    fig5 = {"qwen3-8b/abundant": {"segment": seg, "systems": {
        "pearl": {"reconfiguration_costs_s": {"activation": [6.0]}, "trajectories_per_hour": 100.0},
        "roll": {"trajectories_per_hour": 50.0}}}}
    pearl = {"reconfiguration_costs_s": {"activation": [5.5]}, "trajectories_per_hour": 120.0,
             "reconfigurations": {"mode_switch": 2, "borrow": 3},
             "resume_prefill": {"tokens": [12000, 20000], "seconds": [1.0, 3.0], "share": [0.01, 0.03]}}
    (tmp_path / "table3.pearl_runs.json").write_text(
        json.dumps({"qwen3-8b/abundant": {"segment": seg, "systems": {"pearl": pearl}}}))
    # a replay would fail on this trace: the saved one for the same segment is used instead
    md, data = table3(tmp_path, fig5, trace=str(tmp_path / "missing.json"))
    assert data["activation"] == [5.5]  # the replayed pearl run replaces the old one
    assert data["resume_prefill"] == {"tokens": [12000, 20000], "seconds": [1.0, 3.0], "share": [0.01, 0.03]}
    assert "| extra prefill of a resumed request (s) | 2 | 1 | 3 | 2 | 3 |" in md
    assert "| qwen3-8b/abundant | 120 | 2.400 |" in md


def test_presets_load() -> None:
    for name in PRESETS:
        cfg = load_config("qwen3-8b-h200", preset_overrides(name) or None)
        assert cfg.workload.batch_size == 64
    assert load_config("qwen3-8b-h200", preset_overrides("paper")).workload.system_prompt_tokens == 12000
    with pytest.raises(ValueError, match="unknown workload preset"):
        preset_overrides("nope")


def test_parsers_register() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="command")
    add_simulate_parser(sub)
    add_experiments_parser(sub)
    a = ap.parse_args(["simulate", "--trace", "x.json", "--segment", "volatile", "--json"])
    assert a.systems == "pearl,roll,rlboost+,oracle" and a.hours == 2.0 and callable(a.func)
    b = ap.parse_args(["experiments", "fig7", "--quick"])
    assert b.which == "fig7" and b.quick and b.workload == "paper"
