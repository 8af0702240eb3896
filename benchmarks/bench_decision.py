"""Decision + planning latency at 8 .. 2048 GPUs (goal: < 1 ms at 32, < 10 ms at 2048, one core).

For each budget N: a colocated cluster of N workers (1 GPU each) receives a grant of N/8 more
GPUs; we time ``decide`` (every candidate's makespan) and ``plan`` (minimal-change plan onto the
new budget) separately and together, best and median of R repetitions, on one thread, with the
one-pass evaluation (``decision.evaluate_table``, "new") and the term-by-term reference
(``makespan_reference.reference_table``, "ref") interleaved repetition by repetition (a change of
the machine's load hits both alike); the table prints both and their ratio, the largest relative
difference of their predictions, and the candidates whose fixed point did not come within
``stages.TOLERANCE`` ("unconv", new / ref). Times are this thread's
CPU time (``time.thread_time``): what one core spends, less sensitive than wall time to other
processes on the machine (caches and memory bandwidth are still shared).

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
from collections.abc import Callable

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from dataclasses import replace

from pearl.config import load_config
from pearl.core.decision import Allocation, Decision, TableFn, decide, evaluate_table
from pearl.core.hardware import HardwareProfile
from pearl.core.makespan_reference import reference_table
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


def interleaved(fns: dict[str, Callable[[], object]], reps: int) -> dict[str, list[float]]:
    """Each function's CPU times over ``reps`` repetitions, the functions alternating within each."""
    out: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            t = time.thread_time()
            fn()
            out[k].append(time.thread_time() - t)
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
    rows: list[dict[str, object]] = []
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
        d_ref = decide(n + grant, cfg.workload.batch_size, hw, wl, cfg.policy, current, evaluator=reference_table)
        diff = max(abs(a.makespan_s / b.makespan_s - 1.0) for a, b in zip(d.candidates, d_ref.candidates, strict=True))
        reps = args.reps if n <= 512 else max(5, args.reps // 3)
        row: dict[str, object] = {"profile": profile, "gpus": n, "grant": grant, "candidates": len(d.candidates),
                                  "target": d.target.label, "same_target": d.target == d_ref.target,
                                  "max_rel_diff": diff,
                                  "unconverged": sum(not c.converged for c in d.candidates),
                                  "ref_unconverged": sum(not c.converged for c in d_ref.candidates)}
        ones: dict[str, Callable[[], Decision]] = {}
        for tag, fn in (("new", evaluate_table), ("ref", reference_table)):
            def one(fn: TableFn = fn) -> Decision:
                return decide(n + grant, cfg.workload.batch_size, hw, wl, cfg.policy, current, evaluator=fn)  # noqa: B023
            ones[tag] = one
        t_dec = interleaved(dict(ones), reps)
        t_both = interleaved({tag: (lambda one=one, state=state, pool=pool: plan(state, one().target, pool))
                              for tag, one in ones.items()}, reps)
        for tag in ones:
            row[f"{tag}_decide_ms"] = statistics.median(t_dec[tag]) * 1e3
            row[f"{tag}_total_ms"] = statistics.median(t_both[tag]) * 1e3
            row[f"{tag}_total_best_ms"] = min(t_both[tag]) * 1e3
        row["plan_ms"] = statistics.median(timed(lambda: plan(state, d.target, pool), reps)) * 1e3  # noqa: B023
        rows.append(row)
    if args.json:
        print(json.dumps({"config": args.config, "rows": rows}, indent=2))
        return
    print(f"decision + planning latency ({args.config}, one thread; median of repetitions; new = one-pass "
          "evaluation, ref = term-by-term reference)")
    print(f"{'profile':>7} {'GPUs':>6} {'cands':>6} {'target':>8} {'plan ms':>8} {'ref decide':>10} {'new decide':>10} "
          f"{'ref total':>10} {'new total':>10} {'ref/new':>8} {'new best':>9} {'max rel diff':>12} {'unconv':>7}  "
          "goal (new total)")
    for r in rows:
        goal = "< 1 ms" if r["gpus"] <= 32 else ("< 10 ms" if r["gpus"] == 2048 else "")
        print(f"{r['profile']:>7} {r['gpus']:>6} {r['candidates']:>6} {r['target']:>8} {r['plan_ms']:>8.3f} "
              f"{r['ref_decide_ms']:>10.3f} {r['new_decide_ms']:>10.3f} {r['ref_total_ms']:>10.3f} "
              f"{r['new_total_ms']:>10.3f} {r['ref_total_ms'] / r['new_total_ms']:>7.2f}x {r['new_total_best_ms']:>9.3f} "
              f"{r['max_rel_diff']:>12.1e} {str(r['unconverged']) + '/' + str(r['ref_unconverged']):>7}  {goal}")


if __name__ == "__main__":
    main()
