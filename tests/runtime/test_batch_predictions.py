"""The Controller pairs each rollout batch's predicted makespan with that batch's observed one.

Question checked (issue 3, session 2): can the next batch's ``_on_batch_start`` overwrite the
current batch's prediction before ``_on_batch_done`` records it? In ``PipelineScheduler.run``
batches are sequential (``run_batch(r)`` returns, ``on_batch_done(r)`` is awaited, then batch
``r + 1`` starts), so it cannot today; the Controller keys predictions by batch index anyway, so
the pairing stays right if batches are ever overlapped.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from pearl.runtime.agent import SessionSpec
from pearl.runtime.clock import LoopClock, run_virtual
from pearl.runtime.controller import Controller

from .helpers import ScriptedSession, config, engine


def _controller(clock: LoopClock, max_batches: int) -> Controller:
    cfg = config(**{"workload.batch_size": 8, "workload.group_size": 4, "cluster.reserved_gpus": 2,
                    "cluster.training_gpus": 0, "cluster.max_preemptible_gpus": 0})

    def factory(spec: SessionSpec) -> ScriptedSession:
        return ScriptedSession(spec, clock, turns=3, response=200, env_s=2.0)

    return Controller(cfg, engine(clock, cfg), factory, clock=clock, max_batches=max_batches)


def test_each_batch_is_paired_with_the_prediction_in_force_at_its_start() -> None:
    async def main():
        clock = LoopClock()
        ctl = _controller(clock, max_batches=2)
        order: list[tuple[str, int]] = []
        at_start: dict[int, float] = {}
        start_cb, done_cb = ctl.pipeline.on_batch_start, ctl.pipeline.on_batch_done
        assert start_cb is not None and done_cb is not None

        def on_start(r: int) -> None:
            order.append(("start", r))
            d = ctl.elastic.decision
            at_start[r] = d.predicted_makespan_s if d is not None else math.nan
            start_cb(r)

        async def on_done(r: int, records) -> None:
            order.append(("done", r))
            await done_cb(r, records)

        ctl.pipeline.on_batch_start, ctl.pipeline.on_batch_done = on_start, on_done
        await ctl.start()
        await ctl.wait_batches(2)
        await ctl.stop()
        return ctl, order, at_start

    ctl, order, at_start = run_virtual(main())
    # batches never overlap: batch r+1 starts only after batch r's prediction was recorded
    assert order == [("start", 0), ("done", 0), ("start", 1), ("done", 1)]
    spans = ctl.pipeline.stats.batch_makespans
    assert ctl.batch_predictions == [(at_start[0], spans[0]), (at_start[1], spans[1])]


def test_overlapping_batches_keep_their_own_predictions() -> None:
    """Driven directly: batch 1 starts (with a new decision) before batch 0 is done."""
    async def main():
        clock = LoopClock()
        ctl = _controller(clock, max_batches=0)  # the pipeline runs no batch of its own
        await ctl.start()
        await ctl.elastic.idle()
        d = ctl.elastic.decision
        assert d is not None
        ctl._on_batch_start(0)
        ctl.elastic.decision = dataclasses.replace(d, predicted_makespan_s=d.predicted_makespan_s * 3)
        ctl._on_batch_start(1)
        ctl.pipeline.stats.batch_makespans.append(100.0)
        await ctl._on_batch_done(0, [])
        ctl.pipeline.stats.batch_makespans.append(200.0)
        await ctl._on_batch_done(1, [])
        await ctl.stop()
        return ctl, d.predicted_makespan_s

    ctl, p0 = run_virtual(main())
    assert ctl.batch_predictions == [(pytest.approx(p0), 100.0), (pytest.approx(3 * p0), 200.0)]
