"""The durable journal: round trips, idempotence, and no acknowledged write lost to ``kill -9``."""

from __future__ import annotations

import asyncio
import math
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from pearl.core.state import ClusterState, Gpu, Role, Worker, WorkerStatus, Zone
from pearl.core.trajectory import Segment, TrajectoryRecord
from pearl.runtime.journal import Journal, JournalError, record_from_json, record_to_json


def _rec(tid: str, n: int = 3, v: int = 2) -> TrajectoryRecord:
    return TrajectoryRecord(
        traj_id=tid,
        group_id="g" + tid,
        segments=(
            Segment((1, 2, 3), trained=False, turn=0),
            Segment(tuple(range(n)), trained=True, logprobs=tuple(-0.1 * i - 1e-17 for i in range(n)), weight_version=v),
        ),
        reward=0.5,
        info={"task": "t", "turns": 1},
    )


def test_wal_mode_and_record_round_trip(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.db")
    assert j._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    r = _rec("a")
    assert record_from_json(record_to_json(r)) == r
    assert j.record_trajectory(r) is True
    assert j.record_trajectory(r) is False  # completed at most once
    assert j.completed() == (r,)
    j.close()


async def test_a_write_whose_waiter_was_cancelled_lands_and_the_writer_goes_on(tmp_path: Path) -> None:
    """A task cancelled while it awaits ``commit`` (a shutdown cancelling the training loop)
    cancels the future the writer thread later settles; the write still lands, and the writes
    after it, and a synchronous read, still run rather than waiting on a dead writer thread."""
    j = Journal(tmp_path / "j.db")
    started, go = threading.Event(), threading.Event()

    def slow_write() -> bool:
        started.set()
        go.wait(10)
        return j.record_trajectory(_rec("a"))

    waiter = asyncio.ensure_future(j.commit(slow_write, "slow write"))
    assert await asyncio.to_thread(started.wait, 10)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    go.set()
    assert await asyncio.wait_for(j.commit(lambda: j.record_trajectory(_rec("b")), "next write"), 10) is True
    assert await asyncio.wait_for(asyncio.to_thread(j.counts), 10) == j.counts()
    assert {r.traj_id for r in j.completed()} == {"a", "b"}
    j.close()
    with pytest.raises(JournalError, match="is closed; late write was not written"):
        await asyncio.wait_for(j.commit(lambda: None, "late write"), 10)


def test_partials_dropped_on_completion_and_ignored_after(tmp_path: Path) -> None:
    with Journal(tmp_path / "j.db") as j:
        assert j.record_partial("a", 0, [5, 6], [-0.5, -0.25], 1)
        assert j.record_partial("a", 0, [7], [-1.0], 2)
        assert j.record_partial("b", 1, [9], [-2.0], 2)
        assert not j.record_partial("b", 1, [], [], 2)  # empty part: nothing to keep
        run = j.recover()
        assert [p.tokens for p in run.partials["a"]] == [(5, 6), (7,)]
        assert [p.weight_version for p in run.partials["a"]] == [1, 2]
        assert run.partials["a"][0].segment().logprobs == (-0.5, -0.25)
        assert run.partial_tokens == 4
        j.record_trajectory(_rec("a"))
        assert not j.record_partial("a", 0, [8], [-1.0], 3)  # a late abort must not resurrect it
        run = j.recover()
        assert set(run.partials) == {"b"}
        assert [r.traj_id for r in run.completed] == ["a"]


def test_partial_length_mismatch_is_rejected(tmp_path: Path) -> None:
    with Journal(tmp_path / "j.db") as j, pytest.raises(ValueError, match="2 tokens but 1 logprobs"):
        j.record_partial("a", 0, [1, 2], [-1.0], 0)


def test_state_and_consumed(tmp_path: Path) -> None:
    st = ClusterState.build(
        [Gpu("g0", Zone.RESERVED), Gpu("g1", Zone.PREEMPTIBLE, instance_id="i-1")],
        [Worker("w0", ("g0",), Role.COLOCATED, WorkerStatus.ACTIVE)],
    )
    with Journal(tmp_path / "j.db") as j:
        assert j.recover().state is None
        j.record_state(st.to_dict())
        st2 = st.add_worker(Worker("w1", ("g1",), Role.DECODE, WorkerStatus.INITIALIZING))
        j.record_state(st2.to_dict())
        for t in "abc":
            j.record_trajectory(_rec(t))
        j.record_consumed(["a", "b"])
    with Journal(tmp_path / "j.db") as j:  # reopen: everything is on disk
        run = j.recover()
        assert ClusterState.from_dict(run.state) == st2  # type: ignore[arg-type]
        assert run.consumed == {"a", "b"}
        assert [r.traj_id for r in run.unconsumed] == ["c"]
        assert j.counts() == {"completed": 3, "consumed": 2, "partials": 0, "in_flight": 0, "partial_tokens": 0,
                              "events": 0, "events_pending": 0}


def test_not_a_database_names_the_path(tmp_path: Path) -> None:
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(JournalError, match=r"bad\.db"):
        Journal(bad)


def test_logprob_floats_round_trip_exactly(tmp_path: Path) -> None:
    with Journal(tmp_path / "j.db") as j:
        lps = [-1e-300, -math.pi, -0.1 + 1e-17, -123456.789]
        j.record_partial("x", 0, [1, 2, 3, 4], lps, 0)
        assert list(j.recover().partials["x"][0].logprobs) == lps


_WRITER = textwrap.dedent(
    """
    import sys
    from pearl.core.trajectory import Segment, TrajectoryRecord
    from pearl.runtime.journal import Journal
    j = Journal(sys.argv[1])
    i = 0
    while True:
        tid = f"t{i}"
        j.record_partial(tid, 0, [i, i + 1], [-0.5, -0.25], i)
        print("partial", tid, flush=True)
        if i % 2 == 0:
            rec = TrajectoryRecord(tid, "g", (Segment((i, i + 1, i + 2), True, (-0.5, -0.25, -1.0), i),))
            j.record_trajectory(rec)
            print("done", tid, flush=True)
        j.record_state({"version": i, "gpus": [], "workers": []})
        print("state", i, flush=True)
        i += 1
    """
)


def test_kill_9_mid_stream_loses_no_acknowledged_write(tmp_path: Path) -> None:
    """A writer acknowledges each commit on stdout; we SIGKILL it mid-stream (it is writing as fast
    as it can, so the kill lands between or inside transactions) and recover from the file."""
    db = tmp_path / "j.db"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(db)], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    acked: list[tuple[str, str]] = []
    for line in proc.stdout:
        kind, ident = line.split()
        acked.append((kind, ident))
        if len(acked) >= 600:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    # Anything it wrote after our last read may or may not be there; what was acknowledged must be.
    with Journal(db) as j:
        run = j.recover()
    done = {r.traj_id for r in run.completed}
    for kind, ident in acked:
        if kind == "done":
            assert ident in done
        elif kind == "partial" and int(ident[1:]) % 2 == 1:
            assert ident in run.partials and run.partials[ident][0].tokens == (int(ident[1:]), int(ident[1:]) + 1)
    last_state = max(int(i) for k, i in acked if k == "state")
    assert run.state is not None and run.state["version"] >= last_state
    # and the file is a consistent database (integrity check after the crash)
    con = sqlite3.connect(str(db))
    try:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        con.close()
