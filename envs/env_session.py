"""``EnvSession``: the agent-session protocol of ``pearl.core.session`` over an ``Env`` and a tokenizer.

The pipeline generates tokens; this adapter does everything else of an episode. Life cycle::

    s = EnvSession(env, task, tokenizer, limits)
    ti = await s.start()       # env.reset -> system + first user message, rendered with the chat
                               # template (generation prompt included) -> TurnInput(all prompt ids)
    ti = await s.step(resp)    # decode resp -> parse the tool call -> env.step -> TurnInput(observation
                               # ids) | EpisodeEnd(reward, info); the env is closed on EpisodeEnd
    await s.aclose()           # idempotent; for a caller that abandons the episode (cancellation)

Token-in, token-out. The context is never re-tokenised: it is exactly the concatenation of every
``TurnInput.prompt_ids`` and every response. The ids appended for an observation are the chat
template's own text between the end of an assistant message and the start of the next assistant
reply (closing of the assistant turn, the user message with the observation, the generation
prompt). They are found by rendering a small conversation ``[system, user, assistant=P, user=obs]``
and taking the text after the unique placeholder ``P``. If the response already ends with the
token that text starts with (``<|im_end|>``: the model stopped on end-of-turn), it is not repeated;
a response cut by its budget gets the full closing.

Limits (all counted in tokens of the context, as the pipeline counts them):

- a turn's budget is ``min(max_new_tokens, max_trajectory_tokens - len(context))``;
- observations longer than ``max_observation_tokens`` are clipped (head and tail kept);
- the episode ends when the next turn would have fewer than ``min_turn_tokens`` to generate, or
  after ``max_turns`` replies. Then, with ``on_limit="submit"`` and a ``submit`` tool, the session
  submits on the agent's behalf and the reward is the grade of the work as it stands; otherwise 0.
  ``info`` says ``truncated: true`` and why; the trainer applies ``train.truncation`` (keep / mask /
  drop) to such trajectories. ``info["turns_cut"]`` counts the replies that used their whole turn
  budget (cut at the turn's token limit, not ended by the model).

A reply that is not a valid tool call costs a turn and gets the parser's error as observation. An
exception from the environment (Docker missing, ...) closes the env and propagates: the pipeline
records the trajectory as failed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from envs.base import Env, EnvError, StepResult
from envs.toolcall import ToolCall, ToolCallError, parse_tool_call
from pearl.core.session import EpisodeEnd, TurnInput

_PLACEHOLDER = "\u2063PEARL-ASSISTANT-PLACEHOLDER\u2063"


class ChatTokenizer(Protocol):
    """What the session needs of a Hugging Face tokenizer."""

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...


@dataclass(frozen=True, slots=True)
class SessionLimits:
    max_trajectory_tokens: int
    max_new_tokens: int = 1024
    max_turns: int = 30
    max_observation_tokens: int = 2048
    min_turn_tokens: int = 16
    on_limit: Literal["submit", "zero"] = "submit"

    def __post_init__(self) -> None:
        if not 1 <= self.min_turn_tokens <= self.max_new_tokens:
            raise ValueError(f"SessionLimits: need 1 <= min_turn_tokens={self.min_turn_tokens} <= "
                             f"max_new_tokens={self.max_new_tokens}")
        if self.max_turns < 1 or self.max_observation_tokens < 16:
            raise ValueError(f"SessionLimits: max_turns={self.max_turns} must be >= 1 and "
                             f"max_observation_tokens={self.max_observation_tokens} >= 16")


class EnvSession:
    """One trajectory's session (see the module docstring)."""

    def __init__(self, env: Env, task: Any, tokenizer: ChatTokenizer, limits: SessionLimits,
                 chat_template_kwargs: Mapping[str, Any] | None = None) -> None:
        self.env = env
        self.task = task
        self.tokenizer = tokenizer
        self.limits = limits
        self.template_kwargs = dict(chat_template_kwargs or {})
        self.messages: list[dict[str, str]] = []
        self.token_ids: list[int] = []
        self.turns = 0
        self.tool_errors = 0
        self.turns_cut = 0  # replies that used their whole turn budget (cut at the turn's token limit)
        self._budget = 0  # the budget offered by the last TurnInput
        self._open = False
        self._ended = False

    # ---------------------------------------------------------------------------- protocol
    async def start(self) -> TurnInput:
        if self._open or self._ended:
            raise EnvError(f"session for {self.task.task_id}: start called twice")
        self._open = True
        try:
            first = await self.env.reset(self.task)
            self.messages = [{"role": "system", "content": self.env.system_prompt()},
                             {"role": "user", "content": first}]
            ids = self._encode(self._render(self.messages, generation_prompt=True))
            budget = self.limits.max_trajectory_tokens - len(ids)
            if budget < self.limits.min_turn_tokens:
                raise EnvError(
                    f"task {self.task.task_id}: the initial prompt has {len(ids)} tokens, leaving {budget} of "
                    f"max_trajectory_tokens={self.limits.max_trajectory_tokens} (need min_turn_tokens="
                    f"{self.limits.min_turn_tokens}): raise the limit or shorten the prompt")
        except BaseException:
            await self.aclose()
            raise
        self.token_ids = list(ids)
        self._budget = min(self.limits.max_new_tokens, budget)
        return TurnInput(tuple(ids), self._budget)

    async def step(self, response_ids: tuple[int, ...]) -> TurnInput | EpisodeEnd:
        if not self._open or self._ended:
            raise EnvError(f"session for {self.task.task_id}: step called {'after the end' if self._ended else 'before start'}")
        try:
            return await self._step(tuple(response_ids))
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        self._ended = True
        if self._open:
            self._open = False
            await self.env.close()

    # ------------------------------------------------------------------------------ internals
    async def _step(self, response_ids: tuple[int, ...]) -> TurnInput | EpisodeEnd:
        self.token_ids.extend(response_ids)
        self.turns += 1
        if len(response_ids) >= self._budget:
            self.turns_cut += 1
        reply = self.tokenizer.decode(list(response_ids), skip_special_tokens=True)
        self.messages.append({"role": "assistant", "content": reply})
        try:
            call = parse_tool_call(reply, self.env.tools)
        except ToolCallError as e:
            self.tool_errors += 1
            result = StepResult(str(e), info={"error": "malformed_tool_call"})
        else:
            result = await self.env.step(call)
        if result.done:
            return await self._end(result.reward, result.info, "done")
        if self.turns >= self.limits.max_turns:
            return await self._limit("max_turns")
        obs_ids, obs_text = self._observation_ids(result.observation, response_ids)
        remaining = self.limits.max_trajectory_tokens - len(self.token_ids) - len(obs_ids)
        if remaining < self.limits.min_turn_tokens:
            return await self._limit("max_trajectory_tokens")
        self.messages.append({"role": "user", "content": obs_text})
        self.token_ids.extend(obs_ids)
        self._budget = min(self.limits.max_new_tokens, remaining)
        return TurnInput(tuple(obs_ids), self._budget)

    async def _limit(self, reason: str) -> EpisodeEnd:
        if self.limits.on_limit == "submit" and self.env.tools.get("submit") is not None:
            result = await self.env.step(ToolCall("submit"))
            return await self._end(result.reward, result.info, reason, truncated=True)
        return await self._end(0.0, {}, reason, truncated=True)

    async def _end(self, reward: float, env_info: Mapping[str, Any], reason: str, truncated: bool = False
                   ) -> EpisodeEnd:
        info: dict[str, object] = dict(env_info)
        info.update({"task_id": self.task.task_id, "turns": self.turns, "tool_errors": self.tool_errors,
                     "turns_cut": self.turns_cut, "truncated": truncated, "end_reason": reason, "context_tokens": len(self.token_ids)})
        await self.aclose()
        return EpisodeEnd(float(reward), info)

    def _render(self, messages: list[dict[str, str]], generation_prompt: bool) -> str:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt,
                                                  **self.template_kwargs)
        if not isinstance(text, str):
            raise EnvError(f"the tokenizer's chat template returned {type(text).__name__}, not text")
        return text

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _suffix_text(self, observation: str) -> str:
        """Template text from the end of an assistant message to the next generation prompt."""
        convo = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                 {"role": "assistant", "content": _PLACEHOLDER}, {"role": "user", "content": observation}]
        text = self._render(convo, generation_prompt=True)
        if text.count(_PLACEHOLDER) != 1:
            raise EnvError("the chat template does not render an assistant message verbatim; "
                           "EnvSession needs a template that does (ChatML, Qwen3, Llama 3 ...)")
        return text[text.index(_PLACEHOLDER) + len(_PLACEHOLDER):]

    def _clip_observation(self, observation: str) -> str:
        """``observation`` cut to about ``max_observation_tokens`` tokens: head 2/3, tail 1/3, and a
        marker saying how many tokens were dropped (re-encoding may shift a boundary by a token)."""
        ids = self._encode(observation)
        cap = self.limits.max_observation_tokens
        if len(ids) <= cap:
            return observation
        marker = f"\n[... {len(ids)} tokens of observation, some omitted ...]\n"
        budget = max(2, cap - len(self._encode(marker)))
        head, tail = (2 * budget) // 3, budget - (2 * budget) // 3
        dec = self.tokenizer.decode
        return dec(ids[:head], skip_special_tokens=False) + marker + dec(ids[len(ids) - tail:], skip_special_tokens=False)

    def _observation_ids(self, observation: str, response_ids: tuple[int, ...]) -> tuple[list[int], str]:
        """Ids to append for ``observation`` (clipped to ``max_observation_tokens``) and the text used."""
        text = self._clip_observation(observation)
        ids = self._encode(self._suffix_text(text))
        if response_ids and ids and response_ids[-1] == ids[0]:
            ids = ids[1:]  # the model already closed its turn with that token
        return ids, text
