"""The controller's durable journal: completed trajectories, partial outputs and cluster state.

Role. A PEARL controller holds hours of rollout work in memory: completed trajectories waiting for
the trainer, partially generated responses of interrupted requests, and the GPU-worker-role table.
The journal writes each of these to one SQLite database (WAL mode, the embedded default: no server,
one file beside the run) as it happens, so that a controller killed with ``kill -9`` restarts
without losing a completed trajectory or a partial output.

Life cycle::

    j = Journal(path)                      # opens / creates; WAL mode; schema created if missing
    j.record_partial(tid, turn, toks, lps, v)   # an aborted request's output (kept for resumption)
    j.record_trajectory(record)            # completed: record + drop its partials (one transaction)
    j.record_consumed([tid, ...])          # trained on, update durable (never re-delivered)
    j.record_state(state.to_dict())        # the GPU-worker-role table after every applied change
    j.record_event(JournaledEvent(...))    # an elastic event the admin API accepted (before its 202)
    ...  kill -9  ...
    run = Journal(path).recover()          # RecoveredRun(completed, partials, state, consumed)
    j.close()

Durability (the modelling choice, written down). Every ``record_*`` call is one SQLite transaction
that is committed before the call returns. In WAL mode a committed transaction is in the WAL file,
i.e. in the operating system's page cache, the moment ``COMMIT`` returns; a ``kill -9`` of the
process cannot lose it (tested: ``tests/reliability/test_journal.py`` kills a writer with SIGKILL
mid-stream and checks that every acknowledged write is recovered). ``synchronous="NORMAL"`` (the
default) does not ``fsync`` on every commit, so a *power loss* may lose the last few
transactions; pass ``synchronous="FULL"`` to pay one fsync per commit for that guarantee too.
Every statement runs on the journal's one writer thread, in submission order, so the event loop
never waits on the disk: the runtime queues its writes (``post``) and awaits those it acknowledges
(``commit``: an event's 202, a completed trajectory before ``on_trajectory_done``, a trained batch
before ``publish`` returns); a task cancelled while it awaits ``commit`` leaves its write queued,
and it lands all the same. A write that fails with an operational error (disk full, I/O error,
a locked file) is retried with back-off, in order, and ``Journal.fault`` names the cause meanwhile
(``/healthz`` and ``/v1/progress`` show it); the run goes on, its writes wait in memory, and they
land, in order, once the disk takes them again.

How the controller uses it (``Controller(..., journal=Journal(path))``, wired by
``pearl.runtime.journal_replay``: ``attach`` and ``JournaledEngine``):

* writes: every generation result passes ``JournaledEngine`` (the runtime's engine is wrapped)
  and is journaled as a part of its ``(trajectory, turn)`` before the pipeline sees it - normal,
  aborted, or the partial carried by ``EngineDeadError``; every completed trajectory
  (``PipelineHooks.trajectory_done``); every batch the trainer has trained on once the update is
  durable (``publish`` / ``batch_trained`` -> ``record_consumed``: after a checkpoint, so a batch
  the trainer held mid-update, or trained on after the last checkpoint, is delivered again after a
  restart, which resumes the trainer from that checkpoint); every state change
  (the executor's ``listeners`` -> ``record_state``).
* restart (a controller built on an existing journal):

  1. ``recover()`` gives the last GPU table, the completed trajectories (and which were consumed)
     and the parts of every in-flight trajectory;
  2. the start-up table is the journaled GPUs without workers (``restart_state``: a granted
     preemptible GPU is still ours; the servers died with the controller and are relaunched by
     the start-up re-plan);
  3. batches the trainer consumed are skipped (``first_unconsumed_batch``); completed but
     unconsumed trajectories are handed on as journaled (the pipeline's ``Resume``), never
     regenerated;
  4. an in-flight trajectory is replayed: its session runs again, and each request of a turn with
     journaled parts is answered from the journal (``JournaledEngine``: one part per attempt, the
     unfinished ones as ``abort`` so the pipeline continues with prompt + part), so no journaled
     token is generated again and none is lost; only the remainder is generated.

Elastic events (table ``events``, written by ``pearl.runtime.door.EventDoor``): every outside event
is journaled before it is acknowledged, with its payload digest (idempotency survives a restart),
its reclaim key and a status (``accepted`` -> ``done`` / ``cancelled``); a notice's deadline as
absolute UTC (and the clock's reading with its epoch); a restarted service replays the accepted
grants and notices. The emulated trainer's
policy version after a restart is ``trained_batches`` (one update per consumed batch).

Idempotence. ``record_trajectory`` of an id that is already completed is ignored (returns False):
a trajectory is completed at most once. ``record_partial`` of a completed trajectory is ignored
too (a late abort after completion must not resurrect it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, TypeVar

from pearl.core.trajectory import TrajectoryRecord
from pearl.runtime.clock import hold_time
from pearl.runtime.journal_records import (  # the stored values are part of this module's API
    EventStatus,
    JournaledEvent,
    PartialOutput,
    RecoveredRun,
    record_from_json,
    record_to_json,
)

__all__ = ["EventStatus", "Journal", "JournalError", "JournaledEvent", "PartialOutput", "RecoveredRun",
           "first_unconsumed_batch", "record_from_json", "record_to_json"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS trajectories (
    traj_id   TEXT PRIMARY KEY,
    group_id  TEXT NOT NULL,
    seq       INTEGER NOT NULL,
    consumed  INTEGER NOT NULL DEFAULT 0,
    body      TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS partials (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    traj_id        TEXT NOT NULL,
    turn           INTEGER NOT NULL,
    tokens         TEXT NOT NULL,
    logprobs       TEXT NOT NULL,
    weight_version INTEGER NOT NULL,
    input_len      INTEGER NOT NULL DEFAULT -1,
    finished       INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS partials_traj ON partials(traj_id);
CREATE TABLE IF NOT EXISTS cluster_state (
    id      INTEGER PRIMARY KEY CHECK (id = 1),
    version INTEGER NOT NULL,
    body    TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    event_id  TEXT PRIMARY KEY,
    seq       INTEGER NOT NULL,
    kind      TEXT NOT NULL,
    digest    TEXT NOT NULL,
    notice_id TEXT,
    status    TEXT NOT NULL,
    body      TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_notice ON events(notice_id);
CREATE INDEX IF NOT EXISTS events_seq ON events(seq);
"""

log = logging.getLogger("pearl.journal")
T = TypeVar("T")


def _settle(fut: Future[Any], result: Any = None, error: BaseException | None = None) -> None:
    """Give a job's outcome to its future unless its waiter has gone: ``commit``'s awaiting task was
    cancelled (``asyncio.wrap_future`` then cancels the future). The write itself has landed
    either way; only nobody is waiting for the acknowledgement."""
    with contextlib.suppress(InvalidStateError):
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)


def _no_hold() -> None:
    return None


def _once(release: Callable[[], None]) -> Callable[[], None]:
    done = threading.Event()

    def once() -> None:
        if not done.is_set():
            done.set()
            release()

    return once


@dataclass(frozen=True, slots=True)
class _Job:
    """One call on the writer thread: ``op`` runs there, its outcome goes to ``future``;
    ``release`` lets a virtual-time replay move on (``pearl.runtime.clock.hold_time``)."""

    op: Callable[[], Any]
    future: Future[Any]
    release: Callable[[], None]
    what: str


class JournalError(RuntimeError):
    """The journal file could not be opened or is not a PEARL journal; names the path and what to do."""


# ------------------------------------------------------------------------------------ journal
class Journal:
    """A durable journal in one SQLite file (WAL mode). See the module docstring for the contract.

    Every statement runs on the journal's writer thread, one job at a time in submission order.
    The ``record_*`` and read methods block their caller until their job is done (tools, tests,
    start-up); the event loop uses ``post`` (queue a job, do not wait) and ``commit`` (await it).
    A job that fails with ``sqlite3.OperationalError`` (disk full, I/O error, database locked) is
    retried with back-off (``retry_s`` doubling up to ``max_retry_s``) and the journal is *faulted*:
    ``fault`` names the cause until a write succeeds again; later jobs wait behind it, in order."""

    def __init__(self, path: str | Path, synchronous: Literal["NORMAL", "FULL"] = "NORMAL", *,
                 busy_timeout_s: float = 5.0, retry_s: float = 0.1, max_retry_s: float = 2.0) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False,
                                       timeout=busy_timeout_s)
        except (OSError, sqlite3.Error) as e:
            raise JournalError(f"cannot open journal {self.path}: {e} (check the directory exists and is writable)") from None
        try:
            mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise JournalError(f"journal {self.path}: SQLite refused WAL mode (got {mode!r}); use a local disk")
            self._db.execute(f"PRAGMA synchronous={synchronous}")
            self._db.executescript(_SCHEMA)
            row = self._db.execute("SELECT COALESCE(MAX(seq), 0) FROM trajectories").fetchone()
            erow = self._db.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()
        except sqlite3.DatabaseError as e:
            self._db.close()
            raise JournalError(f"journal {self.path} is not a usable SQLite database ({e}); move it away or pick "
                               "another path") from None
        self._seq = int(row[0])
        self._event_seq = int(erow[0])
        self.writes = 0
        #: why the journal cannot write now (None: it can); set by the writer thread
        self.fault: str | None = None
        self.fault_since: float | None = None
        self._retry_s, self._max_retry_s = retry_s, max_retry_s
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._waiting = 0
        self._held: dict[int, Callable[[], None]] = {}  # job -> its hold on a virtual clock
        self._count = threading.Lock()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._write_loop, name=f"journal-{self.path.name}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the writer thread
    @property
    def waiting(self) -> int:
        """Jobs queued or running on the writer thread."""
        return self._waiting

    def post(self, op: Callable[[], T], what: str = "write") -> Future[T]:
        """Queue ``op`` (a call of this journal's methods) on the writer thread; returns at once."""
        fut: Future[T] = Future()
        if not self._thread.is_alive():
            fut.set_exception(JournalError(f"journal {self.path} is closed; {what} was not written"))
            return fut
        release = _no_hold
        if self.fault is None:  # a failing disk holds no replay still
            with contextlib.suppress(RuntimeError):  # no loop in this thread
                release = _once(hold_time(asyncio.get_running_loop()))
        job = _Job(op, fut, release, what)
        with self._count:
            self._waiting += 1
            self._held[id(job)] = release
        self._jobs.put(job)
        return fut

    async def commit(self, op: Callable[[], T], what: str = "write") -> T:
        """``op`` on the writer thread, awaited: the event loop never waits on the disk."""
        return await asyncio.wrap_future(self.post(op, what))

    async def flush(self) -> None:
        """Wait until every job queued before this call is done."""
        await self.commit(lambda: None, "flush")

    def _sync(self, op: Callable[[], T], what: str) -> T:
        if threading.current_thread() is self._thread:
            return op()
        return self.post(op, what).result()

    def _write_loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                self._run(job)
            except BaseException as e:  # the one writer thread must outlive any one job
                log.error("journal %s: %s failed on the writer thread (%s: %s); the next writes go on",
                          self.path, job.what, type(e).__name__, e)
                _settle(job.future, error=e)
            with self._count:
                self._waiting -= 1
                self._held.pop(id(job), None)
            job.release()

    def _run(self, job: _Job) -> None:
        delay = self._retry_s
        while True:
            try:
                result = job.op()
            except sqlite3.OperationalError as e:
                self._faulted(job.what, e)
                if self._closing.wait(delay):
                    _settle(job.future, error=JournalError(f"journal {self.path}: closed while {job.what} "
                                                           f"waited for the disk ({e})"))
                    return
                delay = min(delay * 2, self._max_retry_s)
                continue
            except BaseException as e:
                _settle(job.future, error=e)
                return
            if self.fault is not None:
                log.warning("journal %s: writable again after %.1f s; %d queued write(s) follow", self.path,
                            time.monotonic() - (self.fault_since or time.monotonic()), self._waiting - 1)
                self.fault, self.fault_since = None, None
            _settle(job.future, result)
            return

    def _faulted(self, what: str, e: sqlite3.OperationalError) -> None:
        cause = str(e)
        kind = ("disk full" if "full" in cause else "database locked" if "locked" in cause or "busy" in cause
                else "I/O error")
        reason = f"{kind}: {what} to {self.path} failed ({cause}); retrying, writes wait in memory"
        if self.fault is None:
            self.fault_since = time.monotonic()
            log.error("journal %s", reason)
        self.fault = reason
        with self._count:  # a virtual-time replay does not wait on a failing disk
            held, self._held = list(self._held.values()), {}
        for release in held:
            release()

    def set_max_pages(self, pages: int | None) -> int:
        """Cap the database file at ``pages`` pages (SQLite ``max_page_count``; None: no cap beyond
        SQLite's own): past it every write fails as on a full disk. The reliability drills use it to
        fill and free "the disk" for real. It takes effect at once, ahead of the queued writes (a
        freed disk must not wait behind the write that found it full; SQLite serialises the two
        threads' calls on the connection). Returns the cap in force."""
        n = 4294967294 if pages is None else max(1, int(pages))
        return int(self._db.execute(f"PRAGMA max_page_count={n}").fetchone()[0])

    def page_count(self) -> int:
        return int(self._sync(lambda: self._db.execute("PRAGMA page_count").fetchone()[0], "page count"))

    # ------------------------------------------------------------------ context manager
    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self, drain_s: float = 10.0) -> None:
        """Finish the queued jobs (at most ``drain_s`` seconds while the disk fails), then close."""
        if not self._thread.is_alive():
            return
        self._jobs.put(None)
        self._thread.join(drain_s)
        if self._thread.is_alive():
            log.error("journal %s: closing with %d write(s) not on disk (%s)", self.path, self._waiting, self.fault)
            self._closing.set()
            self._thread.join()
        self._db.close()

    # ------------------------------------------------------------------ writes (one transaction each)
    def _tx(self, statements: Iterable[tuple[str, Sequence[Any]]]) -> None:
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            for sql, params in statements:
                db.execute(sql, params)
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
            raise
        self.writes += 1

    def _record_trajectory(self, rec: TrajectoryRecord) -> bool:
        """Journal a completed trajectory and drop its partial outputs, atomically.

        Returns False (and writes nothing) if ``rec.traj_id`` is already journaled as completed."""
        if self._db.execute("SELECT 1 FROM trajectories WHERE traj_id=?", (rec.traj_id,)).fetchone():
            return False
        self._tx(
            [
                ("INSERT INTO trajectories(traj_id, group_id, seq, body) VALUES (?,?,?,?)",
                 (rec.traj_id, rec.group_id, self._seq + 1, record_to_json(rec))),
                ("DELETE FROM partials WHERE traj_id=?", (rec.traj_id,)),
            ]
        )
        self._seq += 1
        return True

    def _record_partial(
        self, traj_id: str, turn: int, tokens: Sequence[int], logprobs: Sequence[float], weight_version: int,
        *, input_len: int = -1, finished: bool = False,
    ) -> bool:
        """Journal one response part of an in-flight trajectory (``finished``: the request ended
        normally, the turn's output is complete). Ignored (False) if the trajectory is already
        completed or the part is empty and unfinished."""
        if len(tokens) != len(logprobs):
            raise ValueError(f"partial of {traj_id!r} turn {turn}: {len(tokens)} tokens but {len(logprobs)} logprobs")
        if not tokens and not finished:
            return False
        if self._db.execute("SELECT 1 FROM trajectories WHERE traj_id=?", (traj_id,)).fetchone():
            return False
        self._tx(
            [
                ("INSERT INTO partials(traj_id, turn, tokens, logprobs, weight_version, input_len, finished) "
                 "VALUES (?,?,?,?,?,?,?)",
                 (traj_id, int(turn), json.dumps([int(t) for t in tokens]),
                  json.dumps([float(x) for x in logprobs]), int(weight_version), int(input_len), int(finished))),
            ]
        )
        return True

    def _drop_partials(self, traj_id: str) -> None:
        """Forget the partials of a trajectory that failed (it will not be resumed)."""
        self._tx([("DELETE FROM partials WHERE traj_id=?", (traj_id,))])

    def _record_consumed(self, traj_ids: Iterable[str]) -> None:
        """Mark completed trajectories as consumed: the trainer's update on them is durable
        (``Controller.batch_trained``); they are never re-delivered."""
        ids = [(t,) for t in traj_ids]
        if not ids:
            return
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            db.executemany("UPDATE trajectories SET consumed=1 WHERE traj_id=?", ids)
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
            raise
        self.writes += 1

    def _record_state(self, state: Mapping[str, Any]) -> None:
        """Journal the GPU-worker-role table (``ClusterState.to_dict()``); only the latest is kept."""
        version = state.get("version", 0)
        self._tx(
            [
                ("INSERT INTO cluster_state(id, version, body) VALUES (1,?,?) "
                 "ON CONFLICT(id) DO UPDATE SET version=excluded.version, body=excluded.body",
                 (int(version) if isinstance(version, int) else 0, json.dumps(state, default=str))),
            ]
        )

    def _record_event(self, ev: JournaledEvent) -> bool:
        """Journal an accepted elastic event (one transaction, committed before the admin API answers
        202). False (nothing written) if its id is already journaled."""
        if self._db.execute("SELECT 1 FROM events WHERE event_id=?", (ev.event_id,)).fetchone():
            return False
        seq = self._event_seq + 1  # kept in memory: admission costs the same at any journal size
        self._tx([("INSERT INTO events(event_id, seq, kind, digest, notice_id, status, body) VALUES (?,?,?,?,?,?,?)",
                   (ev.event_id, seq, ev.kind, ev.digest, ev.notice_id, ev.status,
                    json.dumps(dict(ev.body), separators=(",", ":"), default=str)))])
        self._event_seq = seq
        return True

    def _set_event_status(self, event_id: str, status: EventStatus) -> None:
        self._tx([("UPDATE events SET status=? WHERE event_id=?", (status, event_id))])

    def _drop_event(self, event_id: str) -> None:
        """Forget an event the controller rejected (a corrected retry may reuse its id)."""
        self._tx([("DELETE FROM events WHERE event_id=?", (event_id,))])

    def _events(self) -> tuple[JournaledEvent, ...]:
        """Every journaled elastic event, in acceptance order."""
        return tuple(
            JournaledEvent(eid, kind, digest, status, MappingProxyType(json.loads(body)), nid, seq)
            for eid, seq, kind, digest, nid, status, body in self._db.execute(
                "SELECT event_id, seq, kind, digest, notice_id, status, body FROM events ORDER BY seq")
        )

    # ------------------------------------------------------------------ reads
    def _consumed_ids(self) -> frozenset[str]:
        """Ids of the completed trajectories the trainer consumed (its update on them is durable)."""
        return frozenset(t for (t,) in self._db.execute("SELECT traj_id FROM trajectories WHERE consumed=1"))

    def trained_batches(self, batch_size: int) -> int:
        """Rollout batches the trainer consumed, in order: ``first_unconsumed_batch`` of the
        consumed ids. A trainer making one update per batch (the emulated one) stands at this
        policy version after a restart."""
        return first_unconsumed_batch(self.consumed_ids(), batch_size)

    def _completed(self) -> tuple[TrajectoryRecord, ...]:
        """Every journaled completed trajectory, in completion order."""
        rows = self._db.execute("SELECT body FROM trajectories ORDER BY seq").fetchall()
        return tuple(record_from_json(b) for (b,) in rows)

    def _completed_ids(self) -> frozenset[str]:
        return frozenset(t for (t,) in self._db.execute("SELECT traj_id FROM trajectories"))

    def _partials(self) -> dict[str, tuple[PartialOutput, ...]]:
        out: dict[str, list[PartialOutput]] = {}
        for seq, tid, turn, toks, lps, v, n_in, fin in self._db.execute(
            "SELECT seq, traj_id, turn, tokens, logprobs, weight_version, input_len, finished FROM partials ORDER BY seq"
        ):
            out.setdefault(tid, []).append(
                PartialOutput(tid, turn, tuple(json.loads(toks)), tuple(json.loads(lps)), v, seq, n_in, bool(fin))
            )
        return {k: tuple(v) for k, v in out.items()}

    def _state(self) -> dict[str, Any] | None:
        row = self._db.execute("SELECT body FROM cluster_state WHERE id=1").fetchone()
        return None if row is None else json.loads(row[0])

    def _recover(self) -> RecoveredRun:
        """Everything a restarted controller needs (one consistent read transaction)."""
        self._db.execute("BEGIN")
        try:
            completed = self._completed()
            consumed = self._consumed_ids()
            partials = self._partials()
            state = self._state()
        finally:
            self._db.execute("COMMIT")
        return RecoveredRun(completed, MappingProxyType(partials), state, consumed)

    def _counts(self) -> dict[str, int]:
        """Row counts (for reports): completed, consumed, partials, partial_tokens, in_flight."""
        c = self._db.execute("SELECT COUNT(*), COALESCE(SUM(consumed),0) FROM trajectories").fetchone()
        p = self._db.execute("SELECT COUNT(*), COUNT(DISTINCT traj_id) FROM partials").fetchone()
        toks = sum(len(json.loads(t)) for (t,) in self._db.execute("SELECT tokens FROM partials"))
        e = self._db.execute("SELECT COUNT(*), COALESCE(SUM(status='accepted'),0) FROM events").fetchone()
        return {"completed": int(c[0]), "consumed": int(c[1]), "partials": int(p[0]), "in_flight": int(p[1]),
                "partial_tokens": toks, "events": int(e[0]), "events_pending": int(e[1])}

    # ------------------------------------------------------------------ the public calls (on the writer thread)
    def record_trajectory(self, rec: TrajectoryRecord) -> bool:
        """Journal a completed trajectory and drop its partial outputs, atomically. False (nothing
        written) if ``rec.traj_id`` is already journaled as completed."""
        return self._sync(lambda: self._record_trajectory(rec), f"trajectory {rec.traj_id}")

    def record_partial(
        self, traj_id: str, turn: int, tokens: Sequence[int], logprobs: Sequence[float], weight_version: int,
        *, input_len: int = -1, finished: bool = False,
    ) -> bool:
        """Journal one response part of an in-flight trajectory (``finished``: the request ended
        normally, the turn's output is complete). Ignored (False) if the trajectory is already
        completed or the part is empty and unfinished."""
        if len(tokens) != len(logprobs):
            raise ValueError(f"partial of {traj_id!r} turn {turn}: {len(tokens)} tokens but {len(logprobs)} logprobs")
        return self._sync(lambda: self._record_partial(traj_id, turn, tokens, logprobs, weight_version,
                                                       input_len=input_len, finished=finished),
                          f"partial of {traj_id}")

    def drop_partials(self, traj_id: str) -> None:
        """Forget the partials of a trajectory that failed (it will not be resumed)."""
        self._sync(lambda: self._drop_partials(traj_id), f"drop partials of {traj_id}")

    def record_consumed(self, traj_ids: Iterable[str]) -> None:
        """Mark completed trajectories as consumed: the trainer's update on them is durable
        (``Controller.batch_trained``); they are never re-delivered."""
        ids = list(traj_ids)
        self._sync(lambda: self._record_consumed(ids), "consumed batch")

    def record_state(self, state: Mapping[str, Any]) -> None:
        """Journal the GPU-worker-role table (``ClusterState.to_dict()``); only the latest is kept."""
        self._sync(lambda: self._record_state(state), "cluster state")

    def record_event(self, ev: JournaledEvent) -> bool:
        """Journal an accepted elastic event (one transaction, committed before the admin API answers
        202). False (nothing written) if its id is already journaled."""
        return self._sync(lambda: self._record_event(ev), f"event {ev.event_id}")

    def set_event_status(self, event_id: str, status: EventStatus) -> None:
        self._sync(lambda: self._set_event_status(event_id, status), f"status of event {event_id}")

    def drop_event(self, event_id: str) -> None:
        """Forget an event the controller rejected (a corrected retry may reuse its id)."""
        self._sync(lambda: self._drop_event(event_id), f"drop event {event_id}")

    def events(self) -> tuple[JournaledEvent, ...]:
        """Every journaled elastic event, in acceptance order."""
        return self._sync(self._events, "read events")

    def consumed_ids(self) -> frozenset[str]:
        """Ids of the completed trajectories the trainer consumed (its update on them is durable)."""
        return self._sync(self._consumed_ids, "read consumed")

    def completed(self) -> tuple[TrajectoryRecord, ...]:
        """Every journaled completed trajectory, in completion order."""
        return self._sync(self._completed, "read completed")

    def completed_ids(self) -> frozenset[str]:
        return self._sync(self._completed_ids, "read completed ids")

    def partials(self) -> dict[str, tuple[PartialOutput, ...]]:
        return self._sync(self._partials, "read partials")

    def state(self) -> dict[str, Any] | None:
        return self._sync(self._state, "read state")

    def recover(self) -> RecoveredRun:
        """Everything a restarted controller needs (one consistent read transaction)."""
        return self._sync(self._recover, "recover")

    def counts(self) -> dict[str, int]:
        """Row counts (for reports): completed, consumed, partials, partial_tokens, in_flight."""
        return self._sync(self._counts, "counts")


def first_unconsumed_batch(consumed: Iterable[str], batch_size: int) -> int:
    """The first rollout batch ``r`` whose ``batch_size`` trajectories (ids ``b<r>-g<g>-s<s>``)
    were not all consumed by the trainer; batches before it are never run again."""
    per: dict[int, int] = {}
    for tid in consumed:
        head = tid.split("-", 1)[0]
        if head.startswith("b") and head[1:].isdigit():
            per[int(head[1:])] = per.get(int(head[1:]), 0) + 1
    r = 0
    while per.get(r, 0) >= batch_size:
        r += 1
    return r
