"""Parser fuzzing: only documented errors escape (hypothesis; the report runs thousands more)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from pearl.cli import CliError, parse_target
from pearl.reliability.fuzz import BASE_STATE, mutate, run_hypothesis, targets
from pearl.sim.traces import TraceError, load_trace


@pytest.mark.parametrize("name", sorted(targets()))
def test_parser_raises_only_documented_errors(name: str) -> None:
    (res,) = run_hypothesis(max_examples=60, seed=7, only=[name])
    assert res.examples == 60
    assert res.crashes == []


def test_a_crash_is_detected_and_reported() -> None:
    """The harness itself must be able to fail: an undocumented error is a crash with its input."""
    from pearl.reliability import fuzz

    tgt = fuzz.targets()["state"]
    broken = fuzz.FuzzTarget("state", lambda d: 1 / 0, tgt.allowed, "always crashes")
    orig = fuzz.targets
    try:
        fuzz.targets = lambda: {"state": broken}  # type: ignore[assignment]
        (res,) = run_hypothesis(max_examples=20, seed=1)
    finally:
        fuzz.targets = orig  # type: ignore[assignment]
    assert res.crashes and res.crashes[0].startswith("ZeroDivisionError")


def test_mutate_paths() -> None:
    doc = {"a": [1, 2], "b": {"c": 3}}
    assert mutate(doc, [(2, "set", 9)]) == {"a": [9, 2], "b": {"c": 3}}
    assert mutate(doc, [(4, "del", None)]) == {"a": [1, 2]}
    assert mutate(doc, [(2, "add", 5)]) == {"a": [1, 2, 5], "b": {"c": 3}}
    assert mutate(doc, [(1, "add", 5)]) == {"a": [1, 2], "b": {"c": 3}, "x1": 5}
    assert doc == {"a": [1, 2], "b": {"c": 3}}  # the base is never changed
    assert mutate(BASE_STATE, [(0, "set", None)]) is None


# Regressions for the crashes the fuzzer found (each was an uncaught OverflowError/ValueError).
@pytest.mark.parametrize(
    "body",
    [
        '{"metadata": {"gap_seconds": 300}, "data": [Infinity]}',
        '{"metadata": {"gap_seconds": 300}, "data": [NaN]}',
        '{"metadata": {"gap_seconds": Infinity}, "data": [1]}',
        '{"metadata": {"gap_seconds": 1e308}, "data": [1, 2, 3]}',
    ],
)
def test_trace_non_finite_numbers_are_trace_errors(tmp_path: Path, body: str) -> None:
    p = tmp_path / "t.json"
    p.write_text(body)
    with pytest.raises(TraceError, match=r"t\.json"):
        load_trace(p)


def test_plan_target_infinite_count_is_a_cli_error() -> None:
    data = json.loads('{"mode": "disaggregated", "n_prefill": Infinity, "n_decode": 1}')
    assert math.isinf(data["n_prefill"])
    with pytest.raises(CliError, match="target"):
        parse_target(data, 4)
