"""Chaos runs through the real runtime: faults at every phase, zero invariant violations; and the
checker itself catches a runtime that breaks an invariant."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pearl.cli import main
from pearl.reliability.chaos import FAULT_KINDS, run_chaos


def test_chaos_run_has_faults_and_no_violations() -> None:
    res = run_chaos(seed=0, events=40).to_dict()
    assert res["invariant_violations"] == 0, res["violations"]
    assert res["faults_total"] >= 25
    assert len(res["faults"]) >= 10  # most kinds occurred
    assert set(res["faults"]) <= set(FAULT_KINDS)
    assert res["trajectories_trained"] > 0 and res["trajectories_trained"] % 16 == 0
    assert res["max_return_delay_s"] > 0  # borrowed GPUs were returned (slow drains included)


def test_chaos_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["chaos", "--seed", "5", "--events", "15", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    for key in ("faults", "invariant_violations", "trajectories_completed", "max_return_delay_s"):
        assert key in d
    assert d["invariant_violations"] == 0


def test_checker_catches_tokens_generated_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pipeline that resumes an aborted request from the original prompt (dropping the kept
    prefix from the context) generates tokens twice: the checker must say so."""
    import pearl.runtime.pipeline as pl

    real = pl.continuation_request

    def broken(original, parts, attempt):  # type: ignore[no-untyped-def]
        req = real(original, parts, attempt)
        return None if req is None else replace(req, input_ids=original.input_ids)

    monkeypatch.setattr(pl, "continuation_request", broken)
    res = run_chaos(seed=1, events=25).to_dict()
    by = res["violations"]["by_invariant"]
    assert by.get("token_generated_twice", 0) + by.get("partial_output_dropped", 0) > 0, res["violations"]


def test_checker_catches_a_lost_trajectory(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pipeline whose trajectories fail on an aborted request loses them: caught."""
    import pearl.runtime.pipeline as pl

    def failing(original, parts, attempt):  # type: ignore[no-untyped-def]
        raise RuntimeError("resume not supported")

    monkeypatch.setattr(pl, "continuation_request", failing)
    res = run_chaos(seed=2, events=25).to_dict()
    assert res["violations"]["by_invariant"].get("trajectory_lost", 0) > 0, res["violations"]
