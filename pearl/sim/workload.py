"""Synthetic SWE-bench-like agentic workload: what each trajectory of a rollout batch will do.

Role: a pure, seeded generator of ``TrajectoryPlan`` s (``WorkloadModel``). The agent sessions that
play a plan against the runtime (prompt -> response -> env step sleeping on the clock -> next
prompt) live in ``pearl/sim/sessions.py``; nothing here waits or reads a clock.

Public names: ``TurnPlan``, ``TrajectoryPlan``, ``WorkloadModel``, ``sample``.

The model (every distribution is a ``config.Distribution``: lognormal with ``mean`` and
coefficient of variation ``cv``, clipped to ``[min, max]``; defaults in ``WorkloadSpec``)::

    task difficulty   d ~ LogNormal(mean 1, cv = task_difficulty_cv), shared by a GRPO group
                      (the G samples of one task: harder tasks take more turns and longer tests)
    turns             T ~ turns * d               (rounded, clipped to [turns.min, turns.max])
    initial prompt    c_0 = system_prompt_tokens  (system prompt + issue statement)
    turn k = 1..T     r_k ~ response_tokens       (the policy's reasoning + tool call)
                      e_k ~ env_step_s            (tool call: ls, grep, edit, ...), or with
                            probability test_run_prob e_k ~ test_run_s * d (a test run)
                      o_k ~ observation_tokens    (tool output appended to the context)
                      c_k = c_{k-1} + r_k + o_k   (context grows every turn)
    last turn         the agent submits: e_T ~ test_run_s * d (reward evaluation), o_T = 0

Trajectory length limit L = ``max_trajectory_tokens``: a response is cut to ``L - c`` tokens
(``max_new_tokens`` of that request) and an observation to what still fits; the episode ends
as soon as the context reaches ``L - MIN_RESPONSE`` (no room for another useful response).

Determinism: a plan depends only on (``seed``, batch index, group index, sample index) through
``random.Random`` seeded with a string (SHA-512 based, stable across processes and platforms).
Task ids are ``batch * groups_per_batch + group``: every batch draws fresh tasks.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from pearl.config import Distribution, WorkloadSpec

#: Below this many free tokens the agent cannot emit a useful action: the episode ends.
MIN_RESPONSE = 16


def sample(rng: random.Random, d: Distribution, scale: float = 1.0) -> float:
    """One draw of ``d`` with its mean multiplied by ``scale``.

    Lognormal with mean m and cv c: sigma^2 = ln(1 + c^2), mu = ln(m) - sigma^2 / 2, so that
    E[X] = m and sd[X] / E[X] = c. Clipped to [min, max] (clipping moves the mean slightly).
    """
    m = d.mean * scale
    if d.cv == 0:
        x = m
    else:
        s2 = math.log1p(d.cv * d.cv)
        x = rng.lognormvariate(math.log(m) - s2 / 2, math.sqrt(s2))
    return min(max(x, d.min), d.max)


@dataclass(frozen=True, slots=True)
class TurnPlan:
    """One turn: generate ``response_tokens``, then an env step of ``env_s`` seconds that appends
    ``observation_tokens`` (0 on the last turn)."""

    response_tokens: int
    env_s: float
    observation_tokens: int
    is_test: bool


@dataclass(frozen=True, slots=True)
class TrajectoryPlan:
    traj_id: str
    group_id: str
    task_id: int
    prompt_tokens: int
    turns: tuple[TurnPlan, ...]
    limit: int
    truncated: bool  # the length limit ended the episode before the agent submitted

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + sum(t.response_tokens + t.observation_tokens for t in self.turns)

    @property
    def response_tokens(self) -> int:
        return sum(t.response_tokens for t in self.turns)

    @property
    def env_s(self) -> float:
        return sum(t.env_s for t in self.turns)


class WorkloadModel:
    """Seeded generator of rollout batches (``batch(i)``) and GRPO groups (``group(i, g)``)."""

    def __init__(self, spec: WorkloadSpec) -> None:
        self.spec = spec
        self.groups_per_batch = spec.batch_size // spec.group_size

    def task_difficulty(self, task_id: int) -> float:
        cv = self.spec.task_difficulty_cv
        if cv == 0:
            return 1.0
        rng = random.Random(f"pearl-task/{self.spec.seed}/{task_id}")
        return sample(rng, Distribution(mean=1.0, cv=cv, min=0.25, max=4.0))

    def trajectory(self, batch_index: int, group_index: int, sample_index: int) -> TrajectoryPlan:
        s = self.spec
        task_id = batch_index * self.groups_per_batch + group_index
        d = self.task_difficulty(task_id)
        rng = random.Random(f"pearl-traj/{s.seed}/{batch_index}/{group_index}/{sample_index}")
        n_turns = max(1, round(sample(rng, s.turns, d)))  # sample() clips to [turns.min, turns.max]
        limit = s.max_trajectory_tokens
        c = s.system_prompt_tokens
        turns: list[TurnPlan] = []
        truncated = False
        for k in range(1, n_turns + 1):
            room = limit - c
            if room < MIN_RESPONSE:
                truncated = True
                break
            r = min(max(1, round(sample(rng, s.response_tokens))), room)
            c += r
            last = k == n_turns or limit - c < MIN_RESPONSE
            test = last or rng.random() < s.test_run_prob
            env = sample(rng, s.test_run_s, d) if test else sample(rng, s.env_step_s)
            o = 0
            if not last:
                o = min(round(sample(rng, s.observation_tokens)), limit - c)
                c += o
                if limit - c < MIN_RESPONSE:
                    # the observation filled the window: the next turn cannot happen
                    truncated = True
                    turns.append(TurnPlan(r, env, o, test))
                    break
            elif k < n_turns:
                truncated = True
            turns.append(TurnPlan(r, env, o, test))
        return TrajectoryPlan(
            traj_id=f"b{batch_index}-g{group_index}-s{sample_index}",
            group_id=f"b{batch_index}-g{group_index}",
            task_id=task_id,
            prompt_tokens=s.system_prompt_tokens,
            turns=tuple(turns),
            limit=limit,
            truncated=truncated,
        )

    def group(self, batch_index: int, group_index: int) -> tuple[TrajectoryPlan, ...]:
        return tuple(self.trajectory(batch_index, group_index, j) for j in range(self.spec.group_size))

    def batch(self, batch_index: int) -> tuple[TrajectoryPlan, ...]:
        return tuple(p for g in range(self.groups_per_batch) for p in self.group(batch_index, g))
