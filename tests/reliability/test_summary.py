"""``python -m pearl reliability`` on a small budget: the page is built from fresh runs, every
section is there, and the real-vLLM section says plainly when it was not run."""

from __future__ import annotations

import pytest

from pearl.reliability.summary import build_report

pytestmark = pytest.mark.slow


def test_small_report_has_every_section() -> None:
    text, ok = build_report(seeds=1, events=5, fuzz_examples=5, load_trajectories=64, out=None, atheris_runs=0)
    assert ok, text
    for heading in ("## Summary", "## Fault injection", "## Controller restart (kill -9)", "## Fuzzing of parsers",
                    "## Admin API security", "## Load (64 concurrent trajectories",
                    "## The same key faults against real vLLM servers"):
        assert heading in text
    assert "Not run for this page (`python -m pearl reliability --vllm`" in text
