"""The scheduler-time measurement (``benchmarks/bench_sglang_scheduler.py``) runs SGLang's own code:
its ``Req`` stops on the tokenizer's EOS and keeps decoding otherwise, its radix cache finds each
prompt's cached tokens and holds what was inserted (the child asserts each), and the fit it writes
has the shape the emulator reads. Not a timing test: only that every figure is positive."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pearl.engines.emulated_overheads import load_scheduler_times

from .sglang_env import ROOT

pytestmark = pytest.mark.sglang_contract


def test_the_measurement_runs_sglangs_scheduler_code(sglang_installed: None, tmp_path: Path) -> None:
    out = tmp_path / "sched.yaml"
    run = subprocess.run([sys.executable, "benchmarks/bench_sglang_scheduler.py", "--reps", "1", "--json",
                          "--write", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert set(got["decode"]) == {"1", "2", "4", "8", "16", "32", "64", "128", "256"}
    assert all(t > 0 for t in got["decode"].values()) and all(row[3] > 0 for row in got["extend"])
    assert yaml.safe_load(out.read_text())["sglang"] == "0.5.23"
    load_scheduler_times.cache_clear()
    t = load_scheduler_times(out)
    load_scheduler_times.cache_clear()
    assert t.b_dec > 0 and t.c_ext > 0
