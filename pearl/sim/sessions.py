"""Synthetic SWE-like agent sessions: play a ``TrajectoryPlan`` against the Pipeline Scheduler.

Implements ``pearl.core.session.AgentSession``; ``SyntheticSessionFactory`` is the
``SessionFactory`` a replay hands to the pipeline. Life cycle of one session::

    start()            -> TurnInput(initial prompt: prompt_tokens ids, max_new_tokens = r_1)
    step(response) k   -> sleeps e_k on the clock (tool call / test run), then
                          TurnInput(observation: o_k ids, max_new_tokens = r_{k+1})
                          or, after the last turn, EpisodeEnd(reward, info)

Token ids are synthetic (``TOKEN``, one id repeated): the emulated engine only counts tokens.
A response shorter than planned (the engine stopped early) or longer (never: ``max_new_tokens``
bounds it) does not change the plan; the context the pipeline keeps is what the engine sees.

Reward (a modelling choice; the emulator does not need a meaningful one): 1.0 with probability
``min(1, 0.35 / d)`` for a task of difficulty ``d``, 0.0 for a trajectory cut by the length limit;
drawn from the plan's own seeded stream, so it is deterministic.

Public names: ``SyntheticSession``, ``SyntheticSessionFactory``, ``TOKEN``.
"""

from __future__ import annotations

import random

from pearl.config import WorkloadSpec
from pearl.core.session import EpisodeEnd, SessionSpec, TurnInput
from pearl.runtime.clock import Clock
from pearl.sim.workload import TrajectoryPlan, WorkloadModel

TOKEN = 1


class SyntheticSession:
    def __init__(self, plan: TrajectoryPlan, clock: Clock, difficulty: float, seed: int) -> None:
        self.plan = plan
        self.clock = clock
        self.difficulty = difficulty
        self.seed = seed
        self.turn = 0  # turns whose response has been received
        self.env_s = 0.0

    async def start(self) -> TurnInput:
        self.turn = 0
        return TurnInput((TOKEN,) * self.plan.prompt_tokens, self.plan.turns[0].response_tokens)

    async def step(self, response_ids: tuple[int, ...]) -> TurnInput | EpisodeEnd:
        t = self.plan.turns[self.turn]
        self.turn += 1
        await self.clock.sleep(t.env_s)
        self.env_s += t.env_s
        if self.turn >= len(self.plan.turns):
            rng = random.Random(f"pearl-reward/{self.seed}/{self.plan.traj_id}")
            solved = (not self.plan.truncated) and rng.random() < min(1.0, 0.35 / self.difficulty)
            return EpisodeEnd(1.0 if solved else 0.0, {"turns": self.turn, "truncated": self.plan.truncated,
                                                       "env_s": round(self.env_s, 3)})
        nxt = self.plan.turns[self.turn]
        return TurnInput((TOKEN,) * t.observation_tokens, nxt.response_tokens)


class SyntheticSessionFactory:
    """``SessionFactory`` over a ``WorkloadModel``; also records every plan it handed out."""

    def __init__(self, spec: WorkloadSpec, clock: Clock) -> None:
        self.model = WorkloadModel(spec)
        self.clock = clock
        self.seed = spec.seed
        self.plans: dict[str, TrajectoryPlan] = {}

    def __call__(self, s: SessionSpec) -> SyntheticSession:
        plan = self.model.trajectory(s.batch_index, s.group_index, s.sample_index)
        self.plans[s.traj_id] = plan
        return SyntheticSession(plan, self.clock, self.model.task_difficulty(plan.task_id), self.seed)
