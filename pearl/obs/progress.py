"""A live progress panel (``rich``) for long runs and replays.

Life cycle: ``start()`` opens a ``rich.live.Live`` on stderr, ``update(sample)`` redraws it (the
``RunObserver`` calls it once per sample, so it needs no task of its own), ``stop()`` closes it.
The panel's last rows are the latest elastic events (``pearl.obs.story``). ``pearl run`` opens it
only on a terminal; elsewhere the story prints one plain line per event and per step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

if TYPE_CHECKING:
    from pearl.obs.observer import Sample


def render(title: str, s: Sample, events: Sequence[str] = ()) -> Table:
    p = s.progress
    t = Table(title=title, show_header=False, expand=False)
    t.add_column("what", style="bold")
    t.add_column("value")
    t.add_row("uptime", f"{p.uptime_s:,.0f} s")
    t.add_row("rollout step / train step", f"{p.rollout_step} / {p.train_step} (weights v{p.weight_version})")
    t.add_row("trajectories", f"{p.trajectories_completed} done, {p.trajectories_in_flight} in flight, "
                              f"{p.trajectories_interrupted} interrupted, {p.trajectories_lost} lost")
    t.add_row("throughput", f"{p.throughput_traj_per_h:,.1f} traj/h")
    mode = "-" if s.decision is None else f"{s.decision.get('label')} ({s.decision.get('mode')})"
    t.add_row("PD allocation", mode)
    t.add_row("GPUs per role", ", ".join(f"{k} {v}" for k, v in sorted(s.gpus_per_category.items())) or "-")
    known = {**p.extra, **s.batch}
    for key in ("reward_mean", "staleness"):
        if isinstance(known.get(key), int | float):
            t.add_row(key.replace("_", " "), f"{known[key]:.3g}")
    for i, line in enumerate(events):
        t.add_row("elastic events" if i == 0 else "", line)
    return t


class LiveProgress:
    def __init__(self, title: str, console: Console | None = None) -> None:
        self.title = title
        self.console = console or Console(stderr=True)
        self._live: Live | None = None

    def start(self) -> None:
        self._live = Live(console=self.console, refresh_per_second=2, transient=False)
        self._live.start()

    def update(self, sample: Any, events: Sequence[str] = ()) -> None:
        if self._live is not None:
            self._live.update(render(self.title, sample, events))

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
