"""A rollout worker whose requests leave no telemetry in a batch's window is counted
(``silent_worker``) at the batch's refit, and the window's tail statistics are not used: the
decision keeps acting on the previous tail (``fitting.fit_workload``; the Controller names the
workers that served the whole batch, ``Controller._serving_throughout``)."""

from __future__ import annotations

from pearl.core.profile import TelemetryRecord
from pearl.core.session import SessionSpec
from pearl.runtime.clock import LoopClock, run_virtual
from pearl.runtime.controller import Controller
from pearl.runtime.tracker import RuntimeTracker

from .helpers import ScriptedSession, config, engine


def _run(lose_one: bool) -> Controller:
    """One batch of 8 trajectories on 2 colocated workers; with ``lose_one`` the first worker's
    request records never reach the tracker."""
    async def main() -> Controller:
        clock = LoopClock()
        cfg = config(**{"workload.batch_size": 8, "workload.group_size": 4, "cluster.reserved_gpus": 2,
                        "cluster.training_gpus": 0, "cluster.max_preemptible_gpus": 0,
                        "policy.allow_disaggregation": False})

        def factory(spec: SessionSpec) -> ScriptedSession:
            return ScriptedSession(spec, clock, turns=3, response=200, env_s=2.0)

        ctl = Controller(cfg, engine(clock, cfg), factory, clock=clock, max_batches=1)
        await ctl.start()
        lost = ctl.executor.state.active_workers()[0].worker_id
        tracker = ctl.tracker

        def record(rec: TelemetryRecord) -> None:
            if not (lose_one and rec.worker_id == lost):
                RuntimeTracker.record(tracker, rec)

        tracker.record = record  # type: ignore[method-assign]
        await ctl.wait_batches(1)
        await ctl.elastic.idle()
        await ctl.stop()
        return ctl

    out: Controller = run_virtual(main())
    return out


def test_a_worker_that_leaves_no_telemetry_is_counted_and_the_tail_is_not_learned() -> None:
    heard, silent = _run(lose_one=False), _run(lose_one=True)
    assert heard.tracker.refits == 1 and silent.tracker.refits == 1
    assert heard.tracker.workload.rejected.total == 0
    assert heard.tracker.workload.tail_factor is not None  # whole trajectories seen: a tail is learned
    assert silent.tracker.workload.rejected.to_dict() == {"silent_worker": 1}
    assert silent.tracker.workload.tail_factor is None and silent.tracker.workload.tail_paths == ()
    assert silent.tracker.workload.samples > 0  # the per-turn statistics are still learned
    d = silent.elastic.decision
    assert d is not None and d.to_dict()["telemetry_rejected"]["workload"] == {"silent_worker": 1}
