"""The predictor's error batch by batch on a fixed allocation: how fast it falls once the
configuration has run (the closed loop, ``pearl.core.makespan_correction``, and the refits).

For each allocation and workload seed, the emulator runs 7 rollout batches of Qwen3-8B on a fixed
pool; batch k's error is its forecast at its start (``Controller.batch_predictions``) over its
measured makespan, minus 1. Batch 1 is predicted on the data-sheet prior; batch 2 is the first
after the configuration's first measured batch; batch 7 five batches later. Printed per
allocation: the mean |error| over the seeds at batch 2 and at batch 7, and the mean signed and
mean |error| over batches 2-7.

    python benchmarks/bench_closed_loop.py [--workers 8] [--seeds 3] [--json] coloc 2P6D 4P4D 7P1D
"""

from __future__ import annotations

import argparse
import json
import statistics

from pearl.config import RunConfig, load_config
from pearl.engines.emulated import EmulatedEngine
from pearl.runtime.clock import LoopClock
from pearl.runtime.controller import Controller
from pearl.sim.sessions import SyntheticSessionFactory
from pearl.sim.simulate import run_virtual

BATCHES = 7


async def _errors(cfg: RunConfig) -> list[float]:
    clock = LoopClock()
    engine = EmulatedEngine.from_config(cfg, clock, EmulatedEngine.emulator_physics(cfg))
    ctrl = Controller(cfg, engine, SyntheticSessionFactory(cfg.workload, clock), clock=clock, max_batches=BATCHES)
    await ctrl.start()
    try:
        await ctrl.wait_batches(BATCHES)
        return [p / o - 1.0 for p, o in ctrl.batch_predictions]
    finally:
        await ctrl.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("labels", nargs="+")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    base = load_config("qwen3-8b-h200")
    n = args.workers
    out: dict[str, list[list[float]]] = {}
    for label in args.labels:
        for seed in range(args.seeds):
            policy = base.policy.model_copy(update={
                "use_preemptible": False, "borrow_enabled": False, "allocation_overrides": {n: label},
                "allow_disaggregation": True, "max_staleness": BATCHES + 1})
            cluster = base.cluster.model_copy(update={"reserved_gpus": n * base.cluster.tp_size, "max_preemptible_gpus": 0})
            wl = base.workload.model_copy(update={"seed": base.workload.seed + seed})
            cfg = base.model_copy(update={"policy": policy, "cluster": cluster, "workload": wl})
            out.setdefault(label, []).append(run_virtual(_errors(cfg)))
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"predictor error by batch on a fixed pool of {n} workers (Qwen3-8B, {args.seeds} seeds)")
    print(f"{'alloc':>7} {'|err| b2':>9} {'|err| b7':>9} {'signed b2-7':>12} {'|err| b2-7':>11}")
    for label, runs in out.items():
        b2 = statistics.fmean(abs(r[1]) for r in runs)
        b7 = statistics.fmean(abs(r[BATCHES - 1]) for r in runs)
        later = [e for r in runs for e in r[1:]]
        print(f"{label:>7} {100 * b2:>8.1f}% {100 * b7:>8.1f}% {100 * statistics.fmean(later):>+11.1f}% "
              f"{100 * statistics.fmean(abs(e) for e in later):>10.1f}%")


if __name__ == "__main__":
    main()
