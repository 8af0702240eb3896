"""The Controller pairs each rollout batch's batch forecast with that batch's observed makespan.

In ``PipelineScheduler.run`` batches are sequential (``run_batch(r)`` returns, the ``batch_done``
hook is awaited, then batch ``r + 1`` starts), so the next batch's start cannot overwrite the
current batch's forecast before it is recorded; the Controller keys forecasts by batch index
anyway, so the pairing stays right if batches are ever overlapped. The forecasts themselves are
``pearl.core.outlook``'s, over the scheduler's ``PoolOutlook`` (tests/core/test_outlook.py).
"""

from __future__ import annotations

import math

import pytest

from pearl.core.outlook import pool_changes
from pearl.core.session import SessionSpec
from pearl.runtime.clock import LoopClock, run_virtual
from pearl.runtime.controller import Controller

from .helpers import ScriptedSession, config, engine


class _Recording(Controller):
    """A Controller that records the order of its batch hooks and the decided makespan ``M_cur``
    at each batch start (the profiles refit at the previous batch's end: the forecast decides on
    them now; the re-plan that will act on them is queued behind this start)."""

    order: list[tuple[str, int]]
    at_start: dict[int, float]

    def _on_batch_start(self, r: int) -> None:
        el = self.elastic
        d = el.decision
        self.order.append(("start", r))
        self.at_start[r] = el.decider().decide(d.n_workers, el.allocation).predicted_makespan_s \
            if d is not None else math.nan
        super()._on_batch_start(r)

    async def _on_batch_done(self, r: int, records) -> None:
        self.order.append(("done", r))
        await super()._on_batch_done(r, records)


def _controller(clock: LoopClock, max_batches: int) -> _Recording:
    cfg = config(**{"workload.batch_size": 8, "workload.group_size": 4, "cluster.reserved_gpus": 2,
                    "cluster.training_gpus": 0, "cluster.max_preemptible_gpus": 0})

    def factory(spec: SessionSpec) -> ScriptedSession:
        return ScriptedSession(spec, clock, turns=3, response=200, env_s=2.0)

    ctl = _Recording(cfg, engine(clock, cfg), factory, clock=clock, max_batches=max_batches)
    ctl.order, ctl.at_start = [], {}
    return ctl


def test_each_batch_is_paired_with_the_prediction_in_force_at_its_start() -> None:
    async def main():
        clock = LoopClock()
        ctl = _controller(clock, max_batches=2)
        await ctl.start()
        await ctl.wait_batches(2)
        await ctl.stop()
        return ctl, ctl.order, ctl.at_start

    ctl, order, at_start = run_virtual(main())
    # batches never overlap: batch r+1 starts only after batch r's prediction was recorded
    assert order == [("start", 0), ("done", 0), ("start", 1), ("done", 1)]
    spans = ctl.pipeline.stats.batch_makespans
    assert ctl.batch_predictions == [(at_start[0], spans[0]), (at_start[1], spans[1])]


def test_overlapping_batches_keep_their_own_predictions(monkeypatch: pytest.MonkeyPatch) -> None:
    """Driven directly: batch 1 starts (with a new forecast) before batch 0 is done."""
    async def main():
        clock = LoopClock()
        ctl = _controller(clock, max_batches=0)  # the pipeline runs no batch of its own
        await ctl.start()
        await ctl.elastic.idle()
        predictions = iter([150.0, 450.0])
        monkeypatch.setattr(ctl.elastic, "batch_forecast", lambda trainer_waits: next(predictions))
        ctl._on_batch_start(0)
        ctl._on_batch_start(1)
        ctl.pipeline.stats.batch_makespans.append(100.0)
        await ctl._on_batch_done(0, [])
        ctl.pipeline.stats.batch_makespans.append(200.0)
        await ctl._on_batch_done(1, [])
        await ctl.stop()
        return ctl

    ctl = run_virtual(main())
    assert ctl.batch_predictions == [(150.0, 100.0), (450.0, 200.0)]


def test_batch_start_prediction_composes_the_known_return_and_regrowth() -> None:
    """With training GPUs lent at a batch's start and a batch waiting for the trainer, the
    prediction is the decision's makespan, then the pool without the lent workers from the return
    on, then the regrown pool once the step is done (``outlook.batch_forecast``); the
    training step estimate follows the observed spans."""
    from pearl.core.affinity import effective_slack, typical_turn
    from pearl.core.events import TrainingFinished, TrainingStarted
    from pearl.core.makespan import batch_progress, compose_makespan, sticky_pool, sync_stall_s

    async def main():
        clock = LoopClock()
        cfg = config(**{"workload.batch_size": 8, "workload.group_size": 4, "cluster.reserved_gpus": 2,
                        "cluster.training_gpus": 2, "cluster.max_preemptible_gpus": 0,
                        "policy.gate_enabled": False, "train.step_time_s": 100.0, "policy.cost_ema_alpha": 0.5})

        def factory(spec: SessionSpec) -> ScriptedSession:
            return ScriptedSession(spec, clock, turns=3, response=200, env_s=2.0)

        ctl = Controller(cfg, engine(clock, cfg), factory, clock=clock, max_batches=0)
        await ctl.start()
        await ctl.elastic.idle()
        el = ctl.elastic
        alone = el.batch_forecast(trainer_waits=True)
        assert alone == el.decision.predicted_makespan_s  # nothing lent: the decision as it is

        await ctl.notify(TrainingStarted(0, event_id="s0"))
        await clock.sleep(60.0)
        await ctl.notify(TrainingFinished(0, 1, event_id="f0"))  # lends the 2 training GPUs (no gate)
        await el.idle()
        assert el.toggle.borrowed and el.decision.n_workers == 4
        assert el.trainer.step_s == pytest.approx(100.0 + 0.5 * (60.0 - 100.0), abs=0.5)  # EMA of the 60-s span
        got = el.batch_forecast(trainer_waits=True)
        m_cur = el.decision.predicted_makespan_s
        back = el.decider().decide(4, el.allocation)  # the regrown pool keeps the allocation in force (hysteresis)
        slack = effective_slack(el.tracker.hardware, typical_turn(el.tracker.workload), el.pipeline.router.affinity_slack)
        n_eff = sticky_pool(8.0, 2.0, 4.0, float(slack))
        m_back = back.colocated_curve[round(n_eff) - 1] if back.target.mode.value == "colocated" else m_cur
        d_ret, d_act = el.costs.deactivation_s, el.costs.activation_s
        shrunk = el.decider().decide(2, el.allocation).predicted_makespan_s  # the allocation in force keeps its hysteresis
        schedule = [(0.0, m_cur), (d_ret, shrunk), (d_ret + el.trainer.step_s + d_act, m_back)]
        pools = compose_makespan(schedule)
        # the step's weight sync lands inside the batch, on the 2 workers left after the return
        t_sync = d_ret + el.trainer.step_s
        d = el.decision
        assert t_sync < pools
        prog = batch_progress(schedule, t_sync)
        if d.target.mode.value == "colocated":
            stall = sync_stall_s(d.hw, d.wl, d.batch, prog, 2.0, el.costs.weight_sync_s)
        else:  # its prefill pool, shrunk in proportion to the 2 of 4 workers left
            stall = sync_stall_s(d.hw, d.wl, d.batch, prog, max(d.target.n_prefill * 2 / 4, 1.0),
                                 el.costs.weight_sync_s, disaggregated=True)
        no_wait = el.batch_forecast(trainer_waits=False)
        await ctl.stop()
        return got, pools, stall, m_cur, no_wait

    got, pools, stall, m_cur, no_wait = run_virtual(main())
    assert stall > 2.0  # the pause, and a re-prefill burst on top
    assert got == pytest.approx(pools + stall)
    assert got > m_cur  # the lent half of the pool leaves for the training step
    assert no_wait == m_cur  # no batch for the trainer: nothing returns, nothing syncs


def test_batch_start_prediction_composes_known_reclaims_and_expansions() -> None:
    """A reclaim notice pending at a batch's start takes its workers away when its shrink starts; an
    expansion in preparation adds its members when preparation and finalization are expected done
    (``outlook.pool_changes``)."""
    from pearl.core.events import GpusGranted, GrantedGpu, ReclaimNotice
    from pearl.core.makespan import compose_makespan

    async def main():
        clock = LoopClock()
        cfg = config(**{"workload.batch_size": 8, "workload.group_size": 4, "cluster.reserved_gpus": 2,
                        "cluster.training_gpus": 0, "cluster.max_preemptible_gpus": 4,
                        "policy.gate_enabled": False})

        def factory(spec: SessionSpec) -> ScriptedSession:
            return ScriptedSession(spec, clock, turns=3, response=200, env_s=2.0)

        ctl = Controller(cfg, engine(clock, cfg), factory, clock=clock, max_batches=0)
        await ctl.start()
        el = ctl.elastic
        await el.idle()
        await ctl.submit(GpusGranted(tuple(GrantedGpu(g, "pn0", "i-1") for g in ("p0", "p1")), event_id="g1"))
        await el.idle()
        grp = list(ctl.rebuilder.groups.values())[-1]
        await grp.task
        await el.idle()
        assert el.decision.n_workers == 4 and not ctl.rebuilder.pending()
        m4 = el.decision.predicted_makespan_s
        assert el.batch_forecast(trainer_waits=True) == m4  # nothing known: the decision as it is

        # a notice on p1, 100 s ahead: one worker leaves when its shrink starts
        now = clock.now()
        await ctl.submit(ReclaimNotice(("p1",), deadline=now + 100.0, notice_id="n1", event_id="rc1"))
        await el.idle()
        got_notice = el.batch_forecast(trainer_waits=False)
        on3 = el.decider().decide(3, el.allocation).predicted_makespan_s  # the allocation in force, on 3
        want_notice = compose_makespan([(0.0, m4), (100.0 - el.shrink_margin_s, on3)])

        # a grant of two more GPUs while the notice is pending: an expansion group starts preparing
        await ctl.submit(GpusGranted(tuple(GrantedGpu(g, "pn1", "i-2") for g in ("p2", "p3")), event_id="g2"))
        await el.idle()
        (pend,) = ctl.rebuilder.pending()
        changes = pool_changes(el.outlook(), False, el.decision.n_workers)
        t_join = pend.started_at + el.costs.expansion_prep_s + el.costs.expansion_final_s - clock.now()
        await ctl.stop()
        return got_notice, want_notice, changes, t_join, len(pend.members), clock.now() - now, m4

    got_notice, want_notice, changes, t_join, k, dt, m4 = run_virtual(main())
    assert got_notice == pytest.approx(want_notice) and got_notice > m4
    assert k == 2
    want = sorted([(100.0 - 5.0 - dt, -1), (t_join, k)])
    assert [c[1] for c in changes] == [w[1] for w in want]
    assert [c[0] for c in changes] == [pytest.approx(w[0]) for w in want]


def test_weight_sync_pause_is_measured_and_only_a_trainer_brings_syncs() -> None:
    """A sync that lands while a batch runs is timed (``Controller.publish`` ->
    ``ElasticScheduler.observe_weight_sync``, EMA ``CostModel.weight_sync_s``); a controller that
    never saw a training step adds no sync to its batch-start prediction."""
    from pearl.sim.emulated_trainer import EmulatedTrainer

    async def main(with_trainer: bool):
        clock = LoopClock()
        cfg = config(**{"workload.batch_size": 8, "workload.group_size": 4, "cluster.reserved_gpus": 2,
                        "cluster.training_gpus": 0, "cluster.max_preemptible_gpus": 0,
                        "train.step_time_s": 20.0, "emulator.weight_update_s": 6.0,
                        "policy.initial_weight_sync_s": 2.0, "policy.cost_ema_alpha": 0.5,
                        "policy.max_staleness": 1 if with_trainer else 3})  # no trainer: no version ever

        def factory(spec: SessionSpec) -> ScriptedSession:
            return ScriptedSession(spec, clock, turns=4, response=200, env_s=15.0)

        ctl = Controller(cfg, engine(clock, cfg), factory, clock=clock, max_batches=3)
        await ctl.start()
        trainer = EmulatedTrainer(clock, cfg.train.step_time_s, ctl.take_batch, ctl.notify,
                                  lambda v: ctl.publish(v, None))
        if with_trainer:
            trainer.start()
        await ctl.wait_batches(3)
        el = ctl.elastic
        d = el.decider().decide(el.decision.n_workers, el.allocation)
        pred = el.batch_forecast(trainer_waits=True)
        await trainer.stop()
        await ctl.stop()
        return el.costs.weight_sync_s, el.trainer.steps_seen, pred, d.predicted_makespan_s, ctl.pipeline.stats.weight_syncs

    sync_s, seen, pred, m_cur, syncs = run_virtual(main(True))
    assert seen >= 2 and syncs >= 2
    assert 4.0 < sync_s <= 6.5  # from the 2-s prior towards the emulator's 6-s load (+ the drain)
    assert pred > m_cur + sync_s  # the pause and the re-prefill burst: the step ends inside the batch

    sync_s, seen, pred, m_cur, syncs = run_virtual(main(False))
    assert seen == 0 and syncs == 0 and sync_s == 2.0
    assert pred == m_cur
