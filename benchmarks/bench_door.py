"""Event admission at the door against the journal's size: 0, 50k and 200k journaled events.

For each size N a journal file is filled with N done grants (one SQL transaction, written straight
into the ``events`` table the way ``Journal.record_event`` lays them out), then a
``StateControlPlane`` is opened on it (its ``EventDoor`` indexes the journal once, at start) and
``K`` new grants are admitted through ``EventDoor.admit``, each journaled on the writer thread
before it is applied, plus ``K`` ``/healthz``-equivalent reads (``EventDoor.fault``). Reported:
the median admission time (wall clock: it includes the commit on the writer thread) and the
ratio to N = 0. Constant cost means ratios near 1.

    python benchmarks/bench_door.py [--sizes 0,50000,200000] [--k 200] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from pearl.admin.local import StateControlPlane
from pearl.core.events import EventKind, GpusGranted, GrantedGpu
from pearl.core.state import ClusterState, Gpu, Zone
from pearl.runtime.door import Arrival
from pearl.runtime.journal import Journal


def fill(path: Path, n: int) -> None:
    Journal(path).close()  # the schema
    db = sqlite3.connect(str(path), isolation_level=None)
    db.execute("BEGIN")
    db.executemany(
        "INSERT INTO events(event_id, seq, kind, digest, notice_id, status, body) VALUES (?,?,?,?,?,?,?)",
        ((f"old-{i}", i + 1, "gpus_granted", f"d{i}", None, "done",
          json.dumps({"gpus": [{"gpu_id": f"old{i}", "node": "node0", "instance_id": None}], "generation": i + 1}))
         for i in range(n)))
    db.execute("COMMIT")
    db.close()


async def admit_k(path: Path, k: int) -> tuple[float, float, float]:
    """(median admission s, median fault read s, start-up index s)."""
    t0 = time.perf_counter()
    journal = Journal(path)
    control = StateControlPlane(ClusterState.build([Gpu("r0", Zone.RESERVED, "node0")]), time.monotonic, {},
                                journal=journal)
    start = time.perf_counter() - t0
    admits, reads = [], []
    for i in range(k):
        ev = GpusGranted((GrantedGpu(f"new{i}", "node0"),), event_id=f"new-{i}")
        a = Arrival(ev.event_id, f"digest-{i}", EventKind.GPUS_GRANTED, lambda ev=ev: ev)
        t = time.perf_counter()
        await control.door.admit(a)
        admits.append(time.perf_counter() - t)
        t = time.perf_counter()
        _ = control.door.fault
        reads.append(time.perf_counter() - t)
    journal.close()
    return statistics.median(admits), statistics.median(reads), start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="0,50000,200000")
    ap.add_argument("--k", type=int, default=200)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for n in (int(x) for x in args.sizes.split(",")):
            path = Path(d) / f"j{n}.sqlite"
            fill(path, n)
            adm, read, start = asyncio.run(admit_k(path, args.k))
            rows.append({"events": n, "admit_ms": adm * 1e3, "healthz_us": read * 1e6, "startup_s": start})
    base = rows[0]["admit_ms"]
    if args.json:
        print(json.dumps(rows))
        return
    print(f"{'journaled events':>16}  {'admit (median)':>14}  {'vs 0':>6}  {'fault read':>10}  {'start-up index':>14}")
    for r in rows:
        print(f"{r['events']:>16,}  {r['admit_ms']:>11.2f} ms  {r['admit_ms'] / base:>5.2f}x  "
              f"{r['healthz_us']:>7.2f} us  {r['startup_s']:>12.2f} s")


if __name__ == "__main__":
    main()
