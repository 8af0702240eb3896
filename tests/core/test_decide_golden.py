"""The ``python -m pearl decide`` outputs the README shows, pinned byte for byte: the table for
Qwen3-30B-A3B on 8 H200s at four batch sizes and the ``--json`` object for Qwen3-8B with a current
allocation (hysteresis). A change to any cost, view or makespan term moves a printed figure here.

Regenerate a golden file only for an intended change of the model, with the command in its test
(``> tests/core/golden/<file>``), and say why in the commit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pearl.cli import main

GOLDEN = Path(__file__).parent / "golden"


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 0
    return capsys.readouterr().out


def test_decide_table_matches_the_golden_file(capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m pearl decide --config configs/qwen3-30b-a3b-h200.yaml --gpus 8 --batch 32,48,64,96``"""
    out = _run(["decide", "--config", "qwen3-30b-a3b-h200", "--gpus", "8", "--batch", "32,48,64,96"],
               capsys)
    assert out == (GOLDEN / "decide-qwen3-30b-a3b-h200-8gpus.txt").read_text()


def test_decide_json_matches_the_golden_file(capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m pearl decide --config qwen3-8b-h200 --gpus 8 --current coloc --json``"""
    out = _run(["decide", "--config", "qwen3-8b-h200", "--gpus", "8", "--current", "coloc", "--json"], capsys)
    want = (GOLDEN / "decide-qwen3-8b-h200-8gpus-current-coloc.json").read_text()
    assert out == want
    d = json.loads(out)
    # the saving stays under the mode threshold plus the change's own cost (cost-aware hysteresis)
    assert (d["label"], d["best"], d["switched"]) == ("coloc", "4P4D", False)
    assert d["reason"].endswith("<= mode threshold 5.0% (3.0% + switch cost 2.0%)")
    assert [c["label"] for c in d["candidates"]][:2] == ["coloc", "1P7D"]
