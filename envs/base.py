"""The environment contract: one async ``Env`` protocol that every PEARL environment implements.

An environment turns *tool calls* (parsed from the policy's reply, see ``envs.toolcall``) into
*observations* (text shown to the policy as the next user message) and, at the end, a reward.

Life cycle of one episode (one trajectory owns one ``Env`` instance; GRPO samples of the same
task each get their own instance, so their checkouts / containers never share state)::

    env = make_env()                       # cheap: no I/O
    first = await env.reset(task)          # prepare the sandbox; returns the first user message
    while True:
        res = await env.step(call)         # one ToolCall -> StepResult(observation, reward, done, info)
        if res.done: break                 # reward is final when done (0.0 on earlier steps)
    await env.close()                      # always (also after an error or cancellation); idempotent

``system_prompt()`` (sync, no I/O) is the system message of the conversation: the role, the rules
and the tool documentation rendered from ``env.tools`` (``ToolSet.describe``).

Errors: a *malformed or refused action* (bad path, unknown tool, missing argument, timeout of a
command) is never an exception: it comes back as an observation that says what was wrong and how
to fix it, and the episode goes on. Exceptions are reserved for the environment itself failing
(``EnvUnavailableError``: Docker or an image missing; ``TaskError``: a task/dataset row is bad;
``EnvError``: anything else the caller must handle, e.g. ``step`` before ``reset``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

from envs.toolcall import ToolCall, ToolSet


class EnvError(RuntimeError):
    """The environment failed (not the agent). The message names what failed and what to do."""


class EnvUnavailableError(EnvError):
    """A dependency of the environment is missing (Docker engine, an image, a dataset file)."""


class TaskError(EnvError):
    """A task or dataset row is malformed; the message names the row / instance and the field."""


def _frozen(d: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(d or {}))


@dataclass(frozen=True, slots=True)
class StepResult:
    """What one ``Env.step`` returns.

    ``observation``: text for the next user message (empty when ``done`` and nothing to say).
    ``reward``: the episode reward when ``done``; 0.0 on intermediate steps (PEARL's GRPO uses
    one scalar reward per trajectory). ``info``: JSON-serialisable facts for logs (test counts,
    timeouts, the tool name...).
    """

    observation: str
    reward: float = 0.0
    done: bool = False
    info: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        object.__setattr__(self, "info", _frozen(self.info))
        if not self.done and self.reward != 0.0:
            raise ValueError(f"StepResult: reward={self.reward} on a step that is not done (rewards are final)")


@runtime_checkable
class Task(Protocol):
    """A task handed to ``Env.reset``: each environment defines its own frozen task type."""

    @property
    def task_id(self) -> str: ...


@runtime_checkable
class Env(Protocol):
    """One episode's environment (see the module docstring for the life cycle)."""

    tools: ToolSet

    def system_prompt(self) -> str:
        """The system message: role, rules and tool documentation (no I/O)."""
        ...

    async def reset(self, task: Any) -> str:
        """Prepare a fresh sandbox for ``task``; returns the first user message."""
        ...

    async def step(self, call: ToolCall) -> StepResult:
        """Execute one tool call (already parsed and validated against ``tools``)."""
        ...

    async def close(self) -> None:
        """Release everything ``reset`` created; idempotent, safe after any error."""
        ...


def clip_text(text: str, max_chars: int, what: str = "output") -> str:
    """Keep the head and tail of ``text`` within ``max_chars``, saying how much was cut.

    Head and tail (2/3 and 1/3 of the budget) because both matter for tool output: a command's
    first lines and its final error/summary lines.
    """
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    head = (2 * max_chars) // 3
    tail = max_chars - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n[... {cut} characters of {what} omitted ...]\n{text[len(text) - tail:]}"
