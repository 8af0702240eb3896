"""Controller kill -9 and restart: nothing completed or partially generated is lost.

``python -m pearl.reliability.restart --journal J [--seed S]`` runs the real ``Controller`` with a
``Journal`` on the emulated engine in virtual time, with the emulated trainer consuming batches,
and prints ``batch <n> <ids...>`` each time the trainer takes a batch and ``trained`` each time it
finishes an update (flushed: the parent knows what was acknowledged). The parent kills it with SIGKILL at a point of its choosing
(``kill_and_restart``), then restarts a controller in-process on the same journal and runs until
``more_batches`` further batches are consumed, then compares:

* ``journaled``: what the journal held at the kill - completed trajectories (and which the
  trainer had consumed: trained on, the update done; a batch the trainer held mid-update is not), partial parts and tokens of in-flight trajectories, the GPU table;
* ``recovered``: unconsumed completed trajectories re-delivered *as journaled* (identical
  records, not regenerated; the batch the trainer held at the kill among them), consumed ones never
  re-delivered, journaled parts replayed by
  ``JournaledEngine`` (tokens reused, not generated again), and every delivered trajectory passing
  the exact token-position check of ``pearl.reliability.invariants``.

Life cycle: one subprocess (killed) + one in-process restart on a virtual-time loop.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pearl.config import RunConfig
from pearl.core.trajectory import TrajectoryRecord
from pearl.runtime.clock import LoopClock, run_virtual
from pearl.runtime.journal import Journal


def restart_config(seed: int = 0) -> RunConfig:
    from pearl.reliability.chaos import chaos_config

    cfg = chaos_config(seed=seed)
    d = cfg.model_dump()
    d["policy"].update(gate_enabled=True)
    return RunConfig.model_validate(d)


async def _run(cfg: RunConfig, journal_path: str, stop_after: int | None, start_version: int,
               on_batch: Any) -> dict[str, Any]:
    from pearl.engines.emulated import EmulatedEngine
    from pearl.runtime.controller import Controller
    from pearl.sim.emulated_trainer import EmulatedTrainer
    from pearl.sim.sessions import SyntheticSessionFactory

    clock = LoopClock()
    journal = Journal(journal_path)
    engine = EmulatedEngine.from_config(cfg, clock)

    def announce(rec: TrajectoryRecord) -> None:  # journaled first (the Controller's order), then acknowledged
        on_batch(None, rec)

    ctrl = Controller(cfg, engine, SyntheticSessionFactory(cfg.workload, clock), clock=clock, journal=journal,
                      initial_weights=(start_version, f"emulated://v{start_version}"), on_trajectory_done=announce)
    done = asyncio.get_running_loop().create_future()
    taken = 0

    async def take() -> list[TrajectoryRecord]:
        nonlocal taken
        batch = await ctrl.take_batch()
        on_batch(batch, None)
        taken += 1
        if stop_after is not None and taken >= stop_after and not done.done():
            done.set_result(None)
        return batch

    async def publish(version: int) -> None:  # the update is done: journaled consumed, then acknowledged
        await ctrl.publish(version, None)
        on_batch(None, None)

    await ctrl.start()
    trainer = EmulatedTrainer(clock, cfg.train.step_time_s, take, ctrl.notify, publish)
    trainer.stats.version = trainer.stats.steps = start_version
    trainer.start()
    try:
        await done
    finally:
        await trainer.stop()
        stats = {"replayed_parts": getattr(ctrl.engine, "replayed_parts", 0),
                 "replayed_tokens": getattr(ctrl.engine, "replayed_tokens", 0),
                 "replay_mismatches": getattr(ctrl.engine, "replay_mismatches", 0),
                 "first_batch": ctrl.pipeline.first_batch}
        await ctrl.stop()
        journal.close()
    return stats


@dataclass
class RestartReport:
    killed_after_batches: int
    journaled: dict[str, int] = field(default_factory=dict)
    recovered: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"killed_after_batches": self.killed_after_batches, "journaled": self.journaled,
                "recovered": self.recovered, "problems": self.problems[:10], "ok": not self.problems}


def kill_and_restart(journal_path: str | Path, seed: int = 0, kill_after_batches: int = 2,
                     kill_after_done: int = 5, more_batches: int = 3) -> RestartReport:
    """Run the journaled controller in a subprocess, SIGKILL it once it has handed
    ``kill_after_batches`` batches to the trainer and completed ``kill_after_done`` more
    trajectories (the others are mid-flight), restart on the journal and compare."""
    journal_path = str(journal_path)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    proc = subprocess.Popen([sys.executable, "-m", "pearl.reliability.restart", "--journal", journal_path,
                             "--seed", str(seed)], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    acked: list[list[str]] = []
    trained = 0  # the first ``trained`` acked batches finished training (FIFO, one update each)
    done_after = 0
    for line in proc.stdout:
        if line.startswith("batch "):
            acked.append(line.split()[2:])
        elif line.startswith("trained"):
            trained += 1
        elif line.startswith("done ") and len(acked) >= kill_after_batches:
            done_after += 1
            if done_after >= kill_after_done:
                break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    rep = RestartReport(len(acked))
    with Journal(journal_path) as j:
        run = j.recover()
    trained_ids = {t for b in acked[:trained] for t in b}
    missing = trained_ids - run.consumed
    if missing:
        rep.problems.append(f"{len(missing)} trajectories the trainer finished training on are not journaled "
                            "as consumed")
    # taken but not trained at the kill: unconsumed (delivered again below), unless the kill landed
    # between the journal write and the acknowledgement
    held = [t for b in acked[trained:] for t in b]
    unconsumed = {r.traj_id: r for r in run.unconsumed}
    journaled_parts = {t: ps for t, ps in run.partials.items()}
    rep.journaled = {
        "taken": sum(map(len, acked)), "trained": len(trained_ids), "held_by_trainer": len(held),
        "completed": len(run.completed), "consumed": len(run.consumed), "completed_unconsumed": len(unconsumed),
        "in_flight_trajectories": len(journaled_parts),
        "partial_parts": sum(len(ps) for ps in journaled_parts.values()), "partial_tokens": run.partial_tokens,
        "gpus": len(run.state["gpus"]) if run.state else 0,
    }
    # restart in-process on the same journal
    cfg = restart_config(seed)
    delivered: list[TrajectoryRecord] = []
    consumed_batches = len({t.split("-", 1)[0] for t in run.consumed})

    def collect(batch: list[TrajectoryRecord] | None, _rec: TrajectoryRecord | None) -> None:
        if batch is not None:
            delivered.extend(batch)

    stats = run_virtual(_run(cfg, journal_path, more_batches, consumed_batches, collect))
    by_id = {r.traj_id: r for r in delivered}
    redelivered = sorted(set(by_id) & run.consumed)
    if redelivered:
        rep.problems.append(f"{len(redelivered)} consumed trajectories delivered again, e.g. {redelivered[:3]}")
    if len(by_id) != len(delivered):
        rep.problems.append(f"{len(delivered) - len(by_id)} trajectories delivered twice after the restart")
    same = sum(1 for t, r in unconsumed.items() if by_id.get(t) == r)
    lost = sorted(t for t in unconsumed if t not in by_id)
    changed = sorted(t for t in unconsumed if t in by_id and by_id[t] != unconsumed[t])
    if changed:
        rep.problems.append(f"{len(changed)} journaled trajectories were regenerated, e.g. {changed[:3]}")
    if lost:
        rep.problems.append(f"{len(lost)} journaled completed trajectories not delivered, e.g. {lost[:3]}")
    kept_tokens = 0
    for t, ps in journaled_parts.items():
        r = by_id.get(t)
        if r is None:
            continue  # a later batch than the restart ran to
        for turn in {p.turn for p in ps}:
            want = [x for p in ps if p.turn == turn for x in p.tokens]
            got = [x for s in r.segments if s.trained and s.turn == turn for x in s.token_ids]
            if got[:len(want)] != want:
                rep.problems.append(f"{t} turn {turn}: the journaled partial output is not the prefix after restart")
            else:
                kept_tokens += len(want)
    from pearl.engines.emulated import EmulatedEngine

    token_at = EmulatedEngine.from_config(cfg, LoopClock()).token_at  # what the engine generates where
    bad = 0
    for r in delivered:
        q = 0
        for s in r.segments:
            if s.trained and any(tok != token_at(r.traj_id, q + i)
                                 for i, tok in enumerate(s.token_ids)):
                bad += 1
            q += len(s.token_ids)
    if bad:
        rep.problems.append(f"{bad} response segments with tokens generated twice or skipped")
    if stats["replay_mismatches"]:
        rep.problems.append(f"{stats['replay_mismatches']} journaled turns could not be replayed (context diverged)")
    rep.recovered = {
        "completed_redelivered_as_journaled": same, "consumed_redelivered": len(redelivered),
        "partial_parts_replayed": stats["replayed_parts"], "partial_tokens_replayed": stats["replayed_tokens"],
        "partial_tokens_in_final_trajectories": kept_tokens, "restart_first_batch": stats["first_batch"],
        "held_by_trainer_redelivered": sum(1 for t in held if t in unconsumed and by_id.get(t) == unconsumed[t]),
        "delivered_after_restart": len(delivered),
    }
    return rep


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="journaled controller run (killed by the restart test)")
    ap.add_argument("--journal", required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    def on_batch(batch: list[TrajectoryRecord] | None, rec: TrajectoryRecord | None) -> None:
        if batch is not None:
            print("batch", len(batch), *[r.traj_id for r in batch], flush=True)
        if rec is not None:
            print("done", rec.traj_id, flush=True)
        if batch is None and rec is None:
            print("trained", flush=True)

    run_virtual(_run(restart_config(args.seed), args.journal, None, 0, on_batch))


if __name__ == "__main__":
    main()
