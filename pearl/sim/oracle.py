"""The hindsight oracle: PEARL that knows the whole trace and the empirically best allocation.

What the oracle knows that PEARL does not (and how it uses it, through the same runtime, so every
transition cost is still paid):

1. **Grant lifetimes** (``grant_lifetimes``): for every GpusGranted event, how long until those
   GPUs are reclaimed (or the segment ends). A grant is taken only if it pays back its expansion:
   ``lifetime - (c_prep + c_final) > 0`` with the paper's Table 3 costs (``EXPANSION_S``). (The
   runtime's gates stay on: ``gate_enabled`` governs the borrow gate too, and there is no separate
   expansion knob; with the default expected lifetime the expansion gate admits these grants.)
2. **The best allocation per worker budget** (``allocation_overrides``): for each budget the
   replay can reach (reserved + every preemptible level in the segment, with and without the
   borrowed training GPUs), the allocation with the lowest *measured* batch makespan among
   colocation and every P:D split, found by running one rollout batch per candidate in the
   emulator (``pearl.sim.simulate.best_allocation_search``). The runtime uses it instead of the
   decision engine at that budget (``policy.allocation_overrides``).

It does not know the workload's random draws (same seed as every system) and does not skip
transition costs: it is an upper bound on *policy* quality, not on the hardware.

Public names: ``grant_lifetimes``, ``oracle_events``, ``reachable_budgets``, ``EXPANSION_S``.
"""

from __future__ import annotations

from collections.abc import Sequence

from pearl.config import ClusterSpec
from pearl.core.events import GpusGranted, ReclaimNotice
from pearl.sim.traces import GpuTimeline, TimedEvent

#: Expansion preparation + finalisation, paper Table 3 midpoints (61.5 s + 14.5 s).
EXPANSION_S = 76.0


def grant_lifetimes(events: Sequence[TimedEvent], end_s: float) -> dict[str, float]:
    """event_id of each grant -> seconds until the first of its GPUs is reclaimed (deadline), or the end."""
    out: dict[str, float] = {}
    for i, e in enumerate(events):
        if not isinstance(e.event, GpusGranted):
            continue
        ids = {g.gpu_id for g in e.event.gpus}
        until = end_s
        for later in events[i + 1 :]:
            ev = later.event
            if isinstance(ev, ReclaimNotice) and ids.intersection(ev.gpu_ids):
                until = ev.deadline
                break
        out[e.event.event_id] = until - e.at_s
    return out


def oracle_events(events: Sequence[TimedEvent], end_s: float, expansion_s: float = EXPANSION_S) -> list[TimedEvent]:
    """The trace's events minus grants that cannot pay back their expansion, and minus reclaims of
    GPUs that were never taken (a reclaim of only-declined GPUs is dropped; a mixed one keeps the
    taken GPUs)."""
    life = grant_lifetimes(events, end_s)
    declined: set[str] = set()
    out: list[TimedEvent] = []
    for e in events:
        ev = e.event
        if isinstance(ev, GpusGranted):
            if life[ev.event_id] <= expansion_s:
                declined |= {g.gpu_id for g in ev.gpus}
                continue
            declined -= {g.gpu_id for g in ev.gpus}
            out.append(e)
        else:
            keep = tuple(g for g in ev.gpu_ids if g not in declined)
            if keep:
                out.append(e if len(keep) == len(ev.gpu_ids) else TimedEvent(
                    e.at_s, ReclaimNotice(keep, ev.deadline, ev.notice_id, ev.event_id)))
    return out


def reachable_budgets(tl: GpuTimeline | None, cluster: ClusterSpec, borrow: bool = True) -> list[int]:
    """Worker budgets (tp_size = 1: GPUs) the replay can reach: reserved + each preemptible level,
    and the same + the training GPUs when borrowing."""
    levels = {0} if tl is None else set(tl.gpus)
    base = sorted({(cluster.reserved_gpus + p) // cluster.tp_size for p in levels})
    out = set(b for b in base if b >= 1)
    if borrow:
        out |= {b + cluster.training_gpus // cluster.tp_size for b in base}
    return sorted(out)
