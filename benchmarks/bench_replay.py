"""Replay speed per cost model: one trace segment at paper scale (16 training GPUs, 4 reserved + up
to 12 preemptible, batch 64, 32K limit) through the real runtime on the emulated engine, per system
and per ``emulator.costs``, side by side in one run.

    .venv/bin/python benchmarks/bench_replay.py [--systems pearl,roll] [--costs datasheet,database]
        [--segment volatile] [--minutes 120] [--repeat 1] [--trace FILE] [--set KEY=VALUE ...]

    # the 768-GPU cluster: 256 reserved + 256 training + up to 256 preemptible (16-GPU instances on
    # the shipped trace), batch 1024, 15 virtual minutes
    .venv/bin/python benchmarks/bench_replay.py --systems pearl --minutes 15 \\
        --set cluster.reserved_gpus=256 --set cluster.training_gpus=256 \\
        --set cluster.max_preemptible_gpus=256 --set cluster.gpus_per_instance=16 --set workload.batch_size=1024

Each replay runs in a fresh child process (so its peak RSS is its own), one after the other, the
cost models interleaved ``--repeat`` times (the replay with the least CPU of each is printed: the
figure least disturbed by other load on a shared machine). Per replay: CPU seconds of the replay (the child's single-threaded process time: the one-core figure
even on a shared machine), simulated engine events, events per CPU second, trajectories completed,
CPU milliseconds per trajectory and the child's peak RSS; then each cost model's ratio to the first
(``cpu``: CPU s per segment; ``ev/cpu``: events per CPU s; ``cpu/traj``: CPU per completed
trajectory). The cost models run the same physics file but are different worlds: a faster one
completes more trajectories in the same virtual time, so CPU per segment and CPU per trajectory are
both printed.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import resource
import sys
import time
from typing import Any

import yaml


def _replay(config: str, overrides: dict[str, Any], costs: str, segment: str, minutes: float, trace: str,
            system: str) -> dict[str, Any]:
    """One replay in this (child) process: its summary figures and this process's peak RSS."""
    from pearl.sim.presets import load_preset_config
    from pearl.sim.simulate import run_system
    from pearl.sim.systems import parse_systems
    from pearl.sim.traces import gpu_timeline, load_trace, pick_segments

    cfg = load_preset_config(config, "paper", {**overrides, "emulator.costs": costs})
    tr = load_trace(trace)
    p = pick_segments(tr, cfg.cluster)[segment]
    tl = gpu_timeline(tr.segment(p.start_hour * 3600, minutes * 60), cfg.cluster)
    w0 = time.perf_counter()
    s, _ = run_system(cfg, parse_systems(system)[0], tl)
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"wall_s": time.perf_counter() - w0, "cpu_s": s["cpu_s"], "events": s["sim_events"],
            "trajectories": s["trajectories_completed"], "rss_mb": rss_kib / 1024, "start_hour": p.start_hour}


def _in_child(*args: Any) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=ctx) as ex:
        return ex.submit(_replay, *args).result()


def main() -> None:
    from pearl.sim.systems import parse_systems
    from pearl.sim.traces import SHIPPED_TRACE

    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="qwen3-8b-h200")
    ap.add_argument("--segment", default="volatile", choices=["abundant", "scarce", "volatile"])
    ap.add_argument("--minutes", type=float, default=120.0, help="virtual minutes replayed from the segment's start")
    ap.add_argument("--systems", default="roll,rlboost+,pearl")
    ap.add_argument("--trace", default=str(SHIPPED_TRACE), help="availability trace (pearl/sim/traces.py formats)")
    ap.add_argument("--costs", default="datasheet,database", help="emulator.costs values to run side by side")
    ap.add_argument("--repeat", type=int, default=1,
                    help="replays per system and cost model, interleaved; the least CPU of each is printed")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    a = ap.parse_args()
    overrides: dict[str, Any] = {}
    for it in a.set:
        if "=" not in it:
            sys.exit(f"--set {it!r}: expected KEY=VALUE, e.g. workload.batch_size=1024")
        k, v = it.split("=", 1)
        overrides[k.strip()] = yaml.safe_load(v)
    modes = [m.strip() for m in a.costs.split(",") if m.strip()]
    print(f"{a.config} workload=paper segment={a.segment} ({a.minutes:g} virtual min) {overrides or ''}")
    for spec in parse_systems(a.systems):
        runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
        for _ in range(a.repeat):
            for mode in modes:
                runs[mode].append(_in_child(a.config, overrides, mode, a.segment, a.minutes, a.trace, spec.name))
        first: dict[str, Any] | None = None
        for mode in modes:
            r = min(runs[mode], key=lambda x: x["cpu_s"])
            ev_cpu = r["events"] / r["cpu_s"]
            per_traj = 1e3 * r["cpu_s"] / r["trajectories"] if r["trajectories"] else float("nan")
            first = first or {**r, "ev_cpu": ev_cpu, "per_traj": per_traj}
            print(f"  {spec.name:10s} {mode:9s} wall {r['wall_s']:6.1f} s  cpu {r['cpu_s']:6.1f} s  "
                  f"events {r['events']:8d}  {ev_cpu:6.0f} ev/cpu-s  traj {r['trajectories']:6d}  "
                  f"{per_traj:6.2f} cpu-ms/traj  rss {r['rss_mb']:6.0f} MB  |  vs {modes[0]}: "
                  f"cpu {r['cpu_s'] / first['cpu_s']:4.2f}x  ev/cpu {ev_cpu / first['ev_cpu']:4.2f}x  "
                  f"cpu/traj {per_traj / first['per_traj']:4.2f}x", flush=True)


if __name__ == "__main__":
    main()
