"""The tiny environment: say a word from the prompt; learnable by a small model in a few GRPO steps.

For smoke tests and the end-to-end run (``make run --tiny``), where the point is that a reward
*rises*, fast, on a CPU. Each task names ``turns`` target words drawn (seeded) from a short list of
common English words; every turn the user says ``Say the word: <target>`` and the policy's
whole reply (no tool format: ``ToolSet(free_text_tool="answer")``) is scored.

Per-turn score of a reply, with ``w`` = its first word (lower-cased, stripped of punctuation), ``t``
= the target, and LCS = the longest common subsequence of characters::

    s = 1.0                                   if w == t
    s = 0.5 * LCS(w, t) / max(|w|, |t|)       otherwise (0 for an empty reply)

The episode reward is the mean of the per-turn scores (in [0, 1]). Modelling choice: the dense
partial credit (shared letters, penalised by a long first word) gives GRPO a non-zero advantage
even for an untrained random model (the tiny Qwen3), while the exact answer is worth twice any
near miss, so the optimum is exactly the copied word.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from envs.base import EnvError, StepResult, TaskError
from envs.toolcall import ArgSpec, ToolCall, ToolSet, ToolSpec

WORDS = ("apple", "river", "stone", "cloud", "green", "house", "light", "music", "paper", "water",
         "tiger", "bread", "chair", "dream", "earth", "flame", "grass", "heart", "ocean", "plant",
         "smile", "train", "voice", "world", "honey", "lemon", "night", "sugar", "table", "money")

ANSWER = ToolSpec("answer", "your reply text", (ArgSpec("text", "the whole reply", block=True),))
TINY_TOOLS = ToolSet((ANSWER,), free_text_tool="answer")
SYSTEM_PROMPT = "You are a helpful assistant. When asked to say a word, reply with exactly that word."

_WORD_RE = re.compile(r"[A-Za-z0-9]+")


@dataclass(frozen=True, slots=True)
class TinyTask:
    task_id: str
    targets: tuple[str, ...]


def make_tiny_tasks(n: int, seed: int = 0, turns: int = 1) -> tuple[TinyTask, ...]:
    """``n`` tasks of ``turns`` target words each, deterministic in ``(n, seed, turns)``."""
    if n < 1 or turns < 1:
        raise TaskError(f"make_tiny_tasks: n={n} and turns={turns} must both be at least 1")
    rng = random.Random(seed)
    return tuple(TinyTask(f"tiny-{seed}-{i}", tuple(rng.choice(WORDS) for _ in range(turns))) for i in range(n))


def lcs_length(a: str, b: str) -> int:
    """Length of the longest common subsequence of ``a`` and ``b`` (O(|a||b|) dynamic programme)."""
    prev = [0] * (len(b) + 1)
    for ca in a:
        cur = [0]
        for j, cb in enumerate(b):
            cur.append(prev[j] + 1 if ca == cb else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def score(reply: str, target: str) -> float:
    """Per-turn score (formula in the module docstring)."""
    m = _WORD_RE.search(reply)
    if m is None:
        return 0.0
    word = m.group(0).lower()
    if word == target:
        return 1.0
    return 0.5 * lcs_length(word, target) / max(len(word), len(target))


def prompt_for(target: str) -> str:
    return f"Say the word: {target}"


class TinyEnv:
    """One episode of the tiny environment."""

    def __init__(self) -> None:
        self.tools = TINY_TOOLS
        self._task: TinyTask | None = None
        self._scores: list[float] = []

    def system_prompt(self) -> str:
        return SYSTEM_PROMPT

    async def reset(self, task: TinyTask) -> str:
        if not isinstance(task, TinyTask):
            raise TaskError(f"TinyEnv.reset needs a TinyTask, got {type(task).__name__}")
        self._task, self._scores = task, []
        return prompt_for(task.targets[0])

    async def step(self, call: ToolCall) -> StepResult:
        task = self._task
        if task is None:
            raise EnvError("TinyEnv.step called before reset")
        if len(self._scores) >= len(task.targets):
            raise EnvError(f"episode {task.task_id} is already done; reset a new one")
        target = task.targets[len(self._scores)]
        s = score(call.args.get("text", ""), target)
        self._scores.append(s)
        if len(self._scores) < len(task.targets):
            return StepResult(prompt_for(task.targets[len(self._scores)]), info={"turn_score": s})
        reward = sum(self._scores) / len(self._scores)
        return StepResult("", reward=reward, done=True, info={"scores": list(self._scores)})

    async def close(self) -> None:
        self._task = None
