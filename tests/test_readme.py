"""The README's decision-core figures are what the commands print: the ``decide --json`` sample
equals the golden output (``tests/core/golden``) and the Sec. 3.3 table equals ``decide`` on
Qwen3-30B-A3B at 8 GPUs and batches 32, 48, 64, 96 (colocated and best feasible split, in seconds
to 0.1, and ``(M_coloc - M_split) / M_coloc`` in percent to 0.1)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pearl.cli import main

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
GOLDEN = ROOT / "tests/core/golden"


def _block_after(marker: str, lang: str) -> str:
    start = README.index(marker)
    m = re.compile(rf"```{lang}\n(.*?)```", re.S).search(README, start)
    assert m is not None, f"no ```{lang} block after {marker!r} in README.md"
    return m.group(1)


def test_readme_decide_json_sample_is_the_command_output() -> None:
    sample = json.loads(_block_after("`decide --json` prints one object", "json"))
    golden = json.loads((GOLDEN / "decide-qwen3-8b-h200-8gpus-current-coloc.json").read_text())
    assert sample == golden


def test_readme_sec33_table_is_the_command_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["decide", "--config", "qwen3-30b-a3b-h200", "--gpus", "8", "--batch", "32,48,64,96",
                 "--json"]) == 0
    rows = []
    for d in json.loads(capsys.readouterr().out):
        coloc = next(c for c in d["candidates"] if c["mode"] == "colocated")["predicted_makespan_s"]
        split = min((c for c in d["candidates"] if c["mode"] == "disaggregated" and c["feasible"]),
                    key=lambda c: c["predicted_makespan_s"])
        gain = (coloc - split["predicted_makespan_s"]) / coloc * 100
        rows.append((d["batch"], f"{coloc:.1f}", split["label"], f"{split['predicted_makespan_s']:.1f}",
                     f"{gain:+.1f}"))
    section = README[README.index("### What the predictor says about the paper's Sec. 3.3"):]
    shown = [(int(b), c, lab, s, g.replace(" ", "")) for b, c, lab, s, g in re.findall(
        r"^\| (\d+) \| ([\d.]+) s \| (\d+P\d+D) ([\d.]+) s \| ([+-][\d.]+) %", section, re.M)]
    assert shown == rows
