"""Runtime Tracker (paper Sec. 4.1.1, 5): request telemetry in, refit profiles out.

Life cycle: the Pipeline Scheduler calls ``record`` once per finished turn (all attempts of an
interrupted turn folded into one ``TelemetryRecord``); after each rollout step the controller
calls ``refit``, which fits the current window with ``pearl.core.profile.fit_hardware`` /
``fit_workload`` (EMA weight ``alpha`` = ``PolicySpec.profile_ema_alpha``; the first window
replaces what the prior only guesses, ``pearl.core.profile.first_window_alpha``), makes the result the
current profiles, clears the window and returns them. The decision engine reads ``hardware`` and
``workload``. Pure bookkeeping: no clock, no tasks.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import replace

from pearl.core.decision import Allocation, Mode, model_makespan
from pearl.core.profile import (
    HardwareProfile,
    IterationRecord,
    TelemetryRecord,
    WorkloadProfile,
    fit_hardware,
    fit_workload,
)


class RuntimeTracker:
    def __init__(self, hardware: HardwareProfile, workload: WorkloadProfile, alpha: float = 0.5,
                 keep_last: int = 20_000, listeners: Sequence[Callable[[TelemetryRecord], None]] = ()) -> None:
        """``listeners``: called with every record before it is kept (a checker of what the fits see)."""
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha={alpha}: the EMA weight must be in (0, 1]")
        self.hardware = hardware
        self.workload = workload
        self.alpha = alpha
        self.window: list[TelemetryRecord] = []
        self.records_total = 0
        self.refits = 0
        self.recent: list[TelemetryRecord] = []  # a bounded tail of all records (for reports)
        self._keep = keep_last
        self._listeners = tuple(listeners)

    def record(self, rec: TelemetryRecord) -> None:
        for listen in self._listeners:
            listen(rec)
        self.window.append(rec)
        self.records_total += 1
        self.recent.append(rec)
        if len(self.recent) > 2 * self._keep:
            del self.recent[: len(self.recent) - self._keep]

    def observe_batch(self, pieces: Sequence[tuple[Allocation, float, float]], batch: int) -> bool:
        """A batch of ``batch`` trajectories ran each ``(allocation, seconds, workers)`` in turn:
        against the models' predictions on the current (refit) profiles (a colocated piece on
        ``workers``, its effective pool), it corrects the closed loop of each allocation
        (``pearl.core.makespan_correction``; its ``phi`` over the pieces). A batch that ran two
        modes is not observed (its re-roling is in no model). Call after ``refit``; returns
        whether the loop took it."""
        if not pieces or len({a.mode for a, _dt, _n in pieces}) != 1:
            return False
        obs = []
        for a, dt, n_eff in pieces:
            placed = Allocation.colocated(min(max(round(n_eff), 1), a.n_workers)) if a.mode is Mode.COLOCATED else a
            obs.append((a.n_workers, None if a.mode is Mode.COLOCATED else a.n_prefill, dt,
                        model_makespan(placed, batch, self.hardware, self.workload)))
        before = self.workload.correction
        corr = before.observe_pieces(obs)
        self.workload = replace(self.workload, correction=corr)
        return corr is not before

    def refit(self, iterations: Sequence[IterationRecord] = (), serving: Collection[str] = ()
              ) -> tuple[HardwareProfile, WorkloadProfile]:
        """Fit the window into the profiles (unchanged if the window is empty) and clear it.
        ``iterations``: the engine's iteration records of the window (``fitting.fit_hardware``);
        ``serving``: the workers that served rollout requests throughout the window, where the
        caller knows them: one that reported nothing is counted (``silent_worker``) and the
        window's tail statistics are not used (``fitting.fit_workload``)."""
        if self.window or iterations:
            self.hardware = fit_hardware(self.hardware, self.window, self.alpha, iterations)
        if self.window:
            self.workload = fit_workload(self.workload, self.window, self.alpha, serving=serving)
            self.refits += 1
        self.window = []
        return self.hardware, self.workload
