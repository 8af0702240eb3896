"""Learning smoke test: GRPO through the real trainer process raises the toy-task reward.

The loop is the real asynchronous one in miniature: sample with the current snapshot (loaded by
transformers from the folder the trainer wrote), hand the records to ``TrainerClient``, repeat.
It runs on the locally built micro Qwen3 (512-token vocabulary: the cheapest real model, always
available); ``benchmarks/bench_train.py`` prints the same curve for ``.models/tiny-qwen3``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pearl.config import TrainSpec
from pearl.train.client import TrainerClient
from pearl.train.toytask import ToyTask

STEPS = 6


@pytest.mark.slow  # ~15 s on an idle 2-core machine; minutes when the machine is oversubscribed
@pytest.mark.timeout(900)
async def test_reward_rises_on_the_toy_task(micro_model: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    spec = TrainSpec(learning_rate=3e-2, checkpoint_every=STEPS)
    curve: list[float] = []
    async with TrainerClient(micro_model, tmp_path, spec, max_staleness=0) as client:
        path = micro_model
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
