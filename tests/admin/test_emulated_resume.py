"""A restarted emulated ``pearl serve`` resumes its trainer's policy version and keeps training.

Real: the ``Service`` of ``pearl serve`` (controller, emulated engine, emulated trainer, journal,
admin API on a loopback socket, observer), in virtual time. Run 1 trains past several steps and
stops; run 2 on the same ``output_dir`` must stand at run 1's version and train further: its first
rollout batch waits for ``version >= batch - max_staleness``, so a trainer restarted at v0 would
wait forever (nothing would move).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from pearl.config import RunConfig
from pearl.reliability.chaos import chaos_config
from pearl.runtime.clock import LoopClock, run_virtual
from pearl.runtime.journal import Journal
from pearl.serve import Service


def emulated_cfg(out: Path) -> RunConfig:
    d = chaos_config(seed=1).model_dump()
    d["admin"].update(tensorboard=False, port=0)
    d["output_dir"] = str(out)
    d["train"].update(step_time_s=20.0)
    return RunConfig.model_validate(d)


async def run_until(cfg: RunConfig, version: int, budget_s: float = 6 * 3600.0) -> dict[str, Any]:
    """Start the service, wait (virtual time, at most ``budget_s``) until the trainer published
    ``version``, stop; what it started at and reached."""
    clock = LoopClock()
    svc = Service(cfg, clock, port=0)
    await svc.start()
    reached = asyncio.Event()
    trainer = svc.trainer
    publish = trainer.publish

    async def watched(v: int) -> None:
        await publish(v)
        if v >= version:
            reached.set()

    trainer.publish = watched
    started = trainer.stats.version, svc.controller.progress().weight_version, svc.controller.pipeline.first_batch
    try:
        ok = await clock.wait(reached, clock.now() + budget_s)
        progress = svc.controller.progress()
    finally:
        await svc.stop()
    return {"ok": ok, "trainer_start": started[0], "weights_start": started[1], "first_batch": started[2],
            "steps": trainer.stats.steps, "train_step": progress.train_step,
            "weight_version": progress.weight_version, "completed": progress.trajectories_completed,
            "redelivered": svc.controller.pipeline.stats.trajectories_redelivered}


def test_restart_after_three_steps_resumes_the_trainer_version(tmp_path: Path) -> None:
    cfg = emulated_cfg(tmp_path / "run")
    first = run_virtual(run_until(cfg, 3))
    assert first["ok"] and first["trainer_start"] == 0 and first["steps"] >= 3
    with Journal(tmp_path / "run" / "journal.sqlite") as j:
        trained = j.trained_batches(cfg.workload.batch_size)
        before = j.counts()
    assert trained >= 3  # each update consumed one batch, durably
    second = run_virtual(run_until(cfg, trained + 3))
    with Journal(tmp_path / "run" / "journal.sqlite") as j:
        after = j.counts()
    # the report counts what this run completed; journaled trajectories handed on again are not new
    assert second["completed"] == after["completed"] - before["completed"]
    assert second["redelivered"] == before["completed"] - before["consumed"] > 0
    assert second["ok"], second  # three more updates: the pipeline moved on from the resumed version
    assert second["trainer_start"] == trained and second["weights_start"] == trained
    assert second["first_batch"] == trained  # consumed batches are not rolled out again
    assert second["train_step"] >= trained + 3 and second["weight_version"] >= trained + 3
