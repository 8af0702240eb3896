"""Chaos runs: random faults at every phase, through the real runtime, in virtual time.

``run_chaos(seed, events)`` builds the same system the trace replayer builds (the real
``Controller`` on the emulated engine, synthetic SWE-like sessions, the emulated trainer), wraps
the engine in ``ChaosEngine`` and then, at exponentially spaced virtual times, injects ``events``
faults drawn uniformly from ``FAULT_KINDS``. After every fault (and every few virtual seconds)
``InvariantChecker.check`` runs; every batch the trainer takes and every ``TrainingStarted``
acknowledgement is checked too. A *quiet phase* follows (no faults, fresh GPUs granted): the
pipeline must complete ``quiet_batches`` more batches, so a stuck or lost trajectory shows.

Phase targeting. A reclaim "while a request is queued / prefilling / transferring KV / decoding"
looks at the emulated engine's in-flight requests (``request_stages``) for one in that stage on a
preemptible worker and reclaims that worker's GPUs (deadline ``now + U(0, 20) s``); "in an env
step" picks a trajectory whose last request finished and whose next has not started. Reclaims
"during a weight sync / an expansion's initialization / a borrow / a return" arm a hook on the
engine call that starts that phase (``load_weights`` in place / ``launch`` / ``resume_memory`` /
``release_memory``) and submit the notice from inside it. A phase that does not occur within
``phase_wait_s`` is counted under ``faults_not_reached`` (never silently dropped).

Background events (not faults): fresh preemptible GPUs are granted after reclaims so that the
pool does not drain; the trainer runs with a short step time so borrowing and returns happen.

JSON (``ChaosResult.to_dict``): ``faults`` (count per kind, injected), ``faults_not_reached``,
``invariant_violations`` (count, by invariant, first few described), ``trajectories_completed``,
``trajectories_trained``, ``max_return_delay_s`` (worst time from ``TrainingStarted`` to its
acknowledgement: every borrowed GPU back), ``checks``, ``virtual_s``, ``wall_s``.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from pearl.config import RunConfig, load_config
from pearl.core.events import ElasticEvent, GpusGranted, GrantedGpu, NoticeCancelled, ReclaimNotice, TrainingStarted
from pearl.core.state import WorkerStatus, Zone
from pearl.engines.emulated import EmulatedEngine
from pearl.reliability.faults import Armed, ChaosEngine, finished_normally
from pearl.reliability.invariants import InvariantChecker
from pearl.runtime.clock import LoopClock, run_virtual
from pearl.runtime.control import UnknownResourceError

#: Every fault kind the runner draws from (uniformly).
FAULT_KINDS: tuple[str, ...] = (
    "reclaim_queued", "reclaim_prefill", "reclaim_kv_transfer", "reclaim_decode", "reclaim_env_step",
    "reclaim_weight_sync", "reclaim_expansion_init", "reclaim_borrow", "reclaim_return",
    "launch_failure", "engine_crash", "kv_transfer_failure", "weight_load_failure", "slow_drain",
    "admin_storm", "admin_duplicates",
)
_STAGE = {"reclaim_queued": ("waiting", "kv_wait"), "reclaim_prefill": ("prefill",),
          "reclaim_kv_transfer": ("transfer",), "reclaim_decode": ("decode",)}
_HOOK = {"reclaim_weight_sync": "load_weights", "reclaim_expansion_init": "launch",
         "reclaim_borrow": "resume_memory", "reclaim_return": "release_memory"}


def chaos_config(base: str | RunConfig = "qwen3-8b-h200", seed: int = 0) -> RunConfig:
    """A small cluster (2 reserved, up to 6 preemptible, 4 training GPUs), short agentic episodes
    and short training steps, so that every phase recurs often within a few virtual hours. The
    cost gates are off: every expansion and every borrow that can happen does (more phases to hit;
    the gates' own decisions are tested in ``tests/core/test_gate.py``)."""
    cfg = load_config(base) if isinstance(base, str) else base
    d = cfg.model_dump()
    d["cluster"].update(reserved_gpus=2, max_preemptible_gpus=6, training_gpus=4, gpus_per_node=8)
    d["workload"].update(batch_size=16, group_size=4, max_trajectory_tokens=16384, seed=seed,
                         turns={"mean": 4, "cv": 0.5, "min": 2, "max": 8},
                         response_tokens={"mean": 300, "cv": 0.8, "min": 8, "max": 2048},
                         env_step_s={"mean": 3.0, "cv": 1.0, "min": 0.2, "max": 30.0})
    d["train"].update(step_time_s=40.0)
    d["policy"].update(gate_enabled=False)  # every expansion and borrow that can happen does
    d["emulator"].update(seed=seed)
    return RunConfig.model_validate(d)


@dataclass
class ChaosResult:
    seed: int
    faults: dict[str, int] = field(default_factory=dict)
    not_reached: dict[str, int] = field(default_factory=dict)
    violations: dict[str, Any] = field(default_factory=dict)
    trajectories_completed: int = 0
    trajectories_trained: int = 0
    max_return_delay_s: float = 0.0
    return_delays: list[float] = field(default_factory=list)
    checks: int = 0
    virtual_s: float = 0.0
    wall_s: float = 0.0
    admin_events: int = 0
    runtime_failures: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed, "faults": dict(sorted(self.faults.items())),
            "faults_total": sum(self.faults.values()),
            "faults_not_reached": dict(sorted(self.not_reached.items())),
            "invariant_violations": self.violations.get("count", 0),
            "violations": self.violations,
            "trajectories_completed": self.trajectories_completed,
            "trajectories_trained": self.trajectories_trained,
            "max_return_delay_s": round(self.max_return_delay_s, 3),
            "returns": len(self.return_delays),
            "checks": self.checks, "admin_events": self.admin_events,
            "runtime_failures_logged": self.runtime_failures,
            "virtual_s": round(self.virtual_s, 1), "wall_s": round(self.wall_s, 2),
        }


class _Driver:
    """Owns the chaos tasks of one run; every task it starts is awaited in ``close``."""

    def __init__(self, cfg: RunConfig, seed: int, phase_wait_s: float) -> None:
        from pearl.runtime.controller import Controller
        from pearl.sim.sessions import SyntheticSessionFactory

        self.cfg = cfg
        self.rng = random.Random(f"pearl-chaos/{seed}")
        self.clock = LoopClock()
        self.inner = EmulatedEngine.from_config(cfg, self.clock)
        #: the engine-side faults to inject, armed as the run goes (the engine counts what it injected)
        self.faults = Armed()
        self.engine = ChaosEngine(self.inner, self.faults, self._on_call)
        # every record the predictor will fit on passes the checker first
        self.ctrl = Controller(cfg, self.engine, SyntheticSessionFactory(cfg.workload, self.clock), clock=self.clock,
                               telemetry_listeners=(lambda rec: self.checker.telemetry(rec),))
        self.checker = InvariantChecker(self.ctrl, self.engine, cfg.workload.batch_size, self.inner.token_at)
        self.phase_wait_s = phase_wait_s
        self.result = ChaosResult(seed)
        self.tasks: list[asyncio.Task[Any]] = []
        self.next_gpu = 0
        self.seq = 0
        self.hook: tuple[str, asyncio.Future[str]] | None = None
        self.armed: dict[str, int] = {}  # engine-side faults armed (injected counts come from the engine)

    # ------------------------------------------------------------------ helpers
    def _eid(self, kind: str) -> str:
        self.seq += 1
        return f"chaos-{kind}-{self.seq}"

    def _arm(self, kind: str) -> None:
        self.armed[kind] = self.armed.get(kind, 0) + 1

    def _count(self, kind: str, reached: bool = True) -> None:
        d = self.result.faults if reached else self.result.not_reached
        d[kind] = d.get(kind, 0) + 1

    def _spawn(self, coro: Awaitable[Any], name: str) -> None:
        self.tasks.append(asyncio.get_running_loop().create_task(coro, name=name))  # type: ignore[arg-type]

    def _preemptible_workers(self, serving: bool = True) -> list[str]:
        st = self.ctrl.executor.state
        return sorted(w.worker_id for w in st.workers.values() if st.zone_of(w) is Zone.PREEMPTIBLE
                      and (not serving or w.status is WorkerStatus.ACTIVE))

    async def submit(self, ev: ElasticEvent) -> bool:
        """Submit an admin event; documented errors (unknown GPU, invalid) are fine, others are
        violations."""
        self.result.admin_events += 1
        try:
            res = await self.ctrl.submit(ev)
        except (UnknownResourceError, ValueError):
            return False
        except Exception as e:
            self.checker.violation("unexpected_error", f"submit {type(ev).__name__}: {type(e).__name__}: {e}")
            return False
        return res.applied

    async def reclaim_gpus(self, gpus: tuple[str, ...], within: float = 20.0) -> bool:
        now = self.clock.now()
        return await self.submit(ReclaimNotice(gpus, deadline=now + self.rng.uniform(0.0, within),
                                               event_id=self._eid("reclaim")))

    async def reclaim_worker(self, wid: str) -> bool:
        st = self.ctrl.executor.state
        w = st.workers.get(wid)
        if w is None or st.zone_of(w) is not Zone.PREEMPTIBLE:
            return False
        return await self.reclaim_gpus(w.gpus)

    async def grant(self, n: int) -> None:
        st = self.ctrl.executor.state
        have = sum(1 for g in st.gpus.values() if g.zone is Zone.PREEMPTIBLE)
        n = min(n, self.cfg.cluster.max_preemptible_gpus - have)
        if n <= 0:
            return
        gpus = []
        for _ in range(n):
            k = self.next_gpu
            self.next_gpu += 1
            gpus.append(GrantedGpu(f"spot-{k}", node=f"spot-node-{k}", instance_id=f"i-{k}"))
        await self.submit(GpusGranted(tuple(gpus), event_id=self._eid("grant")))

    # ------------------------------------------------------------------ phase hooks
    def _on_call(self, kind: str, worker_id: str) -> None:
        if self.hook is None:
            return
        want, fut = self.hook
        if kind != want or fut.done():
            return
        if kind == "load_weights" and worker_id in self.engine.fresh:
            return  # an expansion's finalization, not an in-place weight sync
        if kind == "launch":
            devs = self.engine.devices.get(worker_id, ())
            st = self.ctrl.executor.state
            if not devs or any(d not in st.gpus or st.gpus[d].zone is not Zone.PREEMPTIBLE for d in devs):
                return
            fut.set_result(worker_id)
            self._spawn(self.reclaim_gpus(tuple(devs), within=5.0), "chaos-reclaim-launch")
            return
        target = worker_id if worker_id in self._preemptible_workers() else None
        cands = self._preemptible_workers()
        if target is None and not cands:
            return
        fut.set_result(worker_id)
        self._spawn(self.reclaim_worker(target or self.rng.choice(cands)), f"chaos-reclaim-{kind}")

    async def _wait_hook(self, kind: str, call: str) -> bool:
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.hook = (call, fut)
        try:
            return await self.clock.wait(fut, self.clock.now() + self.phase_wait_s)
        finally:
            self.hook = None

    async def _find_stage(self, stages: tuple[str, ...]) -> str | None:
        deadline = self.clock.now() + self.phase_wait_s
        pre = set()
        while self.clock.now() < deadline:
            pre = set(self._preemptible_workers())
            hits = sorted({ws[-1] for _rid, (stage, ws) in self.inner.request_stages().items()
                           if stage in stages and ws and ws[-1] in pre})
            if hits:
                return self.rng.choice(hits)
            await self.clock.sleep(0.25)
        return None

    async def _find_env_step(self) -> str | None:
        deadline = self.clock.now() + self.phase_wait_s
        while self.clock.now() < deadline:
            pre = set(self._preemptible_workers())
            busy = self.inner.conversations_in_flight()
            cands = []
            for (traj, _turn), atts in self.engine.attempts.items():
                if traj in busy or traj in self.checker.delivered or not atts:
                    continue
                if finished_normally(atts[-1]) and atts[-1].worker in pre:
                    cands.append(atts[-1].worker)
            if cands:
                return self.rng.choice(sorted(set(cands)))
            await self.clock.sleep(0.25)
        return None

    # ------------------------------------------------------------------ one fault
    async def inject(self, kind: str) -> None:
        if kind in _STAGE:
            wid = await self._find_stage(_STAGE[kind])
            self._count(kind, wid is not None and await self.reclaim_worker(wid))
        elif kind == "reclaim_env_step":
            wid = await self._find_env_step()
            self._count(kind, wid is not None and await self.reclaim_worker(wid))
        elif kind in _HOOK:
            if kind == "reclaim_expansion_init":
                self._spawn(self._make_room_and_grant(), "chaos-grant")
            self._count(kind, await self._wait_hook(kind, _HOOK[kind]))
        elif kind == "launch_failure":
            self.faults.launch_failure += 1
            self._spawn(self.grant(2), "chaos-grant")
            self._arm(kind)
        elif kind == "engine_crash":
            st = self.ctrl.executor.state
            serving = sorted(w for w in self.ctrl.pipeline.router.workers if w in st.workers)
            if not serving:
                self._count(kind, False)
                return
            await self.engine.crash(self.rng.choice(serving))
            self._count(kind)
        elif kind == "kv_transfer_failure":
            self.faults.kv_transfer += 1
            self._arm(kind)
        elif kind == "weight_load_failure":
            self.faults.weight_load += 1
            self._arm(kind)
        elif kind == "slow_drain":
            self.faults.slow_drain.append(self.rng.uniform(5.0, 30.0))
            self._arm(kind)
        elif kind == "admin_storm":
            await self._storm()
            self._count(kind)
        elif kind == "admin_duplicates":
            await self._duplicates()
            self._count(kind)

    async def _make_room_and_grant(self) -> None:
        """Grant 2 GPUs (an expansion follows); if the pool is full, reclaim one GPU first."""
        st = self.ctrl.executor.state
        have = sum(1 for g in st.gpus.values() if g.zone is Zone.PREEMPTIBLE)
        if have >= self.cfg.cluster.max_preemptible_gpus:
            gpus = sorted(g for g, gpu in st.gpus.items() if gpu.zone is Zone.PREEMPTIBLE)
            await self.reclaim_gpus((self.rng.choice(gpus),), within=0.0)
            await self.clock.sleep(10.0)
        await self.grant(2)

    async def _storm(self) -> None:
        """A burst of admin events at one instant: grants, notices and their cancellations, notices
        for unknown GPUs, and invalid events."""
        for _ in range(self.rng.randint(5, 20)):
            r = self.rng.random()
            if r < 0.3:
                await self.grant(1)
            elif r < 0.6:
                wids = self._preemptible_workers()
                if wids:
                    w = self.ctrl.executor.state.workers[self.rng.choice(wids)]
                    nid = self._eid("notice")
                    await self.submit(ReclaimNotice(w.gpus, deadline=self.clock.now() + 60.0, notice_id=nid,
                                                    event_id=nid))
                    await self.submit(NoticeCancelled(nid, event_id=self._eid("cancel")))
            elif r < 0.8:
                await self.submit(ReclaimNotice((f"no-such-gpu-{self.seq}",), deadline=self.clock.now() + 1.0,
                                                event_id=self._eid("bogus")))
            else:
                await self.submit(ReclaimNotice(("r0",), deadline=self.clock.now(), event_id=self._eid("reserved")))

    async def _duplicates(self) -> None:
        """Every event sent twice or more with the same id: the second must be a no-op."""
        k = self.next_gpu
        ev = GpusGranted((GrantedGpu(f"spot-{k}", node=f"spot-node-{k}", instance_id=f"i-{k}"),),
                         event_id=self._eid("dup-grant"))
        if sum(1 for g in self.ctrl.executor.state.gpus.values() if g.zone is Zone.PREEMPTIBLE) < \
                self.cfg.cluster.max_preemptible_gpus:
            self.next_gpu += 1
            await self._twice(ev)
        wids = self._preemptible_workers()
        if wids:
            w = self.ctrl.executor.state.workers[self.rng.choice(wids)]
            await self._twice(ReclaimNotice(w.gpus, deadline=self.clock.now() + self.rng.uniform(0, 20),
                                            event_id=self._eid("dup-reclaim")))
        # a client reusing the trainer's own id: the client's namespace is its own, so the event is
        # applied once as the client's (never suppressing the trainer's) and then answered duplicate
        await self._twice(TrainingStarted(1, event_id="train-start-1"))

    async def _twice(self, ev: ElasticEvent) -> None:
        n = self.rng.randint(2, 4)
        applied = 0
        for _ in range(n):
            try:
                self.result.admin_events += 1
                res = await self.ctrl.submit(ev)
            except (UnknownResourceError, ValueError):
                return
            applied += int(res.applied)
        if applied > 1:
            self.checker.violation("event_applied_twice", f"event {ev.event_id} applied {applied} times out of {n}")


# ---------------------------------------------------------------------------------- the run
async def _run(cfg: RunConfig, seed: int, events: int, mean_gap_s: float, quiet_batches: int,
               phase_wait_s: float, progress: Callable[[int], None] | None) -> ChaosResult:
    from pearl.sim.emulated_trainer import EmulatedTrainer

    d = _Driver(cfg, seed, phase_wait_s)
    ctrl, clock, checker = d.ctrl, d.clock, d.checker
    await ctrl.start()

    async def take() -> Any:
        batch = await ctrl.take_batch()
        checker.batch(batch)
        return batch

    async def notify(ev: ElasticEvent) -> Any:
        t0 = clock.now()
        res = await ctrl.notify(ev)
        if isinstance(ev, TrainingStarted):
            d.result.return_delays.append(clock.now() - t0)
            checker.borrowed_returned(ev.step)
        return res

    trainer = EmulatedTrainer(clock, cfg.train.step_time_s, take, notify, lambda v: ctrl.publish(v, None))
    trainer.start()

    async def ticker() -> None:
        while True:
            await clock.sleep(2.0)
            checker.check("tick")

    d._spawn(ticker(), "chaos-ticker")
    try:
        await d.grant(4)
        for i in range(events):
            await clock.sleep(d.rng.expovariate(1.0 / mean_gap_s))
            kind = d.rng.choice(FAULT_KINDS)
            await d.inject(kind)
            checker.check(f"after {kind}")
            if d.rng.random() < 0.5:
                await d.grant(d.rng.randint(1, 3))
            if progress is not None:
                progress(i + 1)
        # quiet phase: faults disarmed, the pool refilled; the pipeline must keep completing batches
        d.faults.disarm()
        await d.grant(cfg.cluster.max_preemptible_gpus)
        target = ctrl.pipeline.stats.rollout_step + quiet_batches
        t_quiet = clock.now()
        while ctrl.pipeline.stats.rollout_step < target and clock.now() - t_quiet < 3600.0:
            await clock.wait(asyncio.ensure_future(ctrl.pipeline.wait_batch()), clock.now() + 60.0)
        if ctrl.pipeline.stats.rollout_step < target:
            checker.violation("trajectory_lost",
                       f"quiet phase: {target - ctrl.pipeline.stats.rollout_step} batches not completed in 3600 s "
                       f"({ctrl.pipeline.stats.trajectories_in_flight} trajectories stuck in flight)")
        checker.check("end")
    finally:
        for t in d.tasks:
            t.cancel()
        await asyncio.gather(*d.tasks, return_exceptions=True)
        await trainer.stop()
        res = d.result
        res.trajectories_completed = ctrl.pipeline.stats.trajectories_completed
        res.trajectories_trained = len(checker.delivered)
        res.runtime_failures = len(ctrl.pipeline.failures)
        res.virtual_s = clock.now()
        await ctrl.stop()
    res.violations = checker.to_dict()
    res.checks = checker.checks
    res.max_return_delay_s = max(res.return_delays, default=0.0)
    for kind, n in d.armed.items():  # engine-side faults: injected vs armed but never triggered
        got = d.engine.injected.get(kind, 0)
        if got:
            res.faults[kind] = got
        if n > got:
            res.not_reached[kind] = n - got
    return res


def run_chaos(seed: int = 0, events: int = 60, cfg: RunConfig | None = None, mean_gap_s: float = 20.0,
              quiet_batches: int = 2, phase_wait_s: float = 120.0,
              progress: Callable[[int], None] | None = None) -> ChaosResult:
    """One chaos run on a fresh virtual-time loop (deterministic for ``seed``)."""
    cfg = cfg or chaos_config(seed=seed)
    w0 = time.perf_counter()
    res = run_virtual(_run(cfg, seed, events, mean_gap_s, quiet_batches, phase_wait_s, progress))
    res.wall_s = time.perf_counter() - w0
    return res
