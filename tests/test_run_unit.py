"""``pearl run`` pieces that need no engine: the trace schedule and its deadlines, the summary lines
(the step and event lines: tests/test_run_story.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from pearl.config import CONFIG_DIR, load_config
from pearl.core.events import ReclaimNotice
from pearl.run import _replay_trace, _trace_schedule, reconfiguration_lines
from pearl.runtime.control import SubmitResult
from pearl.sim.traces import TraceError


class _Recorder:
    def __init__(self) -> None:
        self.got: list[tuple[float, Any]] = []

    async def submit(self, ev: Any) -> SubmitResult:
        self.got.append((asyncio.get_running_loop().time(), ev))
        return SubmitResult(applied=True, event_id=ev.event_id)


async def test_reclaim_deadline_is_moved_onto_the_controller_clock(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("time_s,available\n0,1\n0.2,0\n")
    cfg = load_config(CONFIG_DIR / "cpu-demo.yaml", {"trace": str(trace)})
    schedule = _trace_schedule(cfg, notice_s=0.1)
    assert [te.event.kind.value for te in schedule] == ["gpus_granted", "reclaim_notice"]
    rec, sent = _Recorder(), []
    t0 = asyncio.get_running_loop().time()
    await _replay_trace(rec, schedule, sent)
    (t_grant, _), (t_notice, notice) = rec.got
    assert t_grant - t0 < 0.05  # the grant at t=0 goes at once
    assert isinstance(notice, ReclaimNotice)
    # submitted 0.1 s after the start, due 0.2 s after it, on the loop's clock (not trace-relative 0.2)
    assert t_notice - t0 == pytest.approx(0.1, abs=0.05)
    assert notice.deadline - t0 == pytest.approx(0.2, abs=0.05)
    assert [s["event"] for s in sent] == ["gpus_granted", "reclaim_notice"]


def test_a_broken_trace_fails_before_anything_starts(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("time_s,available\n0,1\n5,x\n")
    cfg = load_config(CONFIG_DIR / "cpu-demo.yaml", {"trace": str(trace)})
    with pytest.raises(TraceError, match="line 3: field 'available'"):
        _trace_schedule(cfg, notice_s=30)


def test_reconfiguration_lines_give_durations() -> None:
    recs = {
        "expansions": [{"group_id": "x2", "status": "admitted", "started_at": 100.0, "ready_at": 190.5,
                        "admitted_at": 191.0, "error": "", "members": {"w-spot-00-3": {"gpus": ["spot-00"]}}},
                       {"group_id": "x3", "status": "preparing", "started_at": 300.0, "ready_at": None,
                        "admitted_at": None, "error": "", "members": {}}],
        "shrinks": [{"gpus": ["spot-00"], "started_at": 10.0, "released_at": 12.25, "aborted_requests": 4,
                     "met_deadline": True}],
        "returns": [{"workers": ["o-t0"], "delay_s": 11.15, "aborted_requests": 4}],
    }
    assert reconfiguration_lines(recs) == [
        "expansion x2 [w-spot-00-3 on spot-00]: admitted; preparation 90.5 s, admission 0.5 s",
        "expansion x3 []: preparing; preparation -, admission -",
        "shrink of spot-00: released in 2.2 s, 4 requests aborted (their partial output kept and resumed), deadline met",
        "return of borrowed o-t0 before an update: 11.2 s, 4 requests aborted and resumed",
    ]


def test_a_failed_expansion_is_one_summary_line() -> None:
    recs = {"expansions": [{"group_id": "x2", "status": "failed", "started_at": 10.0, "ready_at": 376.1,
                            "admitted_at": None, "members": {},
                            "error": "admission: worker w-spot-00-4: vLLM server died (exit code -9); last log "
                                     "lines:\nINFO shutdown\nERROR EngineDeadError"}]}
    assert reconfiguration_lines(recs) == [
        "expansion x2 []: failed; preparation 366.1 s, admission -; error: admission: worker w-spot-00-4: vLLM "
        "server died (exit code -9); last log lines:"]
