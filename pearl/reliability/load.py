"""Load test: one rollout batch of 10,000 concurrent trajectories through the real controller.

``run_load(n)`` runs the real ``Controller`` (pipeline, router, tracker, elastic scheduler) on
the paper's Qwen3-8B config (its 4 reserved H200 GPUs serve; no trainer runs, so no GPU is
lent and no preemptible GPU is granted) with one rollout batch of ``n`` trajectories (all admitted at once: ``n`` concurrent agentic
sessions), in virtual time, twice:

* ``engine="emulated"`` - the calibrated emulator serves every request (its continuous-batching
  simulation costs CPU too);
* ``engine="instant"`` - ``InstantEngine`` answers every request at once with its full token
  budget, so the CPU measured is the control plane's own (pipeline, routing, telemetry, sessions,
  asyncio) - the figure this measures: control-plane CPU time per request.

Reported per variant: requests served, peak trajectories in flight, process CPU seconds, CPU
microseconds per request, wall seconds, virtual makespan. ``benchmarks/bench_load.py`` prints
both side by side with their ratio; ``pearl reliability`` puts them in ``docs/RELIABILITY.md``.

Workload shortening (a modelling choice for run time, written down): episodes of 3 turns on
average (the SWE default is 24) so that 10,000 trajectories are ~30,000 requests.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from pearl.config import RunConfig, load_config
from pearl.core.state import Role
from pearl.engines.base import (
    EngineCapabilities,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    PauseMode,
    ServerSpec,
)
from pearl.runtime.clock import LoopClock, run_virtual


class InstantEngine:
    """An ``InferenceEngine`` with no cost at all: every request returns its whole budget at once
    (token ids 1, logprob 0). Only for measuring the control plane's own CPU."""

    capabilities = EngineCapabilities(in_place_role_switch=True)

    def __init__(self) -> None:
        self.requests = 0
        self._roles: dict[str, Role] = {}
        self._version: dict[str, int] = {}

    async def launch(self, spec: ServerSpec) -> None:
        self._roles[spec.worker_id] = spec.role
        self._version[spec.worker_id] = spec.weight_version

    async def stop(self, worker_id: str) -> None:
        self._roles.pop(worker_id, None)

    async def healthy(self, worker_id: str) -> bool:
        return worker_id in self._roles

    def _result(self, worker_id: str, req: GenerateRequest, decode: str = "") -> GenerateResult:
        self.requests += 1
        n = req.sampling.max_new_tokens
        return GenerateResult(req.rid, (1,) * n, (0.0,) * n, FinishReason.LENGTH, self._version.get(worker_id, 0),
                              len(req.input_ids), worker_id=worker_id, decode_worker_id=decode)

    async def generate(self, worker_id: str, req: GenerateRequest) -> GenerateResult:
        await asyncio.sleep(0)
        return self._result(worker_id, req)

    async def generate_pd(self, prefill_id: str, decode_id: str, req: GenerateRequest) -> GenerateResult:
        await asyncio.sleep(0)
        return self._result(prefill_id, req, decode_id)

    async def abort(self, worker_id: str, rid: str | None = None) -> None:
        return None

    async def pause(self, worker_id: str, mode: PauseMode = PauseMode.KEEP) -> None:
        self.capabilities.check_pause(worker_id, mode)

    async def resume(self, worker_id: str) -> None:
        return None

    async def load_weights(self, worker_id: str, path: str, version: int) -> None:
        self._version[worker_id] = version

    async def weight_version(self, worker_id: str) -> int:
        return self._version.get(worker_id, 0)

    async def release_memory(self, worker_id: str) -> None:
        return None

    async def resume_memory(self, worker_id: str) -> None:
        return None

    async def set_role(self, worker_id: str, role: Role) -> None:
        self._roles[worker_id] = role

    async def close(self) -> None:
        self._roles.clear()


def load_config_for(n: int, base: str = "qwen3-8b-h200") -> RunConfig:
    cfg = load_config(base)
    d = cfg.model_dump()
    d["workload"].update(batch_size=n, group_size=8, max_trajectory_tokens=16384,
                         turns={"mean": 3, "cv": 0.5, "min": 1, "max": 6},
                         response_tokens={"mean": 200, "cv": 0.8, "min": 8, "max": 1024})
    d["policy"].update(max_staleness=0)
    return RunConfig.model_validate(d)


class _CountingEngine:
    """Delegates to ``inner`` (the emulator) and counts the ``generate`` / ``generate_pd`` calls."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.requests = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def generate(self, worker_id: str, req: GenerateRequest) -> GenerateResult:
        self.requests += 1
        return await self.inner.generate(worker_id, req)  # type: ignore[no-any-return]

    async def generate_pd(self, prefill_id: str, decode_id: str, req: GenerateRequest) -> GenerateResult:
        self.requests += 1
        return await self.inner.generate_pd(prefill_id, decode_id, req)  # type: ignore[no-any-return]


@dataclass
class LoadResult:
    engine: str
    trajectories: int
    requests: int
    peak_in_flight: int
    cpu_s: float
    wall_s: float
    virtual_s: float
    completed: int

    @property
    def cpu_us_per_request(self) -> float:
        return 1e6 * self.cpu_s / max(1, self.requests)

    def to_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "trajectories": self.trajectories, "completed": self.completed,
                "requests": self.requests, "peak_in_flight": self.peak_in_flight, "cpu_s": round(self.cpu_s, 2),
                "cpu_us_per_request": round(self.cpu_us_per_request, 1), "wall_s": round(self.wall_s, 2),
                "virtual_makespan_s": round(self.virtual_s, 1)}


async def _run(cfg: RunConfig, engine_kind: str) -> dict[str, Any]:
    from pearl.engines.emulated import EmulatedEngine
    from pearl.runtime.controller import Controller
    from pearl.sim.sessions import SyntheticSessionFactory

    clock = LoopClock()
    engine: Any = (_CountingEngine(EmulatedEngine.from_config(cfg, clock, iteration_log=[]))
                   if engine_kind == "emulated" else InstantEngine())
    ctrl = Controller(cfg, engine, SyntheticSessionFactory(cfg.workload, clock), clock=clock, max_batches=1)
    await ctrl.start()
    t0 = clock.now()
    peak = 0

    async def sample() -> None:
        nonlocal peak
        while True:
            peak = max(peak, ctrl.pipeline.stats.trajectories_in_flight)
            await clock.sleep(1.0)

    sampler = asyncio.get_running_loop().create_task(sample(), name="load-sampler")
    try:
        await ctrl.wait_batches(1)
    finally:
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)
        done = ctrl.pipeline.stats.trajectories_completed
        await ctrl.stop()
    return {"requests": engine.requests, "peak": peak, "virtual_s": clock.now() - t0, "completed": done}


def run_load(n: int = 10_000, engine: str = "instant") -> LoadResult:
    cfg = load_config_for(n)
    c0, w0 = time.process_time(), time.perf_counter()
    out = run_virtual(_run(cfg, engine), idle_timeout_s=120.0)
    return LoadResult(engine, n, out["requests"], out["peak"], time.process_time() - c0, time.perf_counter() - w0,
                      out["virtual_s"], out["completed"])
