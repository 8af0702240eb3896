"""Decision + planning latency at 8 .. 2048 GPUs (goal: < 1 ms at 32, < 20 ms at 2048, one core).

For each budget N: a colocated cluster of N workers (1 GPU each) receives a grant of N/8 more
GPUs; we time ``decide`` (every candidate's makespan) and ``plan`` (minimal-change plan onto the
new budget) separately and together, best and median of R repetitions, on one thread. Times are
this thread's CPU time (``time.thread_time``): what one core spends, independent of how busy the
machine is with other processes.

Two profiles: ``prior`` (``WorkloadProfile.from_spec``, before any telemetry) and ``fitted``, the
shape of a profile after telemetry: a measured tail factor and the slowest paths of 4 windows
(``workload.TAIL_WINDOWS``) x 4 trajectories (``workload.TAIL_PATHS``) of about the turn count the
slowest of B trajectories reaches (``S(k) >= 1 / B``), which every P:D candidate runs through its
stages (``disaggregated._slowest_path``). The paths are synthesised from the prior's per-turn
means (their values do not change the work; their count and length do).

    python benchmarks/bench_decision.py [--config C] [--reps R] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from dataclasses import replace

from pearl.config import load_config
from pearl.core.decision import Allocation, decide
from pearl.core.hardware import HardwareProfile
from pearl.core.planner import plan
from pearl.core.state import ClusterState, Gpu, Role, Worker, WorkerStatus, Zone
from pearl.core.workload import TAIL_PATHS, TAIL_WINDOWS, PathTurn, WorkloadProfile


def timed(fn, reps: int) -> list[float]:  # type: ignore[no-untyped-def]
    out = []
    for _ in range(reps):
        t = time.thread_time()
        fn()
        out.append(time.thread_time() - t)
    return out


def fitted_shape(wl: WorkloadProfile, batch: int) -> WorkloadProfile:
    """``wl`` with a tail factor and 4 windows x 4 slowest paths (module docstring)."""
    # the slowest trajectories of a batch of B reach about the turn where S(k) falls to 1 / B
    k = max(1, sum(1 for sv in wl.survival if sv >= 1.0 / batch))
    windows = tuple(
        tuple(tuple(PathTurn(x * f, c, o * f, e) for x, c, o, e in zip(wl.new_tokens, wl.cached_tokens, wl.output_tokens,
                                                               wl.env_s, strict=True))[: max(1, k - j - w)]
              for j, f in enumerate(1.0 + 0.05 * i for i in range(TAIL_PATHS)))
        for w in range(TAIL_WINDOWS))
    weights = (*(0.5 * 0.5**i for i in range(TAIL_WINDOWS - 1)), 0.5 ** (TAIL_WINDOWS - 1))
    return replace(wl, tail_factor=1.2, tail_paths=windows[0], tail_history=windows[1:], tail_weights=weights)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="qwen3-30b-a3b-h200")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    cfg = load_config(args.config)
    hw = HardwareProfile.from_specs(cfg.model, cfg.hardware, 1)
    prior = WorkloadProfile.from_spec(cfg.workload)
    rows = []
    for (profile, wl), n in ((p, n) for p in (("prior", prior), ("fitted", fitted_shape(prior, cfg.workload.batch_size)))
                             for n in (8, 32, 128, 512, 2048)):
        grant = max(1, n // 8)
        gpus = [Gpu(f"g{i:05d}", Zone.RESERVED) for i in range(n)] + [
            Gpu(f"p{i:05d}", Zone.PREEMPTIBLE) for i in range(grant)
        ]
        workers = [Worker(f"w{i:05d}", (f"g{i:05d}",), Role.COLOCATED, WorkerStatus.ACTIVE) for i in range(n)]
        state = ClusterState.build(gpus, workers)
        pool = [g.gpu_id for g in gpus]
        current = Allocation.colocated(n)
        d = decide(n + grant, cfg.workload.batch_size, hw, wl, cfg.policy, current)
        reps = args.reps if n <= 512 else max(5, args.reps // 3)
        t_dec = timed(lambda: decide(n + grant, cfg.workload.batch_size, hw, wl, cfg.policy, current), reps)  # noqa: B023
        t_plan = timed(lambda: plan(state, d.target, pool), reps)  # noqa: B023
        t_both = timed(lambda: plan(state, decide(n + grant, cfg.workload.batch_size, hw, wl, cfg.policy,  # noqa: B023
                                                  current).target, pool), reps)  # noqa: B023
        rows.append({
            "profile": profile, "gpus": n, "grant": grant, "candidates": len(d.candidates), "target": d.target.label,
            "decide_ms_median": statistics.median(t_dec) * 1e3, "plan_ms_median": statistics.median(t_plan) * 1e3,
            "total_ms_median": statistics.median(t_both) * 1e3, "total_ms_best": min(t_both) * 1e3,
        })
    if args.json:
        print(json.dumps({"config": args.config, "rows": rows}, indent=2))
        return
    print(f"decision + planning latency ({args.config}, one thread; median of repetitions)")
    print(f"{'profile':>7} {'GPUs':>6} {'cands':>6} {'target':>10} {'decide ms':>10} {'plan ms':>9} {'total ms':>9} "
          f"{'best ms':>8}  goal")
    for r in rows:
        goal = "< 1 ms" if r["gpus"] <= 32 else ("< 20 ms" if r["gpus"] == 2048 else "")
        print(f"{r['profile']:>7} {r['gpus']:>6} {r['candidates']:>6} {r['target']:>10} {r['decide_ms_median']:>10.3f} "
              f"{r['plan_ms_median']:>9.3f} {r['total_ms_median']:>9.3f} {r['total_ms_best']:>8.3f}  {goal}")


if __name__ == "__main__":
    main()
