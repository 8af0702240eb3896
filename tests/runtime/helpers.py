"""Shared test fixtures for the runtime: a small deterministic agent session, engine builders, and
the runtime's collaborators built directly (``rig``) for tests that drive one component alone."""

from __future__ import annotations

from dataclasses import InitVar, dataclass, field

from pearl.config import RunConfig, load_config
from pearl.core.profile import HardwareProfile, WorkloadProfile
from pearl.core.session import EpisodeEnd, SessionSpec, TurnInput
from pearl.core.state import ClusterState, Role
from pearl.engines.base import ServerSpec
from pearl.engines.emulated import EmulatedEngine
from pearl.runtime.clock import Clock
from pearl.runtime.executor import PlanExecutor
from pearl.runtime.pipeline import PipelineHooks, PipelineScheduler
from pearl.runtime.router import Router
from pearl.runtime.tracker import RuntimeTracker


def config(name: str = "qwen3-8b-h200", **overrides: object) -> RunConfig:
    return load_config(name, overrides=dict(overrides) if overrides else None)


def engine(clock: Clock, cfg: RunConfig | None = None) -> EmulatedEngine:
    return EmulatedEngine.from_config(cfg or config(), clock, iteration_log=[])


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


@dataclass
class Rig:
    """The runtime's collaborators built directly (no Controller), for driving one component alone:
    the emulated engine, a tracker on the config's profiles, a pipeline (no batch runs unless a test
    starts one), and the executor over ``state``. ``states`` records every state the executor
    publishes; ``weights`` is what ``latest_weights`` returns (a test may change it)."""

    cfg: RunConfig
    clock: Clock
    state: InitVar[ClusterState]
    turns: int = 3
    response: int = 200
    hooks: PipelineHooks | None = None
    weights: tuple[int, str] = (0, "emulated://v0")
    states: list[ClusterState] = field(default_factory=list)
    engine: EmulatedEngine = field(init=False)
    tracker: RuntimeTracker = field(init=False)
    pipeline: PipelineScheduler = field(init=False)
    executor: PlanExecutor = field(init=False)

    def __post_init__(self, state: ClusterState) -> None:
        cfg, clock = self.cfg, self.clock
        self.engine = engine(clock, cfg)
        self.tracker = RuntimeTracker(HardwareProfile.from_specs(cfg.model, cfg.hardware, cfg.cluster.tp_size),
                                      WorkloadProfile.from_spec(cfg.workload), cfg.policy.profile_ema_alpha)

        def factory(spec: SessionSpec) -> ScriptedSession:
            return ScriptedSession(spec, clock, turns=self.turns, response=self.response)

        self.pipeline = PipelineScheduler(
            self.engine, clock, self.tracker, factory, batch_size=cfg.workload.batch_size,
            group_size=cfg.workload.group_size, max_staleness=cfg.policy.max_staleness,
            max_trajectory_tokens=cfg.workload.max_trajectory_tokens, hooks=self.hooks,
            router=Router(cfg.policy.affinity_slack, cost_aware=cfg.policy.affinity == "cost"))
        self.executor = PlanExecutor(state, self.engine, self.pipeline, clock, self.latest_weights,
                                     [self.states.append])

    def latest_weights(self) -> tuple[int, str]:
        return self.weights

    async def serve(self, worker_id: str, gpus: tuple[str, ...], role: Role = Role.COLOCATED) -> None:
        """Launch ``worker_id`` on the engine with the latest weights and admit it to the router."""
        version, path = self.weights
        await self.engine.launch(ServerSpec(worker_id, gpus, role, path, version))
        await self.engine.load_weights(worker_id, path, version)
        self.pipeline.admit(worker_id, role, version)


def rig(clock: Clock, state: ClusterState, cfg: RunConfig | None = None, **kw: object) -> Rig:
    return Rig(cfg or config(**{"workload.batch_size": 4, "workload.group_size": 2}), clock, state,
               **kw)  # type: ignore[arg-type]
