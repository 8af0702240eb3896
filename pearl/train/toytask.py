"""A learnable toy task for trainer smoke tests and the training benchmark (no engine, no env).

Rollout: ``n_groups`` random prompts, each sampled ``group_size`` times by the policy itself in
plain torch (temperature 1, full vocabulary), recording the sampling logprob of every response
token and the weight version that produced it - exactly the ``TrajectoryRecord`` s the rollout side
hands the trainer.

Reward (per trajectory)::

    reward = (1 / L) * sum_t 1[y_t < V / 2]        L response tokens, V vocabulary size

i.e. the fraction of response tokens drawn from the lower half of the vocabulary. A randomly
initialised model scores about 0.5 with real spread inside a group (so GRPO advantages are
non-zero from the first step), and the policy can raise it by moving probability mass between two
halves of the output layer - a few GRPO steps suffice. (A single target token would start at a
reward of ~1/V: every advantage 0, nothing to learn from.)

The end-to-end version through the real engines and the agent loop lives in ``envs/`` (tiny env).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from pearl.core.trajectory import Segment, TrajectoryRecord


@dataclass(frozen=True)
class ToyTask:
    vocab_size: int
    n_groups: int = 4
    group_size: int = 8
    prompt_len: int = 4
    response_len: int = 8

    def reward(self, response: list[int]) -> float:
        if not response:
            return 0.0
        return sum(1 for t in response if t < self.vocab_size // 2) / len(response)

    @torch.no_grad()
    def rollout(self, model: Any, version: int, seed: int) -> list[TrajectoryRecord]:
        """Sample ``n_groups * group_size`` trajectories from ``model`` (an HF causal LM)."""
        g = torch.Generator().manual_seed(seed)
        prompts = torch.randint(0, self.vocab_size, (self.n_groups, self.prompt_len), generator=g)
        ids = prompts.repeat_interleave(self.group_size, 0)
        out = model(input_ids=ids, use_cache=True)
        past = out.past_key_values
        logits = out.logits[:, -1].float()
        toks, lps = [], []
        for i in range(self.response_len):
            logp = torch.log_softmax(logits, -1)
            nxt = torch.multinomial(logp.exp(), 1, generator=g)
            toks.append(nxt)
            lps.append(logp.gather(-1, nxt))
            if i + 1 < self.response_len:
                out = model(input_ids=nxt, past_key_values=past, use_cache=True)
                past = out.past_key_values
                logits = out.logits[:, -1].float()
        resp = torch.cat(toks, 1).tolist()
        lp = torch.cat(lps, 1).tolist()
        records = []
        for i in range(ids.shape[0]):
            gi = i // self.group_size
            records.append(TrajectoryRecord(
                traj_id=f"toy-{seed}-{i}",
                group_id=f"toy-{seed}-g{gi}",
                segments=(Segment(tuple(prompts[gi].tolist()), False),
                          Segment(tuple(resp[i]), True, tuple(lp[i]), version)),
                reward=self.reward(resp[i]),
            ))
        return records
