"""Controller kill -9 + restart on the journal: completed trajectories, partial outputs and the batch
the trainer held mid-update survive."""

from __future__ import annotations

from pathlib import Path

import pytest

from pearl.core.state import ClusterState, Gpu, Role, Worker, WorkerStatus, Zone
from pearl.reliability.restart import kill_and_restart
from pearl.runtime.journal import first_unconsumed_batch
from pearl.runtime.journal_replay import restart_state


def test_kill_9_then_restart_loses_nothing(tmp_path: Path) -> None:
    rep = kill_and_restart(tmp_path / "journal.db", seed=0, kill_after_batches=2, kill_after_done=5, more_batches=2)
    d = rep.to_dict()
    assert d["ok"], d["problems"]
    j, r = d["journaled"], d["recovered"]
    # two batches of 16 handed to the trainer before the kill; it had finished its update on the
    # first and was training on the second: only the first is consumed
    assert j["taken"] == 32 and j["trained"] == 16 and j["held_by_trainer"] == 16
    assert j["consumed"] == j["trained"]
    assert j["completed_unconsumed"] >= 16 + 5 and j["partial_parts"] > 0  # killed mid-batch
    assert r["completed_redelivered_as_journaled"] == j["completed_unconsumed"]
    assert r["held_by_trainer_redelivered"] == 16  # the held batch reaches the trainer again, as journaled
    assert r["consumed_redelivered"] == 0
    assert r["partial_tokens_replayed"] == j["partial_tokens"]
    assert r["partial_tokens_in_final_trajectories"] == j["partial_tokens"]
    assert r["restart_first_batch"] == 1


def test_restart_state_keeps_gpus_drops_workers() -> None:
    st = ClusterState.build(
        [Gpu("r0", Zone.RESERVED), Gpu("s0", Zone.PREEMPTIBLE, instance_id="i-0"), Gpu("t0", Zone.OVERLAP, lent=True)],
        [Worker("w0", ("r0",), Role.COLOCATED, WorkerStatus.ACTIVE), Worker("o", ("t0",), Role.COLOCATED,
                                                                             WorkerStatus.ACTIVE)],
    )
    back = restart_state(st.to_dict())
    assert set(back.gpus) == {"r0", "s0", "t0"} and not back.workers
    assert back.gpus["s0"].instance_id == "i-0" and not back.gpus["t0"].lent


def test_first_unconsumed_batch() -> None:
    ids = [f"b{r}-g{g}-s{s}" for r in range(3) for g in range(2) for s in range(2)]
    assert first_unconsumed_batch(ids, 4) == 3
    assert first_unconsumed_batch(ids[:6], 4) == 1
    assert first_unconsumed_batch([], 4) == 0


def test_a_batch_is_consumed_only_once_its_update_is_durable(tmp_path: Path) -> None:
    """``train.checkpoint_every`` > 1: an update without a checkpoint leaves its batch unconsumed until
    the next checkpointed one; the batch held mid-update at the stop reaches the restarted trainer."""
    from pearl.engines.emulated import EmulatedEngine
    from pearl.reliability.restart import restart_config
    from pearl.runtime.clock import LoopClock, run_virtual
    from pearl.runtime.controller import Controller
    from pearl.runtime.journal import Journal
    from pearl.sim.sessions import SyntheticSessionFactory

    cfg = restart_config(0)
    path = tmp_path / "journal.db"

    async def run(steps: int, version: int = 0) -> tuple[list[list[str]], list[int], int, Controller]:
        clock = LoopClock()
        journal = Journal(path)
        ctrl = Controller(cfg, EmulatedEngine.from_config(cfg, clock), SyntheticSessionFactory(cfg.workload, clock),
                          clock=clock, journal=journal, initial_weights=(version, f"emulated://v{version}"))
        await ctrl.start()
        taken, consumed = [], []
        try:
            for step in range(1, steps + 1):
                taken.append([r.traj_id for r in await ctrl.take_batch()])
                if step < steps:
                    await ctrl.publish(step, None, durable=step % 2 == 0)  # a checkpoint every 2 updates
                consumed.append(journal.counts()["consumed"])
            first = ctrl.pipeline.first_batch
        finally:
            await ctrl.stop()
            journal.close()
        return taken, consumed, first, ctrl

    taken, consumed, first, _ = run_virtual(run(4))
    # update 1 (no checkpoint) leaves batch 0 unconsumed; update 2 consumes 0 and 1; update 3 (no
    # checkpoint) leaves batch 2 unconsumed; batch 3 is held when the controller stops
    assert consumed == [0, 32, 32, 32] and first == 0
    with pytest.raises(RuntimeError, match="without a batch taken"):
        Controller(cfg, EmulatedEngine.from_config(cfg, LoopClock()), SyntheticSessionFactory(cfg.workload, LoopClock()),
                   clock=LoopClock()).batch_trained()
    with Journal(path) as j:
        run_ = j.recover()
    assert run_.consumed == frozenset(taken[0] + taken[1])
    again, _, first2, _ = run_virtual(run(1, version=2))
    assert first2 == 2 and again[0] == taken[2]  # training resumes from checkpoint 2 on batch 2


def test_restart_campaign_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    """Kill -9 at random points over several training steps with events in flight: every
    acknowledged event is journaled and applied, no trajectory is lost or trained twice, and each
    life's trainer resumes at the journal's version."""
    from pearl.reliability.restart import campaign

    rep = campaign(tmp_path / "journal.db", seed=3, min_steps=4, min_kills=3).to_dict()
    assert rep["ok"], rep["problems"]
    assert rep["kills"] >= 3 and rep["training_steps"] >= 4 and rep["version_mismatches"] == 0
    assert rep["events_accepted"] == rep["events_journaled"] > 0
    assert rep["notices_applied"] == rep["notices_accepted"] and rep["grants_applied"] == rep["grants_accepted"]
    assert rep["trajectories_trained"] >= 4 * 16
    assert rep["trajectories_lost"] == 0 and rep["trajectories_duplicated"] == 0
