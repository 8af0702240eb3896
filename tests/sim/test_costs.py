"""``python -m pearl costs``: the emulator's cost surface for a config, pinned to the database."""

from __future__ import annotations

import json

import pytest

from pearl.cli import main


def test_surface_matches_the_database_within_the_interpolation_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["costs", "--config", "configs/qwen3-8b-h200.yaml", "--compare", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["costs"] == "database" and s["model"] == "qwen3-8b" and s["tp"] == 1
    assert s["kv_capacity_tokens"] == int((141e9 * 0.875 - 8.2e9 * 2) // 147456)  # the physics file's u 0.875
    rows = s["decode"] + s["prefill"]
    assert len(s["prefill"]) == 16 and len(s["decode"]) == 15  # 64 x 16K and above do not fit in the pool
    for r in rows:
        assert r["emulator_ms"] == pytest.approx(r["database_ms"], rel=0.02), r
    first = s["decode"][0]
    assert (first["n"], first["s"]) == (1, 2048) and first["database_ms"] == pytest.approx(5.07, abs=0.01)


def test_surface_table_and_the_datasheet_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["costs", "--config", "qwen3-8b-h200"]) == 0
    out = capsys.readouterr().out
    assert "costs: database" in out and "decode iteration (ms)" in out and "KV pool" in out
    assert main(["costs", "--config", "qwen3-8b-h200", "--costs", "datasheet", "--compare"]) == 0
    out = capsys.readouterr().out
    assert "costs: datasheet" in out and "ratio range: decode" in out


def test_list_and_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["costs", "--list", "--json"]) == 0
    cat = json.loads(capsys.readouterr().out)
    assert "0.5.14" in cat["systems"]["h200_sxm"]["sglang"] and "Qwen/Qwen3-30B-A3B" in cat["models"]
    assert main(["costs", "--config", "configs/cpu-demo.yaml"]) == 2
    out = capsys.readouterr().out
    assert "is not in the aiconfigurator-core database" in out and "emulator.costs: datasheet" in out
    assert main(["costs", "--config", "nope"]) == 2
    assert "not found" in capsys.readouterr().out
