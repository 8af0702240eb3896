"""Emulated trainer on the virtual clock: step timing, events, idle estimate, cancellation."""

from __future__ import annotations

import asyncio

from pearl.core.events import TrainingFinished, TrainingStarted
from pearl.runtime.clock import LoopClock, run_virtual
from pearl.sim.emulated_trainer import EmulatedTrainer


def test_trainer_steps_and_events() -> None:
    async def main() -> tuple[list[tuple[float, object]], EmulatedTrainer]:
        clock = LoopClock()
        q: asyncio.Queue[list[int]] = asyncio.Queue()
        seen: list[tuple[float, object]] = []
        versions: list[int] = []

        async def notify(ev: object) -> None:
            seen.append((clock.now(), ev))
            if isinstance(ev, TrainingStarted):
                await clock.sleep(4.0)  # the runtime returns borrowed GPUs before training starts

        async def publish(v: int) -> None:
            versions.append(v)

        tr = EmulatedTrainer(clock, 100.0, q.get, notify, publish)
        tr.start()

        async def producer() -> None:
            await clock.sleep(50.0)
            await q.put([1] * 64)
            await clock.sleep(200.0)
            await q.put([1] * 64)

        await producer()
        await clock.sleep(1000.0)
        await tr.stop()
        assert versions == [1, 2]
        return seen, tr

    seen, tr = run_virtual(main())
    kinds = [(round(t, 6), type(e).__name__) for t, e in seen]
    assert kinds == [(50.0, "TrainingStarted"), (154.0, "TrainingFinished"),
                     (250.0, "TrainingStarted"), (354.0, "TrainingFinished")]
    fin = [e for _, e in seen if isinstance(e, TrainingFinished)]
    assert fin[0].weight_version == 1 and fin[0].expected_idle_s == 50.0
    assert fin[1].expected_idle_s == 0.5 * 96.0 + 0.5 * 50.0  # waited 154 -> 250
    assert tr.stats.steps == 2 and tr.stats.trajectories == 128 and tr.stats.return_s == [4.0, 4.0]
