"""Shared test fixtures for the runtime: a small deterministic agent session and engine builders."""

from __future__ import annotations

from dataclasses import dataclass, field

from pearl.config import RunConfig, load_config
from pearl.engines.emulated import EmulatedEngine
from pearl.runtime.agent import EpisodeEnd, SessionSpec, TurnInput
from pearl.runtime.clock import Clock


def config(name: str = "qwen3-8b-h200", **overrides: object) -> RunConfig:
    return load_config(name, overrides=dict(overrides) if overrides else None)


def engine(clock: Clock, cfg: RunConfig | None = None) -> EmulatedEngine:
    return EmulatedEngine.from_config(cfg or config(), clock)


@dataclass
class ScriptedSession:
    """``turns`` turns: a ``prompt``-token first prompt, ``response`` tokens per turn, ``obs`` tokens
    per observation, ``env_s`` seconds per env step (on the clock). Records what it was given."""

    spec: SessionSpec
    clock: Clock
    turns: int = 3
    prompt: int = 2000
    response: int = 200
    obs: int = 300
    env_s: float = 2.0
    seen: list[tuple[int, ...]] = field(default_factory=list)

    def _ids(self, n: int, salt: int) -> tuple[int, ...]:
        base = (sum(map(ord, self.spec.traj_id)) * 31 + salt * 7919) % 40_000 + 1
        return tuple(range(base, base + n))

    async def start(self) -> TurnInput:
        return TurnInput(self._ids(self.prompt, 0), self.response)

    async def step(self, response_ids: tuple[int, ...]) -> TurnInput | EpisodeEnd:
        self.seen.append(response_ids)
        await self.clock.sleep(self.env_s)
        if len(self.seen) >= self.turns:
            return EpisodeEnd(1.0, {"solved": True})
        return TurnInput(self._ids(self.obs, len(self.seen)), self.response)
