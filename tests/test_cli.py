from __future__ import annotations

import json
from pathlib import Path

import pytest

from pearl.cli import main
from pearl.core.state import ClusterState, Gpu, Role, Worker, WorkerStatus, Zone


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_decide_json_shape(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "decide", "--config", "qwen3-8b-h200", "--gpus", "8", "--batch", "64", "--json")
    assert rc == 0
    d = json.loads(out)
    assert set(d) >= {"mode", "n_prefill", "n_decode", "predicted_makespan_s", "reason", "candidates"}
    assert len(d["candidates"]) == 8
    assert all({"label", "predicted_makespan_s", "feasible"} <= set(c) for c in d["candidates"])


def test_decide_table_and_hysteresis(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "decide", "--config", "qwen3-30b-a3b-h200", "--gpus", "8", "--batch", "32,96")
    assert rc == 0 and "coloc" in out and "4P4D" in out
    rc, out, _ = run(capsys, "decide", "--config", "qwen3-8b-h200", "--gpus", "8", "--current", "coloc", "--json")
    assert json.loads(out)["current"] == "coloc"


@pytest.mark.parametrize(
    ("argv", "msg"),
    [
        (["--gpus", "0"], "need at least 1 GPU"),
        (["--gpus", "33"], "exceeds the cluster's rollout GPUs (32"),
        (["--gpus", "8", "--current", "x:y"], "cannot parse allocation"),
    ],
)
def test_decide_errors(capsys: pytest.CaptureFixture[str], argv: list[str], msg: str) -> None:
    rc, _, err = run(capsys, "decide", "--config", "qwen3-8b-h200", *argv)
    assert rc == 2 and msg in err


def test_plan_json_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s = ClusterState.build([Gpu(f"r{i}", Zone.RESERVED) for i in range(4)],
                           [Worker(f"w{i}", (f"r{i}",), Role.COLOCATED, WorkerStatus.ACTIVE) for i in range(4)])
    (tmp_path / "s.json").write_text(json.dumps(s.to_dict()))
    (tmp_path / "t.json").write_text(json.dumps({"allocation": "1P3D"}))
    rc, out, _ = run(capsys, "plan", "--state", str(tmp_path / "s.json"), "--target", str(tmp_path / "t.json"), "--json")
    assert rc == 0
    p = json.loads(out)
    assert p["n_changes"] == 4 and p["counts"] == {"change_role": 4}
    assert p["target"]["label"] == "1P3D" and len(p["steps"]) == 4


def test_plan_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "s.json").write_text("{not json")
    (tmp_path / "t.json").write_text(json.dumps({"allocation": "coloc"}))
    rc, _, err = run(capsys, "plan", "--state", str(tmp_path / "s.json"), "--target", str(tmp_path / "t.json"))
    assert rc == 2 and "not valid JSON: line 1" in err
    (tmp_path / "s.json").write_text(json.dumps({"gpus": [{"gpu_id": "a"}], "workers": []}))
    (tmp_path / "t.json").write_text(json.dumps({"allocation": "2P2D"}))
    rc, _, err = run(capsys, "plan", "--state", str(tmp_path / "s.json"), "--target", str(tmp_path / "t.json"))
    assert rc == 2 and "needs 4 workers but only 1 fit" in err
