"""Virtual time fast-forwards exactly; the same LoopClock code runs on a real loop."""

from __future__ import annotations

import asyncio
import gc
import time

import pytest

from pearl.runtime.clock import REPLAY_GC_THRESHOLD0, Clock, LoopClock, VirtualTimeDeadlock, run_virtual


def test_virtual_loop_jumps_to_timers_exactly() -> None:
    async def main() -> list[tuple[str, float]]:
        clock = LoopClock()
        seen: list[tuple[str, float]] = []

        async def worker(name: str, delays: list[float]) -> None:
            for d in delays:
                await clock.sleep(d)
                seen.append((name, clock.now()))

        await asyncio.gather(worker("a", [3600.0, 0.25]), worker("b", [1800.0, 1800.5]))
        await clock.sleep_until(10_000.0)
        seen.append(("end", clock.now()))
        return seen

    t0 = time.perf_counter()
    seen = run_virtual(main())
    assert time.perf_counter() - t0 < 1.0  # three virtual hours, no real waiting
    assert seen == [("b", 1800.0), ("a", 3600.0), ("a", 3600.25), ("b", 3600.5), ("end", 10_000.0)]


def test_wait_on_future_and_event_with_deadline() -> None:
    async def main() -> tuple[bool, float, bool, float, bool, float]:
        clock = LoopClock()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        loop.call_at(5.0, fut.set_result, None)
        ok1 = await clock.wait(fut, deadline=10.0)
        t1 = clock.now()
        ok2 = await clock.wait(loop.create_future(), deadline=12.5)
        t2 = clock.now()
        ev = asyncio.Event()
        loop.call_at(20.0, ev.set)
        ok3 = await clock.wait(ev, deadline=30.0)
        return ok1, t1, ok2, t2, ok3, clock.now()

    assert run_virtual(main()) == (True, 5.0, False, 12.5, True, 20.0)


def test_deadlock_is_reported_not_hung() -> None:
    async def main() -> None:
        await asyncio.Event().wait()

    with pytest.raises(VirtualTimeDeadlock, match="no timer is pending"):
        run_virtual(main(), idle_timeout_s=0.05)


async def test_loop_clock_on_a_real_loop() -> None:
    clock = LoopClock()
    assert isinstance(clock, Clock)
    t0 = clock.now()
    await clock.sleep(0.01)
    assert clock.now() - t0 >= 0.009
    assert await clock.wait(asyncio.Event(), deadline=clock.now() + 0.005) is False


def test_a_replay_runs_with_fewer_young_collections_and_restores_the_collector() -> None:
    """Inside ``run_virtual`` the first threshold is raised, the older generations' kept; after it,
    and after a replay that raised, the collector is as it was."""
    before = gc.get_threshold()

    async def seen() -> tuple[int, int, int]:
        return gc.get_threshold()

    assert run_virtual(seen()) == (REPLAY_GC_THRESHOLD0, *before[1:])
    assert gc.get_threshold() == before

    async def fails() -> None:
        raise RuntimeError("replay failed")

    with pytest.raises(RuntimeError, match="replay failed"):
        run_virtual(fails())
    assert gc.get_threshold() == before
