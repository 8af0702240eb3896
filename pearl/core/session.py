"""The agent-session contract: how the Pipeline Scheduler plays one multi-turn trajectory.

The pipeline owns generation; a session owns everything else about an episode (the environment,
the tokenizer or the synthetic workload). Token-in, token-out: a session never re-tokenizes the
policy's output, so logprobs stay aligned with trained tokens.

Life cycle of one session (created by a ``SessionFactory`` for one trajectory)::

    first = await session.start()            -> TurnInput(prompt_ids, max_new_tokens)
    loop:
        response_ids = <pipeline generates max_new_tokens at most on the context so far>
        nxt = await session.step(response_ids)  (runs the tool call / tests: takes env time)
        nxt is TurnInput  -> append nxt.prompt_ids (the observation) and generate again
        nxt is EpisodeEnd -> the trajectory is complete with nxt.reward

``TurnInput.prompt_ids`` are the tokens *appended* to the conversation before the next
generation: on the first turn the whole initial prompt (system prompt + task), afterwards the
observation (tool output wrapped in the chat template's delimiters). The pipeline keeps the full
context (initial prompt + every response + every observation) and sends it to the engine; the
trajectory records prompt/observation segments untrained and responses trained.

A session may raise any exception from ``start``/``step``: the trajectory is then recorded as
``failed`` (with the error text in ``info``) and the batch goes on without it. Sessions read time
only through the clock they were given by their factory.

Implementations: ``pearl.sim.sessions`` (synthetic SWE-like sessions for the emulator) and
``envs`` (real environments + tokenizer).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class TurnInput:
    """Tokens to append to the context, and this turn's generation budget (>= 1)."""

    prompt_ids: tuple[int, ...]
    max_new_tokens: int


@dataclass(frozen=True, slots=True)
class EpisodeEnd:
    """The episode is over: the trajectory's reward and free-form info (e.g. tests passed)."""

    reward: float
    info: Mapping[str, object] = field(default_factory=dict)


@runtime_checkable
class AgentSession(Protocol):
    async def start(self) -> TurnInput: ...

    async def step(self, response_ids: tuple[int, ...]) -> TurnInput | EpisodeEnd: ...


@dataclass(frozen=True, slots=True)
class SessionSpec:
    """Which trajectory a session plays: ids and its place in the rollout batch.

    ``batch_index`` is the rollout step (0-based); ``group_index`` the GRPO group (task) within the
    batch; ``sample_index`` the sample within the group. ``traj_id`` contains no ``/``.
    """

    traj_id: str
    group_id: str
    batch_index: int
    group_index: int
    sample_index: int


#: Builds the session for one trajectory.
SessionFactory = Callable[[SessionSpec], AgentSession]
