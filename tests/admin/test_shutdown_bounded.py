"""A service's shutdown ends even when an engine call never returns.

The ``Service`` of ``pearl serve`` on the emulated engine (real time), whose ``abort`` hangs for
good, as a server stuck mid-call would: ``stop()`` cancels the dispatch phase after its bound, says
so in a WARNING naming the phase, and goes on to stop the controller, write the report and release
the output folder, which a second service can then take.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import pytest

import pearl.serve
from pearl.config import load_config
from pearl.engines.emulated import EmulatedEngine
from pearl.runtime.clock import LoopClock
from pearl.serve import Service
from tests.admin.test_service import write_config


class HangingAbort(EmulatedEngine):
    """The emulated engine whose ``abort`` never returns."""

    async def abort(self, worker_id: str, rid: str | None = None) -> None:
        await asyncio.Event().wait()


@pytest.mark.timeout(300)
async def test_stop_goes_on_past_an_abort_that_never_returns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(pearl.serve, "SHUTDOWN_BOUND_S", 2.0)
    cfg = load_config(write_config(tmp_path))
    clock = LoopClock()

    def make(_node_of: Any) -> HangingAbort:
        e = EmulatedEngine.from_config(cfg, clock)
        e.__class__ = HangingAbort
        return e

    svc = Service(cfg, clock, engine_factory=make, port=0)
    await svc.start()
    assert svc.controller is not None
    pipe = svc.controller.pipeline
    t0 = time.monotonic()
    while not any(pipe.inflight_on(w) for w in svc.controller.executor.state.workers):
        assert time.monotonic() - t0 < 120, "no request in flight within 120 s"
        await asyncio.sleep(0.05)
    caplog.set_level(logging.INFO, logger="pearl")
    t0 = time.monotonic()
    report = await asyncio.wait_for(svc.stop(), 60)
    took = time.monotonic() - t0
    messages = [r.getMessage() for r in caplog.records]
    assert any("dispatch stopped on 4 worker(s): not done after 2 s; cancelled" in m for m in messages), messages
    assert any(m.endswith("did not drain; their in-flight turns run again from the journal on a restart")
               and m.startswith("shutdown: w-r0-0, w-r1-0 ") for m in messages), messages
    assert any(m.startswith("shutdown: controller and engine servers stopped in") for m in messages), messages
    assert report is not None and Path(report).is_file()
    assert took < 30, took
    again = Service(cfg, clock, port=0)  # the output folder's lock was released
    await again.start()
    await again.stop()
