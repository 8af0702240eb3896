"""Replay speed of the production runtime on the emulated engine (virtual time).

A paper-scale run: Qwen3-8B on H200, B=64 trajectories (8 GRPO groups) of 24 turns with ~300
output tokens and 700 observation tokens per turn and 4 s env steps, a trainer step of 164 s,
4 reserved + 12 preemptible GPUs granted at t=0 with a reclaim of 4 after 40 min and a re-grant
after 70 min, 16 borrowable training GPUs (up to 32 workers). Prints the wall time of a
2-hour replay and the simulated events per second, for two variants side by side:

    pearl      the full runtime (expansion, shrink, borrowing, PD decisions)
    fixed-16   16 GPUs from the start, no borrowing (fewer reconfigurations)

Usage: .venv/bin/python benchmarks/bench_runtime_replay.py [--hours 2]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

from pearl.config import RunConfig, load_config
from pearl.core.events import GpusGranted, GrantedGpu, ReclaimNotice
from pearl.core.session import EpisodeEnd, SessionSpec, TurnInput
from pearl.engines.emulated import EmulatedEngine
from pearl.runtime.clock import Clock, LoopClock, run_virtual
from pearl.runtime.controller import Controller


@dataclass
class Session:
    spec: SessionSpec
    clock: Clock
    turns: int = 24
    done: int = 0

    def _ids(self, n: int) -> tuple[int, ...]:
        base = (hash(self.spec.traj_id) + self.done * 7919) % 100_000 + 1
        return tuple(range(base, base + n))

    async def start(self) -> TurnInput:
        return TurnInput(self._ids(2500), 300)

    async def step(self, response_ids: tuple[int, ...]) -> TurnInput | EpisodeEnd:
        self.done += 1
        await self.clock.sleep(4.0)
        if self.done >= self.turns:
            return EpisodeEnd(1.0)
        return TurnInput(self._ids(700), 300)


class Trainer:
    def __init__(self, clock: Clock, step_s: float) -> None:
        self.clock, self.step_s = clock, step_s

    async def train_step(self, step: int, batch: object) -> None:
        await self.clock.sleep(self.step_s)


def replay(cfg: RunConfig, hours: float, churn: bool) -> dict[str, float]:
    async def main() -> dict[str, float]:
        clock = LoopClock()
        eng = EmulatedEngine.from_config(cfg, clock)
        ctl = Controller(cfg, eng, lambda s: Session(s, clock), Trainer(clock, cfg.train.step_time_s), clock=clock)
        await ctl.start()
        t0 = clock.now()
        if churn:
            await ctl.submit(GpusGranted(tuple(GrantedGpu(f"p{i}", f"pn{i // 8}") for i in range(12)), event_id="g0"))
            await clock.sleep_until(t0 + 2400)
            await ctl.submit(ReclaimNotice(("p8", "p9", "p10", "p11"), clock.now() + 120, event_id="r1"))
            await clock.sleep_until(t0 + 4200)
            await ctl.submit(GpusGranted(tuple(GrantedGpu(f"q{i}", "qn0") for i in range(4)), event_id="g1"))
        await clock.sleep_until(t0 + hours * 3600)
        p = ctl.progress()
        s = ctl.summary()
        await ctl.stop()
        return {"trajectories": p.trajectories_completed, "rollout_steps": p.rollout_step,
                "events": eng.events, "reconfigurations": sum(s["reconfigurations"].values())}

    w0, c0 = time.perf_counter(), time.process_time()
    out = run_virtual(main())
    out["wall_s"] = time.perf_counter() - w0
    out["cpu_s"] = time.process_time() - c0  # the figure to trust on a shared, loaded machine
    out["events_per_s"] = out["events"] / out["wall_s"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hours", type=float, default=2.0)
    args = ap.parse_args()
    base = load_config("qwen3-8b-h200")
    fixed = load_config("qwen3-8b-h200", overrides={"cluster.reserved_gpus": 16, "cluster.max_preemptible_gpus": 0,
                                                     "policy.borrow_enabled": False})
    rows = {"pearl": replay(base, args.hours, churn=True), "fixed-16": replay(fixed, args.hours, churn=False)}
    print(f"{'variant':10s} {'wall_s':>8s} {'cpu_s':>8s} {'events':>8s} {'events/cpu_s':>12s} {'traj':>6s} "
          f"{'steps':>6s} {'reconf':>6s}")
    for name, r in rows.items():
        print(f"{name:10s} {r['wall_s']:8.2f} {r['cpu_s']:8.2f} {r['events']:8.0f} {r['events'] / r['cpu_s']:12.0f} "
              f"{r['trajectories']:6.0f} {r['rollout_steps']:6.0f} {r['reconfigurations']:6.0f}")
    print(f"wall ratio pearl / fixed-16: {rows['pearl']['wall_s'] / rows['fixed-16']['wall_s']:.2f}")


if __name__ == "__main__":
    main()
