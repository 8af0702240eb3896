"""Synthetic SWE-like agent sessions: play a ``TrajectoryPlan`` against the Pipeline Scheduler.

Implements ``pearl.core.session.AgentSession``; ``SyntheticSessionFactory`` is the
``SessionFactory`` a replay hands to the pipeline. Life cycle of one session::

    start()            -> TurnInput(initial prompt: prompt_tokens ids, max_new_tokens = cap)
    step(response) k   -> sleeps e_k on the clock (tool call / test run), then
                          TurnInput(observation: o_k ids, max_new_tokens = cap)
                          or, after the last turn, EpisodeEnd(reward, info)

``cap`` is ``WorkloadSpec.max_response_tokens`` (what a real agent loop sends: a per-turn limit,
which the pipeline cuts to the trajectory's remaining budget) or, where that is None, the planned
response length ``r_k`` itself.

**Token ids carry identity**, so an engine's prefix cache sees what a real one would: the first
``shared_prompt_tokens`` of every initial prompt are the same ids in every task (the agent's
system prompt), the rest are the task's own (the same for the G samples of a GRPO group), and each
observation is its trajectory's and turn's own. Ids are slices of one seeded permutation of
``VOCAB`` ids, at an offset given by ``crc32`` of the part's key: no per-token work.

**The response model** (``remaining``): the emulated engine asks where the policy ends a response
that starts at ``position`` of a conversation (its EOS); the factory answers from the plan it
handed out (turn ``k`` starts at ``c_{k-1}``, ends after ``r_k`` tokens). A response shorter than
planned (the engine stopped early) or longer (never: ``max_new_tokens`` bounds it) does not change
the plan; the context the pipeline keeps is what the engine sees.

Reward (a modelling choice; the emulator does not need a meaningful one): 1.0 with probability
``min(1, 0.35 / d)`` for a task of difficulty ``d``, 0.0 for a trajectory cut by the length limit;
drawn from the plan's own seeded stream, so it is deterministic.

Public names: ``SyntheticSession``, ``SyntheticSessionFactory``, ``token_stream``, ``VOCAB``.
"""

from __future__ import annotations

import bisect
import random
import zlib

from pearl.config import WorkloadSpec
from pearl.core.session import EpisodeEnd, SessionSpec, TurnInput
from pearl.runtime.clock import Clock
from pearl.sim.workload import TrajectoryPlan, WorkloadModel

#: ids the synthetic prompts and observations use (below every real model's vocabulary size)
VOCAB = 32768
_TABLE: tuple[int, ...] = tuple(random.Random("pearl-synthetic-vocabulary").sample(range(VOCAB), VOCAB))


def token_stream(key: str, n: int) -> tuple[int, ...]:
    """``n`` ids of the part named ``key``: the same key, the same ids."""
    a = zlib.crc32(key.encode()) % VOCAB
    out = _TABLE[a:a + n]
    while len(out) < n:
        out += _TABLE[: n - len(out)]
    return out


class SyntheticSession:
    def __init__(self, plan: TrajectoryPlan, clock: Clock, difficulty: float, seed: int, shared_prompt: int,
                 cap: int | None) -> None:
        self.plan = plan
        self.clock = clock
        self.difficulty = difficulty
        self.seed = seed
        self.shared_prompt = shared_prompt
        self.cap = cap
        self.turn = 0  # turns whose response has been received
        self.env_s = 0.0

    def _max_new(self, k: int) -> int:
        return self.cap if self.cap is not None else self.plan.turns[k].response_tokens

    async def start(self) -> TurnInput:
        self.turn = 0
        shared = min(self.shared_prompt, self.plan.prompt_tokens)
        ids = token_stream("system", shared) + token_stream(f"task/{self.seed}/{self.plan.task_id}",
                                                            self.plan.prompt_tokens - shared)
        return TurnInput(ids, self._max_new(0))

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
        obs = token_stream(f"obs/{self.seed}/{self.plan.traj_id}/{self.turn}", t.observation_tokens)
        return TurnInput(obs, self._max_new(self.turn))


class SyntheticSessionFactory:
    """``SessionFactory`` over a ``WorkloadModel``; also records every plan it handed out and
    answers the emulated engine's ``remaining`` (module docstring)."""

    def __init__(self, spec: WorkloadSpec, clock: Clock) -> None:
        self.model = WorkloadModel(spec)
        self.clock = clock
        self.seed = spec.seed
        self.spec = spec
        self.plans: dict[str, TrajectoryPlan] = {}
        self._starts: dict[str, tuple[list[int], list[int]]] = {}  # conversation -> (turn starts, r_k)

    def __call__(self, s: SessionSpec) -> SyntheticSession:
        plan = self.model.trajectory(s.batch_index, s.group_index, s.sample_index)
        self.plans[s.traj_id] = plan
        return SyntheticSession(plan, self.clock, self.model.task_difficulty(plan.task_id), self.seed,
                                self.spec.shared_prompt_tokens, self.spec.max_response_tokens)

    def remaining(self, conversation: str, position: int) -> int | None:
        """Tokens the planned policy still generates from ``position`` (its EOS included) in the
        turn that holds it; None for a conversation this factory did not plan."""
        got = self._starts.get(conversation)
        if got is None:
            plan = self.plans.get(conversation)
            if plan is None:
                return None
            starts, lens, c = [], [], plan.prompt_tokens
            for t in plan.turns:
                starts.append(c)
                lens.append(t.response_tokens)
                c += t.response_tokens + t.observation_tokens
            got = self._starts[conversation] = (starts, lens)
        starts, lens = got
        k = bisect.bisect_right(starts, position) - 1
        if k < 0:
            return None
        return max(lens[k] - (position - starts[k]), 1)

    def forget(self, conversation: str) -> None:
        """Drop a finished conversation's turn table (the plan stays in ``plans``)."""
        self._starts.pop(conversation, None)
