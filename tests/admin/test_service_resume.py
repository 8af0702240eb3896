"""A restarted real-engine service continues training from the trainer's last checkpoint.

Real: the ``Service`` of ``pearl serve`` on its real-engine path (``engine.kind: vllm``), the tiny
Qwen3's tokenizer and the tiny environment, the real GRPO trainer rank (a child process, gloo on
CPU), the weight registry, the training loop and the journal. Emulated: the inference engine (the
``EmulatedEngine`` with the tiny Qwen3's vocabulary stands in for the vLLM servers, so the test takes
seconds of rollout instead of minutes of server start-up); it records every ``load_weights`` call, which
is what the check on the workers' initial weights reads.

Checked: run 1 trains 1 update (checkpoint and snapshot v1); run 2 on the same ``output_dir`` starts
its trainer from checkpoint step 1 (not from the base model), its workers load snapshot v1 first,
and its update publishes v2, which the workers load next.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from pearl.config import parse_config
from pearl.engines.emulated import EmulatedEngine
from pearl.runtime.clock import LoopClock
from pearl.runtime.train_loop import ResumeError, resume_point
from pearl.serve import Service
from tests.conftest import MODELS_DIR

pytestmark = [pytest.mark.slow]


class RecordingEngine(EmulatedEngine):
    """The emulated engine, recording every weight load (worker, version, path)."""

    loads: list[tuple[str, int, str]]

    async def load_weights(self, worker_id: str, path: str, version: int) -> None:
        self.loads.append((worker_id, version, path))
        await super().load_weights(worker_id, path, version)


def tiny_cfg(out: Path) -> Any:
    return parse_config({
        "name": "resume-test",
        "model": {"from": "tiny-qwen3", "path": str(MODELS_DIR / "tiny-qwen3")},
        "hardware": "h200",
        "cluster": {"reserved_gpus": 1, "max_preemptible_gpus": 0, "training_gpus": 0, "tp_size": 1,
                    "gpus_per_node": 1},
        "workload": {"batch_size": 4, "group_size": 2, "max_trajectory_tokens": 1024, "system_prompt_tokens": 200,
                     "turns": {"mean": 1, "cv": 0.0, "min": 1, "max": 1}},
        "engine": {"kind": "vllm", "max_model_len": 1024},
        "emulator": {"launch_s": [0.05, 0.1], "admission_s": [0.01, 0.02], "activation_s": [0.01, 0.02],
                     "deactivation_s": [0.01, 0.02], "weight_update_s": 0.01,
                     "costs": "datasheet"},  # tiny-qwen3 is not in the measured kernel database
        "env": {"kind": "tiny", "num_tasks": 4, "max_new_tokens": 8, "max_turns": 1, "min_turn_tokens": 4},
        "train": {"world_size": 1, "backend": "gloo", "learning_rate": 1e-4, "micro_batch_tokens": 1024},
        "policy": {"max_staleness": 1},
        "admin": {"tensorboard": False, "port": 0},
        "trace": None,
        "output_dir": str(out),
    }, "test")


async def run_service(cfg: Any, steps: int, at_start: list[Any] | None = None) -> tuple[Service, RecordingEngine]:
    clock = LoopClock()
    engines: list[RecordingEngine] = []

    def make_engine(_node_of: Any) -> RecordingEngine:
        e = RecordingEngine(cfg.model, cfg.hardware, clock, cfg.emulator, cfg.cluster.tp_size)
        e.loads = []
        engines.append(e)
        return e

    service = Service(cfg, clock, engine_factory=make_engine, port=0, steps=steps)
    try:
        await service.start()
        if at_start is not None and service.controller is not None:
            at_start.append(service.controller.progress())
        rc = await service.run(asyncio.Event())
        assert rc == 0 and len(service.steps_done) == steps
    finally:
        await service.stop()
    return service, engines[0]


@pytest.mark.timeout(600)
async def test_restarted_service_continues_from_the_last_checkpoint(tmp_path: Path) -> None:
    from pearl.models import ensure_models

    ensure_models(MODELS_DIR, ("tiny-qwen3",))  # built by `make test` already; ~3 s otherwise
    out = tmp_path / "run"
    cfg = tiny_cfg(out)
    work = out / "trainer"

    first, eng1 = await run_service(cfg, steps=1)
    assert first.resumed_from is None and first.trainer.setup_info["resumed_from"] is None
    assert [r.version for r in first.steps_done] == [1]
    assert eng1.loads[0][1:] == (0, str(MODELS_DIR / "tiny-qwen3"))  # run 1 starts from the base model
    assert (work / "checkpoints" / "step-000001" / "trainer.pt").is_file()
    ref = resume_point(work)
    assert ref is not None and ref.version == 1 and Path(ref.path) == (work / "snapshots" / "v1").resolve()

    second, eng2 = await run_service(cfg, steps=1)
    assert second.resumed_from == ref
    assert str(second.trainer.setup_info["resumed_from"]).endswith("step-000001")  # not the base model
    assert [r.version for r in second.steps_done] == [2]
    # the workers start on the checkpoint's snapshot, then load the update trained on top of it
    assert eng2.loads[0][1:] == (1, ref.path)
    assert (2, str((work / "snapshots" / "v2").resolve())) in [x[1:] for x in eng2.loads]
    assert all(v >= 1 for _, v, _ in eng2.loads)
    assert (work / "checkpoints" / "step-000002" / "trainer.pt").is_file()


def test_resume_point_names_a_missing_snapshot(tmp_path: Path) -> None:
    assert resume_point(tmp_path) is None  # nothing trained yet: a fresh run
    (tmp_path / "checkpoints" / "step-000004").mkdir(parents=True)
    assert resume_point(tmp_path) is None  # an incomplete checkpoint folder is not picked
    (tmp_path / "checkpoints" / "step-000004" / "trainer.pt").write_bytes(b"x")
    with pytest.raises(ResumeError, match=r"snapshots/v4"):
        resume_point(tmp_path)


@pytest.mark.timeout(600)
async def test_an_update_without_a_checkpoint_is_trained_again_after_a_restart(tmp_path: Path) -> None:
    """``train.checkpoint_every: 2``: run 1's single update writes no checkpoint, so its batch stays
    unconsumed in the journal; run 2 starts from the base model and trains on that batch again."""
    from pearl.models import ensure_models
    from pearl.runtime.journal import Journal

    ensure_models(MODELS_DIR, ("tiny-qwen3",))
    out = tmp_path / "run"
    cfg = tiny_cfg(out)
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"checkpoint_every": 2})})
    first, _ = await run_service(cfg, steps=1)
    assert [r.version for r in first.steps_done] == [1]
    assert not (out / "trainer" / "checkpoints").exists() or resume_point(out / "trainer") is None
    with Journal(first.journal_path) as j:
        run = j.recover()
    assert not run.consumed and len(run.completed) >= 4  # trained on, but nothing durable: not consumed
    second, eng2 = await run_service(cfg, steps=1)
    assert second.resumed_from is None and [r.version for r in second.steps_done] == [1]
    assert eng2.loads[0][1:] == (0, str(MODELS_DIR / "tiny-qwen3"))


@pytest.mark.timeout(900)
async def test_restart_after_two_updates_resumes_at_v2_and_trains_on(tmp_path: Path) -> None:
    """Past the first two batches: run 1 makes updates v1 and v2, run 2 starts its trainer rank from
    checkpoint 2, its pipeline at batch 2 (batches 0 and 1 consumed) and makes v3 and v4."""
    from pearl.models import ensure_models
    from pearl.runtime.journal import Journal

    ensure_models(MODELS_DIR, ("tiny-qwen3",))
    out = tmp_path / "run"
    cfg = tiny_cfg(out)
    first, _ = await run_service(cfg, steps=2)
    assert [r.version for r in first.steps_done] == [1, 2]
    with Journal(first.journal_path) as j:
        assert j.trained_batches(cfg.workload.batch_size) == 2
    started: list[Any] = []
    second, eng2 = await run_service(cfg, steps=2, at_start=started)
    assert (started[0].train_step, started[0].weight_version) == (2, 2)  # metrics do not fall back to 0
    assert second.resumed_from is not None and second.resumed_from.version == 2
    assert str(second.trainer.setup_info["resumed_from"]).endswith("step-000002")
    assert second.controller is not None and second.controller.pipeline.first_batch == 2
    assert [r.version for r in second.steps_done] == [3, 4]
    assert eng2.loads[0][1] == 2 and all(v >= 2 for _, v, _ in eng2.loads)
    assert second.controller.progress().train_step == 4
