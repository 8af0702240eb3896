"""``RunObserver``: watch a running controller through its ``ControlPlane`` and report on it.

Life cycle: ``start()`` launches one background task (owned here; ``stop()`` cancels and awaits it)
that every ``period_s`` on the run's clock takes a ``Sample`` (table + progress + decision) and feeds
three sinks:

- the GPU-role ledger (``pearl.sim.metrics.GpuLedger``, shared with the simulator) for the timeline;
- TensorBoard scalars (``torch.utils.tensorboard.SummaryWriter``, if enabled), tags::

      rollout/throughput_traj_per_h   rollout/trajectories_completed   rollout/in_flight
      rollout/reward_mean             rollout/staleness                (of the last batch the trainer
                                                                        took: ``note_batch``)
      pd/mode                         0 = colocated, 1 = disaggregated
      pd/n_prefill  pd/n_decode  pd/n_colocated                        the current decision's target
      gpus/<category>                 GPUs per role: prefill | decode | colocated | borrowed | idle
      train/weight_version            train/step

  The x axis (``global_step``) is the sample index; ``walltime`` is the clock time.
- a live ``rich`` display (if enabled) with the same figures and the latest elastic events;
- the run's story (``pearl.obs.story.RunStory``, if given): the controller's new elastic-history
  entries of each sample become event lines (printed at once when the run is not on a terminal).

``stop()`` takes a last sample and writes the run report (``pearl.obs.report.write_run_report``):
markdown + PNG GPU-role timeline + PNG throughput over time. Sampling every ``period_s`` bounds the
timeline's time resolution (a role held for less than one period may not be drawn).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pearl.core.trajectory import TrajectoryRecord
from pearl.obs.progress import LiveProgress
from pearl.obs.story import RunStory
from pearl.runtime.control import ControlPlane, Progress
from pearl.sim.metrics import GpuLedger, category_of
from pearl.tasks import cancel_and_wait

log = logging.getLogger("pearl.obs")

CATEGORIES = ("prefill", "decode", "colocated", "borrowed", "idle")
HISTORY_WINDOW = 500  # elastic-history entries read per sample (far more than a sample period produces)


@dataclass(frozen=True, slots=True)
class Sample:
    t: float
    progress: Progress
    gpus_per_category: dict[str, int]
    decision: dict[str, Any] | None
    batch: dict[str, float] = field(default_factory=dict)  # reward_mean / staleness of the last batch

    @property
    def mode(self) -> str | None:
        return None if self.decision is None else str(self.decision.get("mode"))

    def scalars(self) -> dict[str, float]:
        """TensorBoard tag -> value (see the module docstring)."""
        p = self.progress
        out: dict[str, float] = {
            "rollout/throughput_traj_per_h": p.throughput_traj_per_h,
            "rollout/trajectories_completed": p.trajectories_completed,
            "rollout/in_flight": p.trajectories_in_flight,
            "train/weight_version": p.weight_version,
            "train/step": p.train_step,
        }
        for key, tag in (("reward_mean", "rollout/reward_mean"), ("staleness", "rollout/staleness")):
            v = self.batch.get(key, p.extra.get(key))
            if isinstance(v, int | float):
                out[tag] = float(v)
        for cat in CATEGORIES:
            out[f"gpus/{cat}"] = self.gpus_per_category.get(cat, 0)
        if self.decision is not None:
            out["pd/mode"] = 1.0 if self.mode == "disaggregated" else 0.0
            for k in ("n_prefill", "n_decode", "n_colocated"):
                v = self.decision.get(k)
                if isinstance(v, int | float):
                    out[f"pd/{k}"] = float(v)
        return {k: float(v) for k, v in out.items() if math.isfinite(float(v))}


@dataclass
class RunRecord:
    """Everything the report needs, accumulated sample by sample."""

    ledger: GpuLedger = field(default_factory=GpuLedger)
    completions: list[tuple[float, int]] = field(default_factory=list)  # (t, trajectories_completed)
    modes: list[tuple[float, str]] = field(default_factory=list)  # (t, label) on change
    t0: float | None = None
    t_end: float = 0.0
    last: Sample | None = None


def take_sample(control: ControlPlane, t: float, batch: dict[str, float] | None = None
                ) -> tuple[Sample, dict[str, tuple[str, str]]]:
    cats = category_of(control.state_dict())
    per: dict[str, int] = {}
    for _zone, cat in cats.values():
        per[cat] = per.get(cat, 0) + 1
    return Sample(t, control.progress(), per, control.decision_dict(), dict(batch or {})), cats


def batch_stats(records: Sequence[TrajectoryRecord], trainer_version: int) -> dict[str, float]:
    """``reward_mean`` = mean reward of the batch; ``staleness`` = ``trainer_version`` minus the oldest
    ``policy_version`` in it (how many versions behind the trainer the stalest trajectory was)."""
    if not records:
        return {}
    versions = [r.policy_version for r in records if r.policy_version >= 0]
    out = {"reward_mean": sum(r.reward for r in records) / len(records)}
    if versions:
        out["staleness"] = float(trainer_version - min(versions))
    return out


class RunObserver:
    def __init__(
        self,
        control: ControlPlane,
        now: Callable[[], float],
        sleep: Callable[[float], Any],
        out_dir: str | Path,
        period_s: float = 5.0,
        tensorboard: bool = True,
        live: bool = False,
        title: str = "PEARL run",
        story: RunStory | None = None,
    ) -> None:
        self.control = control
        self._now = now
        self._sleep = sleep
        self.out_dir = Path(out_dir)
        self.period_s = period_s
        self.title = title
        self.record = RunRecord()
        self._tb: Any = None
        self._tb_enabled = tensorboard
        self._live = LiveProgress(title) if live else None
        self._task: asyncio.Task[None] | None = None
        self.story = story
        self._n = 0
        self.batch: dict[str, float] = {}

    def note_batch(self, records: Sequence[TrajectoryRecord], trainer_version: int) -> None:
        """The trainer took a batch: remember its reward and staleness for the next samples."""
        self.batch = batch_stats(records, trainer_version)

    def sample(self) -> Sample:
        t = self._now()
        s, cats = take_sample(self.control, t, self.batch)
        r = self.record
        if r.t0 is None:
            r.t0 = t
        r.t_end = t
        r.ledger.observe(t, cats)
        r.completions.append((t, s.progress.trajectories_completed))
        label = None if s.decision is None else s.decision.get("label")
        if label is not None and (not r.modes or r.modes[-1][1] != label):
            r.modes.append((t, str(label)))
        r.last = s
        if self.story is not None:
            self.story.observe(s, self.control.history(HISTORY_WINDOW), cats)
        if self._tb is not None:
            for tag, v in s.scalars().items():
                self._tb.add_scalar(tag, v, global_step=self._n, walltime=t)
        if self._live is not None:
            self._live.update(s, self.story.recent() if self.story is not None else ())
        self._n += 1
        return s

    async def _run(self) -> None:
        while True:
            try:
                self.sample()
            except Exception:  # an observer must never take the run down
                log.exception("observer: sampling the controller failed; will retry")
            await self._sleep(self.period_s)

    def start(self) -> None:
        if self._tb_enabled:
            from torch.utils.tensorboard import SummaryWriter

            self.out_dir.mkdir(parents=True, exist_ok=True)
            self._tb = SummaryWriter(log_dir=str(self.out_dir / "tensorboard"))
        if self._live is not None:
            self._live.start()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="run-observer")

    async def stop(self, write_report: bool = True) -> Path | None:
        """Cancel the sampler, take a last sample, close sinks and write the report (its path)."""
        await cancel_and_wait(self._task)
        self._task = None
        try:
            self.sample()
        except Exception:
            log.exception("observer: final sample failed")
        self.record.ledger.close(self.record.t_end)
        if self._live is not None:
            self._live.stop()
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if not write_report:
            return None
        from pearl.obs.report import write_run_report

        return write_run_report(self.record, self.out_dir, self.title, self.control.config_dict())
