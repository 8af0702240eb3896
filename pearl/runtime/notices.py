"""The Elastic Scheduler's reclaim notices: one armed notice per ``ReclaimKey`` and its timer.

Life cycle of a notice (every step but the timer's sleep runs inside the scheduler's queue)::

    ReclaimNotice handled -> ``note``: a new key is armed (timer at ``deadline - lead_s``, at once
                             if that has passed); a known key not yet shrinking tightens (the
                             earliest deadline wins: the timer is re-armed earlier, never later)
    timer fires           -> ``queue_shrink(notice)``: the scheduler queues the shrink as an urgent
                             event and the timer ends once it was handled
    shrink handled        -> ``take`` (the notice is still armed and not started) ... shrink ...
                             ``finish``: its GPUs leave every other notice (a notice left with none
                             is dropped with its timer: a timer belongs to the grant it was armed
                             for, never to a re-grant)
    NoticeCancelled       -> ``cancel``: a pending shrink is dropped with its timer (too late once
                             it started)

The lead (``lead_s``) is measured, not assumed: ``L = max(m, k * max(d_1 .. d_n))`` with ``m`` the
configured ``shrink_margin_s``, ``d_i`` the last ``n = SHRINK_SAMPLES`` shrinks' durations from the
timer firing to the GPUs' release (queue wait, dispatch stop, server stop), ``k = SHRINK_LEAD_FACTOR``.
Before any shrink, ``L = m``. A notice armed earlier keeps its timer; the next one gets the new lead.

``validate`` answers ``submit`` before the event is queued: the GPUs must exist (or be preparing)
and be preemptible, the deadline finite; ``queued`` counts the notices submitted and not handled
yet (a cancellation may name one of them).

Public names: ``ArmedNotice``, ``NoticeBook``.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Set
from dataclasses import dataclass

from pearl.core.events import NoticeCancelled, ReclaimKey, ReclaimNotice
from pearl.core.state import ClusterState, Zone
from pearl.runtime.clock import Clock
from pearl.runtime.control import UnknownResourceError

SHRINK_SAMPLES = 8
SHRINK_LEAD_FACTOR = 1.5


@dataclass
class ArmedNotice:
    """A reclaim armed for ``key``: its GPUs go at ``deadline``; ``started``: its shrink runs."""

    key: ReclaimKey
    notice_id: str
    gpus: tuple[str, ...]
    deadline: float
    timer: asyncio.Task[None] | None = None
    started: bool = False
    fired_at: float | None = None  # when its timer fired (the shrink was queued)


class NoticeBook:
    """The armed notices (module docstring). ``timers``: the scheduler's set of owned timer tasks
    (cancelled and awaited by its ``stop``); ``queue_shrink``: queues a due shrink and returns once
    it was handled; ``log``: the scheduler's history."""

    def __init__(self, clock: Clock, shrink_margin_s: float, timers: set[asyncio.Task[None]],
                 queue_shrink: Callable[[ArmedNotice], Awaitable[None]], log: Callable[..., None]) -> None:
        self.clock = clock
        self.shrink_margin_s = shrink_margin_s
        self._took: deque[float] = deque(maxlen=SHRINK_SAMPLES)
        self.notices: dict[ReclaimKey, ArmedNotice] = {}
        self.queued: Counter[ReclaimKey] = Counter()  # submitted, not handled yet
        self._timers = timers
        self._queue_shrink = queue_shrink
        self._log = log

    def validate(self, ev: ReclaimNotice | NoticeCancelled, state: ClusterState, preparing: Set[str]) -> str:
        """The ``submit`` answer for ``ev``; raises ``ValueError`` / ``UnknownResourceError``."""
        if isinstance(ev, NoticeCancelled):
            if ev.key not in self.notices and not self.queued[ev.key]:
                raise UnknownResourceError("notice", ev.notice_id)
            return "notice cancellation queued"
        if not ev.gpu_ids:
            raise ValueError("gpu_ids: a reclaim notice must name at least one GPU")
        for g in ev.gpu_ids:
            if g not in state.gpus and g not in preparing:
                raise UnknownResourceError("GPU", g)
            if g in state.gpus and state.gpus[g].zone is not Zone.PREEMPTIBLE:
                raise ValueError(f"gpu_ids: {g} is a {state.gpus[g].zone.value} GPU; only preemptible "
                                 "GPUs can be reclaimed")
        if not math.isfinite(ev.deadline):
            raise ValueError(f"deadline: {ev.deadline} is not a finite clock time")
        known = self.notices.get(ev.key)
        if known is not None and not known.started:
            due = min(known.deadline, ev.deadline)
            return f"reclaim {ev.key.label}: shrink due by t={due:.1f} (the earliest deadline given)"
        return f"shrink of {len(ev.gpu_ids)} GPUs due by t={ev.deadline:.1f}"

    def note(self, ev: ReclaimNotice) -> bool:
        """Arm or tighten the notice of ``ev.key``; True when it is a new reclaim."""
        self.queued[ev.key] -= 1
        self.queued += Counter()  # drop the zero counts
        now = self.clock.now()
        known = self.notices.get(ev.key)
        if known is not None:  # the same reclaim again: the earliest deadline wins
            if known.started or ev.deadline >= known.deadline:
                self._log("reclaim_notice_kept", notice=known.notice_id, deadline=known.deadline,
                          given=ev.deadline, started=known.started)
                return False
            if known.timer is not None:
                known.timer.cancel()
            known.deadline = ev.deadline
            start = max(now, ev.deadline - self.lead_s)
            self._arm(known, start)
            self._log("reclaim_notice_tightened", notice=known.notice_id, deadline=ev.deadline, shrink_at=start)
            return False
        nid = ev.notice_id or ev.event_id or f"notice-{len(self.notices) + 1}"
        notice = ArmedNotice(ev.key, nid, tuple(ev.gpu_ids), ev.deadline)
        self.notices[ev.key] = notice
        start = max(now, ev.deadline - self.lead_s)
        self._arm(notice, start)
        self._log("reclaim_notice", notice=nid, gpus=list(ev.gpu_ids), deadline=ev.deadline, shrink_at=start)
        return True

    def _arm(self, notice: ArmedNotice, start: float) -> None:
        task = asyncio.get_running_loop().create_task(self._due(notice, start), name=f"shrink-{notice.notice_id}")
        notice.timer = task
        self._timers.add(task)
        task.add_done_callback(self._timers.discard)

    async def _due(self, notice: ArmedNotice, start: float) -> None:
        await self.clock.sleep_until(start)
        notice.fired_at = self.clock.now()
        await self._queue_shrink(notice)

    @property
    def lead_s(self) -> float:
        """How long before its deadline a shrink starts (module docstring: ``L``)."""
        return max(self.shrink_margin_s, SHRINK_LEAD_FACTOR * max(self._took, default=0.0))

    def observe(self, notice: ArmedNotice, released_at: float) -> float:
        """A shrink of ``notice`` released its GPUs at ``released_at``: one duration sample ``d``
        (from its timer firing, or from now for a shrink started without one); the new lead."""
        t0 = notice.fired_at if notice.fired_at is not None else released_at
        self._took.append(max(0.0, released_at - t0))
        return self.lead_s

    def take(self, notice: ArmedNotice) -> bool:
        """The shrink of ``notice`` starts now: False when it was cancelled, dropped with its GPUs
        or already shrunk by an earlier timer of the same reclaim."""
        if notice.started or self.notices.get(notice.key) is not notice:
            return False
        notice.started = True
        return True

    def finish(self, notice: ArmedNotice) -> None:
        """The shrink of ``notice`` is done: it leaves the book and its GPUs leave every other notice."""
        if self.notices.get(notice.key) is notice:
            del self.notices[notice.key]
        gone = set(notice.gpus)
        for key, n in list(self.notices.items()):
            if n.started or not gone.intersection(n.gpus):
                continue
            n.gpus = tuple(g for g in n.gpus if g not in gone)
            if not n.gpus:
                if n.timer is not None:
                    n.timer.cancel()
                del self.notices[key]
                self._log("notice_dropped", notice=n.notice_id, reason="its GPUs were reclaimed")

    def cancel(self, ev: NoticeCancelled) -> None:
        notice = self.notices.get(ev.key)
        if notice is None or notice.started:
            self._log("notice_cancel_ignored", notice=ev.notice_id, reason="shrink already done")
            return
        if notice.timer is not None:
            notice.timer.cancel()
        del self.notices[ev.key]
        self._log("notice_cancelled", notice=ev.notice_id)

    def gpus(self) -> set[str]:
        """Every GPU under a notice."""
        return {g for n in self.notices.values() for g in n.gpus}

    def close(self) -> None:
        for n in self.notices.values():
            if n.timer is not None:
                n.timer.cancel()
