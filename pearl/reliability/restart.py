"""Controller kill -9 and restart: nothing completed or partially generated is lost.

``python -m pearl.reliability.restart --journal J --run-campaign K [--seed S]`` is the restart
campaign (``campaign``): at least K kills -9 at random points over >= 10 training steps, the admin
gate granting GPUs and sending cloud notices meanwhile; it prints accepted vs journaled vs applied
events, trajectories lost / duplicated and the time to resume.

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
from pearl.runtime.journal_replay import JournaledEngine


def restart_config(seed: int = 0) -> RunConfig:
    from pearl.reliability.chaos import chaos_config

    cfg = chaos_config(seed=seed)
    d = cfg.model_dump()
    d["policy"].update(gate_enabled=True)
    return RunConfig.model_validate(d)


async def _run(cfg: RunConfig, journal_path: str, stop_after: int | None, on_batch: Any,
               events: Any = None) -> dict[str, Any]:
    """One controller life on the journal. The trainer resumes at the journal's version (one update
    per consumed batch: ``Journal.trained_batches``). ``events(app, clock)``: with the admin gate
    (``AdminApp`` on the journal, accepted events replayed first), a task that sends events."""
    import time as _time

    from pearl.admin.app import AdminApp, EventPolicy
    from pearl.config import AdminSpec
    from pearl.engines.emulated import EmulatedEngine
    from pearl.runtime.controller import Controller
    from pearl.sim.emulated_trainer import EmulatedTrainer
    from pearl.sim.sessions import SyntheticSessionFactory

    clock = LoopClock()
    journal = Journal(journal_path)
    version = journal.trained_batches(cfg.workload.batch_size)
    engine = EmulatedEngine.from_config(cfg, clock, iteration_log=[])

    def announce(rec: TrajectoryRecord) -> None:  # journaled first (the Controller's order), then acknowledged
        on_batch(None, rec)

    ctrl = Controller(cfg, engine, SyntheticSessionFactory(cfg.workload, clock), clock=clock, journal=journal,
                      initial_weights=(version, f"emulated://v{version}") if version else None,
                      on_trajectory_done=announce)
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
    app = None
    replayed: dict[str, int] = {}
    driver: asyncio.Task[None] | None = None
    if events is not None:
        app = AdminApp(ctrl, AdminSpec(port=0), None, clock.now, _time.time, clock.now,
                       policy=EventPolicy(training_owner="the emulated trainer",
                                          max_preemptible_gpus=cfg.cluster.max_preemptible_gpus))
        replayed = await app.replay()
    trainer = EmulatedTrainer(clock, cfg.train.step_time_s, take, ctrl.notify, publish, start_version=version)
    trainer.start()
    if app is not None:
        print("ready", ctrl.pipeline.first_batch, trainer.stats.version, replayed.get("replayed", 0),
              replayed.get("done", 0), flush=True)
        driver = asyncio.get_running_loop().create_task(events(app, clock), name="event-driver")
    try:
        if driver is not None:
            await asyncio.wait({done, driver}, return_when=asyncio.FIRST_COMPLETED)
        else:
            await done
    finally:
        if driver is not None:
            driver.cancel()
            await asyncio.gather(driver, return_exceptions=True)
        await trainer.stop()
        if app is not None:
            app.settle()
        replay = ctrl.engine if isinstance(ctrl.engine, JournaledEngine) else None
        stats = {"replayed_parts": replay.replayed_parts if replay else 0,
                 "replayed_tokens": replay.replayed_tokens if replay else 0,
                 "replay_mismatches": replay.replay_mismatches if replay else 0,
                 "first_batch": ctrl.pipeline.first_batch, "start_version": version,
                 "events_replayed": replayed.get("replayed", 0),
                 "gpus": sorted(g["gpu_id"] for g in ctrl.state_dict()["gpus"])}
        await ctrl.stop()
        journal.close()
    return stats


def event_driver(seed: int) -> Any:
    """Grants of one preemptible GPU each (``g<k>`` on instance ``i-<k>``) and, a little later, a
    cloud reclaim notice for that instance (due 0-60 s on), at random virtual times; prints
    ``accepted <event id>`` once the gate answered 202 (journaled), ``refused <event id> <status>``
    otherwise. Ids continue where the journal's events end, so they are unique across restarts."""

    async def drive(app: Any, clock: Any) -> None:
        import random
        import time as _time

        from pearl.admin.http import ApiError
        from pearl.core.events import EventKind

        k = app.control.door.count(EventKind.GPUS_GRANTED)
        rng = random.Random(seed * 1000 + k)
        while True:
            await clock.sleep(rng.uniform(20.0, 90.0))
            gid, inst = f"g{k}", f"i-{k:04d}"
            for name, call in (
                (f"grant-{k}", lambda gid=gid, inst=inst, k=k: app.grant_gpus(
                    [{"gpu_id": gid, "node": "node0", "instance_id": inst}], f"grant-{k}")),
                (f"notice-{k}", lambda inst=inst: app.cloud_signal(inst, "node0", _time.time() + rng.uniform(0, 60),
                                                                   "aws-spot")),
            ):
                try:
                    out = await call()
                except ApiError as e:
                    print("refused", name, e.status, flush=True)
                    break
                print("accepted", name, out["event_id"], flush=True)
                await clock.sleep(rng.uniform(5.0, 40.0))
            k += 1

    return drive


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

    stats = run_virtual(_run(cfg, journal_path, more_batches, collect))
    if stats["start_version"] != consumed_batches:
        rep.problems.append(f"the trainer resumed at v{stats['start_version']}, the journal holds "
                            f"{consumed_batches} consumed batches")
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


@dataclass
class CampaignReport:
    """A restart campaign (``campaign``): what was acknowledged before each kill, what the journal
    and the final restart show."""

    kills: int = 0
    training_steps: int = 0
    events_accepted: int = 0
    events_journaled: int = 0
    events_replayed: int = 0  # accepted before a kill, not finished by then: submitted again by the next life
    notices_accepted: int = 0
    notices_applied: int = 0
    grants_accepted: int = 0
    grants_applied: int = 0
    trajectories_trained: int = 0
    trajectories_lost: int = 0
    trajectories_duplicated: int = 0
    version_mismatches: int = 0
    resume_s: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        import statistics

        d = {k: v for k, v in vars(self).items() if k not in ("resume_s", "problems")}
        d["resume_s"] = {"median": round(statistics.median(self.resume_s), 3) if self.resume_s else None,
                         "max": round(max(self.resume_s), 3) if self.resume_s else None, "n": len(self.resume_s)}
        d["problems"] = self.problems[:10]
        d["ok"] = not self.problems
        return d


def campaign(journal_path: str | Path, seed: int = 0, min_steps: int = 10, min_kills: int = 5,
             max_kills: int = 40) -> CampaignReport:
    """Kill -9 a journaled controller (emulated engine, virtual time, the admin gate granting GPUs
    and sending cloud reclaim notices) at random points, restart it on the same journal each time,
    until the trainer has made ``min_steps`` updates and ``min_kills`` kills happened; then restart
    once more in-process and check: every acknowledged event is journaled and applied (a notice's
    GPUs left the table, a grant's GPUs entered it), every trajectory the trainer finished training
    on is consumed (not lost) and none is delivered again (not duplicated), each life's trainer
    starts at the journal's version. ``resume_s``: wall seconds from a kill to the next life's
    ``ready`` (process start-up, journal recovery, event replay and the controller's start)."""
    import random
    import time as _time

    journal_path = str(journal_path)
    rng = random.Random(seed)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    rep = CampaignReport()
    accepted: dict[str, str] = {}  # name -> event id
    trained: set[str] = set()
    delivered_after_trained: set[str] = set()
    killed_at: float | None = None
    life = 0
    cfg = restart_config(seed)
    while rep.kills < max_kills and (rep.kills < min_kills or rep.training_steps < min_steps):
        proc = subprocess.Popen([sys.executable, "-m", "pearl.reliability.restart", "--journal", journal_path,
                                 "--seed", str(seed + life), "--campaign"], stdout=subprocess.PIPE, text=True,
                                env=env)
        assert proc.stdout is not None
        life += 1
        batches: list[list[str]] = []
        n_trained = 0
        kill_after = rng.randint(5, 80)
        for lines, line in enumerate(proc.stdout, 1):
            word, *rest = line.split()
            if word == "ready":
                if killed_at is not None:
                    rep.resume_s.append(_time.monotonic() - killed_at)
                first_batch, version = int(rest[0]), int(rest[1])
                if version != first_batch:
                    rep.version_mismatches += 1
                    rep.problems.append(f"life {life}: trainer at v{version}, pipeline at batch {first_batch}")
                rep.training_steps = max(rep.training_steps, version)
                rep.events_replayed += int(rest[2])
            elif word == "batch":
                ids = rest[1:]
                delivered_after_trained |= set(ids) & trained
                batches.append(ids)
            elif word == "trained":
                trained |= set(batches[n_trained])
                n_trained += 1
            elif word == "accepted":
                accepted[rest[0]] = rest[1]
            if lines >= kill_after:
                break
        proc.send_signal(signal.SIGKILL)
        killed_at = _time.monotonic()
        proc.wait()
        proc.stdout.close()
        rep.kills += 1
        with Journal(journal_path) as j:
            rep.training_steps = j.trained_batches(cfg.workload.batch_size)
    # the final life, in-process: replays what is pending and runs two more batches
    t0 = _time.monotonic()
    seen: list[list[str]] = []

    def collect(batch: list[TrajectoryRecord] | None, _rec: TrajectoryRecord | None) -> None:
        if batch is not None:
            seen.append([r.traj_id for r in batch])

    async def quiet(app: Any, clock: Any) -> None:  # no new events: let the replayed ones play out
        await clock.sleep(3600.0)

    stats = run_virtual(_run(cfg, journal_path, 2, collect, quiet))
    rep.events_replayed += stats["events_replayed"]
    if killed_at is not None:
        rep.resume_s.append(_time.monotonic() - t0)  # in-process: no process start-up
    for b in seen:
        delivered_after_trained |= set(b) & trained
    with Journal(journal_path) as j:
        events = {e.event_id: e for e in j.events()}
        consumed = j.consumed_ids()
    rep.events_accepted = len(accepted)
    rep.events_journaled = sum(1 for eid in accepted.values() if eid in events)
    rep.grants_accepted = sum(1 for n in accepted if n.startswith("grant-"))
    rep.notices_accepted = sum(1 for n in accepted if n.startswith("notice-"))
    final_gpus = set(stats["gpus"])
    for name, eid in accepted.items():
        ev = events.get(eid)
        if ev is None:
            rep.problems.append(f"event {eid} answered 202 but not in the journal")
            continue
        k = name.split("-", 1)[1]
        if name.startswith("grant-"):
            noticed = f"notice-{k}" in accepted
            if ev.status == "done" or (not noticed and f"g{k}" in final_gpus):
                rep.grants_applied += 1
            else:
                rep.problems.append(f"grant {eid}: status {ev.status}, g{k} in the final table: {f'g{k}' in final_gpus}")
        elif ev.status == "done" and f"g{k}" not in final_gpus:
            rep.notices_applied += 1
        else:
            rep.problems.append(f"notice {eid}: status {ev.status}, g{k} still in the table: {f'g{k}' in final_gpus}")
    rep.trajectories_trained = len(trained)
    rep.trajectories_lost = len(trained - consumed)
    rep.trajectories_duplicated = len(delivered_after_trained)
    if rep.trajectories_lost:
        rep.problems.append(f"{rep.trajectories_lost} trajectories trained on are not consumed in the journal")
    if rep.trajectories_duplicated:
        rep.problems.append(f"{rep.trajectories_duplicated} trajectories delivered again after being trained on")
    if stats["start_version"] != stats["first_batch"]:
        rep.problems.append(f"final life: trainer at v{stats['start_version']}, pipeline at {stats['first_batch']}")
    return rep


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="journaled controller run (killed by the restart test)")
    ap.add_argument("--journal", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--campaign", action="store_true", help="with the admin gate and its event driver")
    ap.add_argument("--run-campaign", type=int, metavar="KILLS", default=0,
                    help="run a whole campaign of at least KILLS kills (>= 10 training steps) and print its report")
    args = ap.parse_args(argv)
    if args.run_campaign:
        import json

        print(json.dumps(campaign(args.journal, args.seed, min_kills=args.run_campaign).to_dict()))
        return

    def on_batch(batch: list[TrajectoryRecord] | None, rec: TrajectoryRecord | None) -> None:
        if batch is not None:
            print("batch", len(batch), *[r.traj_id for r in batch], flush=True)
        if rec is not None:
            print("done", rec.traj_id, flush=True)
        if batch is None and rec is None:
            print("trained", flush=True)

    events = event_driver(args.seed) if args.campaign else None
    run_virtual(_run(restart_config(args.seed), args.journal, None, on_batch, events))


if __name__ == "__main__":
    main()
