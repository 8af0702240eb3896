"""Observe a running controller from outside and fold what it saw into a system's summary.

Role: ``Sampler`` polls the controller's public face (``ControlPlane``: ``state_dict()``,
``progress()``) on the virtual clock every ``period_s`` and records, per GPU, what it was doing;
``GpuLedger`` integrates GPU-hours by zone and builds the role timeline for the plots. It only
reads public snapshots, so it measures the runtime without reaching into it.

Public names: ``category_of``, ``GpuLedger``, ``Sampler``, ``cost_usd``.

Per-GPU category (``category_of``), from a ``ClusterState.to_dict()`` snapshot::

    worker active or draining on it   overlap zone -> "borrowed", else the worker's role
                                      ("prefill" | "decode" | "colocated")
    otherwise                         "idle" (no worker, or initializing / inactive); an overlap
                                      GPU not lent to rollout is training's and is not drawn

GPU-hours by zone (a modelling choice, written down here): ``reserved`` = reserved GPUs present;
``preemptible`` = preemptible GPUs present in the table (held from grant to reclaim, paid even if
idle); ``borrowed`` = overlap GPUs lent to rollout (no extra cost: training pays for them);
``training`` = the training GPUs for the whole run. Cost of the run (``cost_usd``)::

    cost = h_reserved p_reserved + h_preemptible p_preemptible + h_training p_overlap

Sampling resolution ``period_s`` (default 5 s) bounds the timeline's time error; GPU-hours are
integrated with the state held constant between samples.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pearl.config import PricesSpec
from pearl.runtime.clock import Clock
from pearl.tasks import cancel_and_wait


def category_of(state: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """gpu_id -> (zone, category) for every GPU drawn (see module docstring)."""
    owner: dict[str, Mapping[str, Any]] = {}
    for w in state.get("workers", []):
        for g in w["gpus"]:
            owner[g] = w
    out: dict[str, tuple[str, str]] = {}
    for g in state.get("gpus", []):
        gid, zone = g["gpu_id"], g["zone"]
        w = owner.get(gid)
        serving = w is not None and w["status"] in ("active", "draining")
        if zone == "overlap":
            if not g.get("lent"):
                continue
            out[gid] = (zone, "borrowed" if serving else "idle")
        else:
            out[gid] = (zone, w["role"] if serving and w is not None else "idle")
    return out


@dataclass
class GpuLedger:
    """Integrates samples into GPU-hours and timeline segments ``[gpu, t0, t1, category]``."""

    gpu_s: dict[str, float] = field(default_factory=lambda: {"reserved": 0.0, "preemptible": 0.0, "borrowed": 0.0})
    role_s: dict[str, float] = field(default_factory=dict)
    segments: list[list[Any]] = field(default_factory=list)
    _open: dict[str, list[Any]] = field(default_factory=dict)
    _last_t: float | None = None
    _last: dict[str, tuple[str, str]] = field(default_factory=dict)

    def observe(self, t: float, cats: Mapping[str, tuple[str, str]]) -> None:
        if self._last_t is not None:
            dt = t - self._last_t
            for zone, cat in self._last.values():
                key = "borrowed" if zone == "overlap" else zone
                self.gpu_s[key] = self.gpu_s.get(key, 0.0) + dt
                self.role_s[cat] = self.role_s.get(cat, 0.0) + dt
        for gid, seg in list(self._open.items()):
            now = cats.get(gid)
            if now is None or now[1] != seg[3]:
                seg[2] = t
                if seg[2] > seg[1]:
                    self.segments.append(seg)
                del self._open[gid]
        for gid, (_zone, cat) in cats.items():
            if gid not in self._open:
                self._open[gid] = [gid, t, t, cat]
        self._last_t = t
        self._last = dict(cats)

    def close(self, t: float) -> None:
        self.observe(t, {})


class Sampler:
    """Background task: every ``period_s`` record the controller's state and progress."""

    def __init__(self, control: Any, clock: Clock, period_s: float = 5.0) -> None:
        self.control = control
        self.clock = clock
        self.period_s = period_s
        self.ledger = GpuLedger()
        self.completed: list[tuple[float, int]] = []  # (t, trajectories_completed)
        self._task: asyncio.Task[None] | None = None

    def sample(self) -> None:
        t = self.clock.now()
        self.ledger.observe(t, category_of(self.control.state_dict()))
        self.completed.append((t, int(self.control.progress().trajectories_completed)))

    async def _run(self) -> None:
        while True:
            self.sample()
            await self.clock.sleep(self.period_s)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-sampler")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        self.sample()
        self.ledger.close(self.clock.now())


def cost_usd(gpu_hours: Mapping[str, float], prices: PricesSpec) -> float:
    return (
        gpu_hours.get("reserved", 0.0) * prices.reserved
        + gpu_hours.get("preemptible", 0.0) * prices.preemptible
        + gpu_hours.get("training", 0.0) * prices.overlap
    )
