"""Oracle knowledge: grant lifetimes, short grants declined, reachable budgets."""

from __future__ import annotations

from pearl.config import ClusterSpec
from pearl.core.events import GpusGranted, ReclaimNotice
from pearl.sim.oracle import grant_lifetimes, oracle_events, reachable_budgets
from pearl.sim.traces import Trace, gpu_timeline, trace_events


def test_lifetimes_and_short_grant_declined() -> None:
    tl = gpu_timeline(Trace("x", 60.0, (0, 4, 6, 4, 4, 4)), ClusterSpec())
    ev = trace_events(tl, notice_s=30.0)
    life = grant_lifetimes(ev, end_s=tl.duration_s)
    assert life == {"grant-1": 360.0 - 60.0, "grant-2": 180.0 - 120.0}
    kept = oracle_events(ev, tl.duration_s, expansion_s=76.0)
    assert [type(e.event) for e in kept] == [GpusGranted]  # 60 s grant and its reclaim dropped
    kept2 = oracle_events(ev, tl.duration_s, expansion_s=30.0)
    assert [type(e.event) for e in kept2] == [GpusGranted, GpusGranted, ReclaimNotice]


def test_reachable_budgets() -> None:
    tl = gpu_timeline(Trace("x", 60.0, (0, 4, 12)), ClusterSpec())
    assert reachable_budgets(tl, ClusterSpec()) == [4, 8, 16, 20, 24, 32]
    assert reachable_budgets(None, ClusterSpec(reserved_gpus=8), borrow=False) == [8]
