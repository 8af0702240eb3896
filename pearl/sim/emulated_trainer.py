"""Emulated trainer: consumes rollout batches, "trains" by sleeping on the clock, tells the runtime.

Role: the training side of an asynchronous RL run in a replay. It owns one background task
(``start`` / ``stop``); each iteration::

    batch = await take_batch()                 # blocks while rollout is producing (GPUs idle:
                                               #   the window the toggle manager may borrow)
    await notify(TrainingStarted(step))        # mandatory return of borrowed training GPUs: the
                                               #   runtime's handler returns once they are back,
                                               #   so the return cost delays training (as on GPUs)
    await clock.sleep(step_time_s)             # the optimizer step (paper: ~164 s for Qwen3-8B)
    await publish(version)                     # new weight snapshot version for rollout
    await notify(TrainingFinished(step, version, expected_idle_s))

``expected_idle_s`` is the trainer's running estimate of its idle window: the EMA (alpha 0.5) of
the time it waited for previous batches (None before the first measured wait).

Resume: the emulated trainer holds no weights, only its policy version, which is the number of
updates it has made; an update makes one version from one batch. A restarted run passes
``start_version`` = the number of rollout batches the journal holds as consumed
(``pearl.runtime.journal.Journal.trained_batches``), so step ``start_version + 1`` trains on the
first batch the pipeline hands out again and the staleness gate sees the version it waits for.

Public names: ``EmulatedTrainer``, ``TrainerStats``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from pearl.core.events import ElasticEvent, TrainingFinished, TrainingStarted
from pearl.runtime.clock import Clock
from pearl.tasks import cancel_and_wait


@dataclass
class TrainerStats:
    steps: int = 0
    version: int = 0
    trajectories: int = 0
    wait_s: list[float] = field(default_factory=list)  # idle time before each step
    return_s: list[float] = field(default_factory=list)  # time TrainingStarted took (GPU return)
    step_end: list[float] = field(default_factory=list)  # clock time each step finished


class EmulatedTrainer:
    def __init__(
        self,
        clock: Clock,
        step_time_s: float,
        take_batch: Callable[[], Awaitable[Any]],
        notify: Callable[[ElasticEvent], Awaitable[Any]],
        publish: Callable[[int], Awaitable[Any]] | None = None,
        ema_alpha: float = 0.5,
        start_version: int = 0,
    ) -> None:
        if start_version < 0:
            raise ValueError(f"start_version={start_version} must be >= 0")
        self.clock = clock
        self.step_time_s = step_time_s
        self.take_batch = take_batch
        self.notify = notify
        self.publish = publish
        self.ema_alpha = ema_alpha
        self.stats = TrainerStats(steps=start_version, version=start_version)
        self.start_version = start_version
        self.training = False
        self._idle_estimate: float | None = None
        self._task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        while True:
            t0 = self.clock.now()
            batch = await self.take_batch()
            waited = self.clock.now() - t0
            self.stats.wait_s.append(waited)
            self._idle_estimate = (
                waited if self._idle_estimate is None
                else self.ema_alpha * waited + (1 - self.ema_alpha) * self._idle_estimate
            )
            step = self.stats.steps + 1
            t1 = self.clock.now()
            self.training = True
            await self.notify(TrainingStarted(step, event_id=f"train-start-{step}"))
            self.stats.return_s.append(self.clock.now() - t1)
            await self.clock.sleep(self.step_time_s)
            self.stats.steps = step
            self.stats.version += 1
            with contextlib.suppress(TypeError):
                self.stats.trajectories += len(batch)
            if self.publish is not None:
                await self.publish(self.stats.version)
            self.training = False
            self.stats.step_end.append(self.clock.now())
            await self.notify(
                TrainingFinished(step, self.stats.version, expected_idle_s=self._idle_estimate,
                                 event_id=f"train-finish-{step}")
            )

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run(), name="emulated-trainer")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
