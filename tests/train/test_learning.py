"""Learning smoke test: GRPO through the real trainer process raises the toy-task reward.

The loop is the real asynchronous one in miniature: sample with the current snapshot (loaded by
transformers from the folder the trainer wrote), hand the records to ``TrainerClient``, repeat.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pearl.config import TrainSpec
from pearl.train.client import TrainerClient
from pearl.train.toytask import ToyTask
from tests.conftest import MODELS_DIR

STEPS = 10


@pytest.mark.slow  # ~20 s on an idle 2-core machine (10 GRPO steps through the real trainer)
async def test_reward_rises_on_the_toy_task(micro_model: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    base = MODELS_DIR / "tiny-qwen3"
    if not (base / "model.safetensors").is_file():
        base = micro_model  # `make models` not run: the same test on the locally built micro model
    spec = TrainSpec(learning_rate=1e-2, checkpoint_every=STEPS)
    curve: list[float] = []
    async with TrainerClient(base, tmp_path, spec, max_staleness=0) as client:
        path = base
        for step in range(STEPS):
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
            task = ToyTask(vocab_size=model.config.vocab_size, n_groups=4, group_size=8)
            recs = task.rollout(model, client.version, seed=step)
            curve.append(sum(r.reward for r in recs) / len(recs))
            res = await client.train_step(recs)
            assert res.updated and res.version == step + 1 and res.report.kept == len(recs)
            assert res.snapshot is not None
            path = Path(res.snapshot.path)
    print("reward per step:", [round(r, 3) for r in curve])
    first, last = sum(curve[:3]) / 3, sum(curve[-3:]) / 3
    assert last >= first + 0.15, curve
