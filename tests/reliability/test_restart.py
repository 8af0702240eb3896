"""Controller kill -9 + restart on the journal: completed trajectories and partial outputs survive."""

from __future__ import annotations

from pathlib import Path

from pearl.core.state import ClusterState, Gpu, Role, Worker, WorkerStatus, Zone
from pearl.reliability.restart import kill_and_restart
from pearl.runtime.journal import first_unconsumed_batch, restart_state


def test_kill_9_then_restart_loses_nothing(tmp_path: Path) -> None:
    rep = kill_and_restart(tmp_path / "journal.db", seed=0, kill_after_batches=2, kill_after_done=5, more_batches=2)
    d = rep.to_dict()
    assert d["ok"], d["problems"]
    j, r = d["journaled"], d["recovered"]
    assert j["consumed"] == 32  # two batches of 16 handed to the trainer before the kill
    assert j["completed_unconsumed"] >= 5 and j["partial_parts"] > 0  # killed mid-batch
    assert r["completed_redelivered_as_journaled"] == j["completed_unconsumed"]
    assert r["consumed_redelivered"] == 0
    assert r["partial_tokens_replayed"] == j["partial_tokens"]
    assert r["partial_tokens_in_final_trajectories"] == j["partial_tokens"]
    assert r["restart_first_batch"] == 2


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
