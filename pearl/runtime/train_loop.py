"""The real training loop, shared by ``pearl run`` (one node) and the service (``pearl serve`` /
``torchrun pearl/main.py`` with real engines): the controller's rollout batches go to the trainer,
each update is registered and published to the serving workers.

One iteration (one training step)::

    batch  = await controller.take_batch()                 rollout batch r (staleness-gated)
    note_batch(batch, trainer.version)                     observer: reward, staleness
    result = await trainer.train_step(batch)               TrainingStarted -> update -> TrainingFinished
                                                           (the trainer tells the toggle manager itself)
    if result.updated: registry.register(snapshot)
                       await controller.publish(version, snapshot.path,   workers reload; the batch
                                                durable=result.checkpointed)  is journaled consumed
    else:              controller.batch_trained(result.checkpointed)          once checkpointed
    on_step(StepRecord)                                    progress line, timings

``trainer`` is any object with ``version`` and ``train_step(records) -> TrainResult``
(``pearl.train.client.TrainerClient`` with local ranks, ``pearl.runtime.node.trainer_client.AgentTrainerClient``
with ranks run by node agents). The loop ends after ``steps`` steps (``None``: until cancelled);
``records`` is the caller's list, appended to as steps complete, so a cancelled loop (SIGTERM on the
service) loses none of the steps it finished. Times are read from the injected ``now``.

Restart (``resume_point``): a service started again on the same ``output_dir`` continues training
from the trainer's latest complete checkpoint ``<work_dir>/checkpoints/step-<s>`` instead of the
base model: the trainer ranks start with ``--resume`` (they load model, optimizer, step and RNG of
step ``s``), the serving workers load snapshot ``<work_dir>/snapshots/v<s>`` (written in the same
update as the checkpoint) as their initial weights, and the weight registry starts with that
snapshot, so the next update publishes ``v<s+1>``. Snapshots newer than ``s`` (written by an update
whose checkpoint was skipped, ``train.checkpoint_every`` > 1) are superseded: the resumed trainer
writes them again.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pearl.core.trajectory import TrajectoryRecord
from pearl.train.snapshot import META_FILE, WEIGHTS_FILE, SnapshotRef

log = logging.getLogger("pearl.train_loop")


class ResumeError(RuntimeError):
    """A checkpoint exists but the run cannot continue from it; the message says why and what to do."""


def resume_point(work_dir: Path) -> SnapshotRef | None:
    """The snapshot to continue from: the one of the trainer's latest complete checkpoint under
    ``work_dir`` (``pearl.train.trainer.latest_checkpoint``), or None when there is no checkpoint
    (a fresh run). Raises ``ResumeError`` when the checkpoint's snapshot folder is missing."""
    ckpts = work_dir / "checkpoints"
    if not ckpts.is_dir():
        return None
    from pearl.train.trainer import latest_checkpoint  # imports torch: only when there is something to resume

    ck = latest_checkpoint(ckpts)
    if ck is None:
        return None
    step = int(ck.name.removeprefix("step-"))
    snap = work_dir / "snapshots" / f"v{step}"
    if not (snap / WEIGHTS_FILE).is_file() or not (snap / META_FILE).is_file():
        raise ResumeError(f"trainer checkpoint {ck} has no weight snapshot {snap} for the serving workers; "
                          f"restore that folder, or move {work_dir} away to start training from the base model")
    ref = SnapshotRef.from_dict(json.loads((snap / META_FILE).read_text()))
    if ref.version != step:
        raise ResumeError(f"snapshot {snap} says version {ref.version}, its checkpoint {ck} step {step}: "
                          f"the folder was overwritten; move {work_dir} away to start from the base model")
    newer = sorted(int(d.name[1:]) for d in (work_dir / "snapshots").glob("v*")
                   if d.name[1:].isdigit() and int(d.name[1:]) > step)
    if newer:
        log.warning("resuming at checkpoint step %d: snapshot(s) %s had no checkpoint and will be written again",
                    step, newer)
    return ref


@dataclass
class StepRecord:
    step: int
    version: int
    trajectories: int
    mean_reward: float
    train_s: float
    sync_s: float
    metrics: dict[str, float] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)  # TrainResult.timings (gpu_return_wait_s, ...)


def lends_training_gpus(cfg: Any) -> bool:
    """Whether the toggle manager may lend the training GPUs between updates, so the trainer must
    free its device memory after each one (``TrainerClient(release_when_idle=...)``)."""
    return bool(cfg.cluster.training_gpus > 0 and cfg.policy.borrow_enabled)


class Trainer(Protocol):
    @property
    def version(self) -> int: ...

    async def train_step(self, records: Sequence[TrajectoryRecord]) -> Any: ...


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


async def train_loop(
    controller: Any,
    trainer: Trainer,
    registry: Any,
    steps: int | None,
    *,
    records: list[StepRecord] | None = None,
    note_batch: Callable[[list[TrajectoryRecord], int], None] | None = None,
    on_step: Callable[[StepRecord], None] | None = None,
    now: Callable[[], float] = time.monotonic,
) -> list[StepRecord]:
    """Run training steps until ``len(records) == steps`` (see the module docstring)."""
    out = records if records is not None else []
    while steps is None or len(out) < steps:
        batch = await controller.take_batch()
        if note_batch is not None:
            note_batch(batch, trainer.version)
        t_tr = now()
        result = await trainer.train_step(batch)
        train_s = now() - t_tr
        sync_s = 0.0
        durable = bool(getattr(result, "checkpointed", True))
        if result.updated and result.snapshot is not None:
            registry.register(result.snapshot)
            t_sync = now()
            await controller.publish(result.version, result.snapshot.path, durable=durable)
            sync_s = now() - t_sync
        else:  # nothing trained (every group filtered): the batch is done with all the same
            controller.batch_trained(durable)
        rec = StepRecord(len(out) + 1, result.version, len(batch), _mean([r.reward for r in batch]),
                         train_s, sync_s, dict(result.metrics), dict(getattr(result, "timings", {}) or {}))
        out.append(rec)
        if on_step is not None:
            on_step(rec)
    return out
