"""The runtime's only source of time: an injected ``Clock`` over the running asyncio loop.

Every runtime component (pipeline, schedulers, rebuilder, toggle manager, emulated engine) reads
time with ``clock.now()`` and waits with ``clock.sleep`` / ``clock.sleep_until`` /
``clock.wait(event, deadline)``; none calls ``time.time()`` or ``asyncio.sleep`` directly. The
clock itself reads ``loop.time()``, so the *same code path* runs in

* **real time** - any asyncio loop (uvloop in production): ``LoopClock`` on it;
* **virtual time** - ``VirtualTimeLoop``: an event loop whose time jumps to the next timer as soon
  as nothing is ready to run (every task waits on a timer or an event), so a two-hour trace replays
  in seconds, deterministically. Start one with ``run_virtual(main())``.

Why not the ``looptime`` package (evaluated, it is installed): it is a pytest-oriented mixin that
keeps time as integers at a fixed resolution (1 us by default, so ``call_at`` deadlines computed in
floats round), spins ``noop_cycles`` real iterations before jumping when executor futures are
pending, and patches the selector on an existing loop. Our replays need a plain, production-grade
loop whose time is the float the emulator computed, with no real waiting at all; the mechanism is
the same (wrap ``selector.select``) and fits in 40 lines, so we own it (``VirtualTimeLoop``).

Virtual-time rules (written down because they are choices):

* time advances only when the loop would block: ``select(timeout)`` with nothing ready returns
  immediately and moves the clock forward by ``timeout`` (to the next timer);
* if nothing is scheduled at all (``timeout is None``) the loop waits for real I/O (a thread
  finishing, a socket) up to ``idle_timeout_s`` real seconds and then raises
  ``VirtualTimeDeadlock`` naming the situation - in a replay that is a bug (every task waits on an
  event nobody will set), not a reason to hang until the test timeout;
* threads (``run_in_executor``) run in real time; virtual time does not wait for them while timers
  are pending, except for work registered with ``hold_time`` (the journal's writer thread): while
  such work is in flight the loop waits for it in real time, as above, and time stands still.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import selectors
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, Protocol, TypeVar, runtime_checkable

T = TypeVar("T")


class VirtualTimeDeadlock(RuntimeError):
    """Every task waits and no timer is pending: nothing can ever happen again."""


@runtime_checkable
class Clock(Protocol):
    """Time as the runtime sees it (seconds; origin arbitrary but fixed for a run)."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...

    async def sleep_until(self, t: float) -> None: ...

    async def wait(self, waitable: asyncio.Event | asyncio.Future[Any], deadline: float | None) -> bool:
        """Wait until ``waitable`` is set / done (True) or ``deadline`` passes (False).

        A future is the cheap form (one timer, no task): hot loops such as the emulated engine's
        per-worker driver use it. The future is not cancelled on timeout."""
        ...


class LoopClock:
    """A ``Clock`` over the running loop's ``time()``: real time on a normal loop, virtual time on
    ``VirtualTimeLoop``. Bind it lazily (``loop=None``) so it can be built before the loop runs."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def now(self) -> float:
        return self.loop.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    async def sleep_until(self, t: float) -> None:
        await asyncio.sleep(max(0.0, t - self.loop.time()))

    async def wait(self, waitable: asyncio.Event | asyncio.Future[Any], deadline: float | None) -> bool:
        if isinstance(waitable, asyncio.Event):
            if waitable.is_set():
                return True
            if deadline is None:
                await waitable.wait()
                return True
            fut = asyncio.ensure_future(waitable.wait())
            try:
                return await self._wait_future(fut, deadline)
            finally:
                if not fut.done():
                    fut.cancel()
        if waitable.done():
            return True
        if deadline is None:
            await asyncio.shield(waitable)
            return True
        return await self._wait_future(waitable, deadline)

    async def _wait_future(self, fut: asyncio.Future[Any], deadline: float) -> bool:
        if fut.done():
            return True
        if deadline <= self.loop.time():
            return False
        # One timer and one future, no extra task (asyncio.wait_for would create a task per wait).
        gate: asyncio.Future[bool] = self.loop.create_future()

        def _timeout() -> None:
            if not gate.done():
                gate.set_result(False)

        def _done(_f: asyncio.Future[Any]) -> None:
            if not gate.done():
                gate.set_result(True)

        handle = self.loop.call_at(deadline, _timeout)
        fut.add_done_callback(_done)
        try:
            return await gate
        finally:
            handle.cancel()
            fut.remove_done_callback(_done)


#: Name kept for readers who look for "the real clock": on a normal loop LoopClock *is* real time.
RealClock = LoopClock


class _VirtualSelector:
    """Wraps a selector: a blocking ``select(timeout)`` becomes ``select(0)`` plus a time jump."""

    def __init__(self, inner: selectors.BaseSelector, loop: VirtualTimeLoop, idle_timeout_s: float) -> None:
        self._inner = inner
        self._loop = loop
        self._idle = idle_timeout_s

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._inner.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None or self._loop.holds:
            ready = self._inner.select(self._idle)
            if not ready:
                raise VirtualTimeDeadlock(
                    f"virtual-time loop at t={self._loop.time():.3f}s: no timer is pending and nothing "
                    f"happened for {self._idle:.0f} real seconds - every task waits on an event nobody "
                    "will set (check the component that should have woken them)"
                )
            return ready
        self._loop.advance(timeout)
        return ready

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An asyncio loop whose ``time()`` is virtual and jumps to the next timer when idle."""

    # SelectorEventLoop's private selector, which typeshed does not declare; __init__ wraps it.
    _selector: selectors.BaseSelector

    def __init__(self, start: float = 0.0, idle_timeout_s: float = 30.0) -> None:
        super().__init__()
        self._virtual_now = float(start)
        #: real work in flight (``hold_time``): while it is positive, time does not jump
        self.holds = 0
        # duck-typed stand-in (select() wrapped, the rest delegated by __getattr__), not a BaseSelector subclass
        self._selector = _VirtualSelector(self._selector, self, idle_timeout_s)  # type: ignore[assignment]
        # Timers due within the clock resolution run in the same iteration; keep it tiny so that
        # float deadlines computed by the emulator are honoured exactly.
        self._clock_resolution = 1e-9

    def time(self) -> float:
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        """Jump forward by ``seconds``, landing exactly on the next timer's float deadline when it is
        that close (so ``call_at(t)`` runs at ``time() == t``, with no rounding residue)."""
        if seconds <= 0:
            return
        target = self._virtual_now + seconds
        scheduled = self._scheduled  # type: ignore[attr-defined]
        if scheduled:
            when = scheduled[0].when()
            if self._virtual_now <= when <= target + 1e-9 * max(1.0, abs(target)):
                target = when
        self._virtual_now = max(self._virtual_now, target)


def hold_time(loop: asyncio.AbstractEventLoop) -> Callable[[], None]:
    """Keep ``loop``'s virtual time still until the returned ``release`` is called (from any thread):
    a journal write on the writer thread is real work the replay waits for, as it would on a real
    clock. On any other loop this holds nothing."""
    if not isinstance(loop, VirtualTimeLoop):
        return _nothing
    loop.holds += 1
    released = False

    def _release() -> None:
        nonlocal released
        if not released:
            released = True
            loop.holds -= 1

    def release() -> None:
        if loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # closed meanwhile
            loop.call_soon_threadsafe(_release)

    return release


def _nothing() -> None:
    return None


def clock_epoch(loop: asyncio.AbstractEventLoop) -> str | None:
    """The origin of a real loop's clock, as a name: the boot it runs in (asyncio's and uvloop's
    ``time()`` count CLOCK_MONOTONIC, which starts at boot and never steps). A deadline kept with
    its epoch is the same instant for another process of the same boot. None for a virtual loop
    (its time is its own) or where the boot cannot be named."""
    if isinstance(loop, VirtualTimeLoop):
        return None
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return "boot:" + f.read().strip()
    except OSError:
        return None


#: allocations between two young-generation collections while a virtual loop runs (CPython's
#: default: 700)
REPLAY_GC_THRESHOLD0 = 50_000


@contextlib.contextmanager
def fewer_young_collections(threshold0: int = REPLAY_GC_THRESHOLD0) -> Iterator[None]:
    """Raise the garbage collector's first threshold to ``threshold0`` for the block, then restore
    what was set. A replay allocates short-lived objects (requests, token slices, timer handles) by
    the million, and at CPython's default of 700 a young collection runs every few events; the
    older generations keep their cadence relative to it (``threshold1``, ``threshold2`` unchanged),
    so cycles are still collected. Measured on the 768-GPU cluster, 10 virtual minutes
    (docs/simulation.md, "Replay speed"): the collector took 4.9 of 25.5 CPU s at the default and
    1.9 s at 50,000, the same events and the same peak RSS."""
    old = gc.get_threshold()
    gc.set_threshold(threshold0, *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)


def run_virtual(main: Coroutine[Any, Any, T], start: float = 0.0, idle_timeout_s: float = 30.0) -> T:
    """Run ``main`` to completion on a fresh ``VirtualTimeLoop`` and close it (like ``asyncio.run``),
    with fewer young collections (``fewer_young_collections``)."""
    with fewer_young_collections(), asyncio.Runner(loop_factory=lambda: VirtualTimeLoop(start, idle_timeout_s)) as runner:
        return runner.run(main)
