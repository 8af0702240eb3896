"""Replay speed: one 2-hour segment at paper scale (16 training GPUs, 4 reserved + up to 12
preemptible, batch 64, 32K limit) through the real runtime on the emulated engine, per system.

    .venv/bin/python benchmarks/bench_replay.py [--systems pearl,roll] [--costs datasheet,database]
        [--trace FILE]   (default: the shipped configs/traces/bamboo-g4dn/g4dn-trace.csv)

``--costs`` runs each system once per cost model (``emulator.costs``: the datasheet formulas, the
measured database tables), side by side in the same process, and prints the CPU ratio of each to
the first.

Prints, per system, wall and CPU seconds (CPU time of this single-threaded process = the one-core
figure even on a shared machine), simulated engine events, events per CPU second and the ratio of
simulated to CPU time.
"""

from __future__ import annotations

import argparse
import time

from pearl.sim.presets import load_preset_config
from pearl.sim.simulate import run_system
from pearl.sim.systems import parse_systems
from pearl.sim.traces import SHIPPED_TRACE, gpu_timeline, load_trace, pick_segments


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="qwen3-8b-h200")
    ap.add_argument("--segment", default="volatile")
    ap.add_argument("--systems", default="roll,rlboost+,pearl")
    ap.add_argument("--trace", default=str(SHIPPED_TRACE), help="availability trace (pearl/sim/traces.py formats)")
    ap.add_argument("--costs", default="datasheet,database", help="emulator.costs values to run side by side")
    a = ap.parse_args()
    base = load_preset_config(a.config, "paper")
    modes = [m.strip() for m in a.costs.split(",") if m.strip()]
    cfg = base
    tr = load_trace(a.trace)
    p = pick_segments(tr, cfg.cluster)[a.segment]
    tl = gpu_timeline(tr.segment(p.start_hour * 3600, 7200), cfg.cluster)
    print(f"{a.config} workload=paper segment={a.segment}@{p.start_hour:.2f}h (2 h)")
    for spec in parse_systems(a.systems):
        first = 0.0
        for mode in modes:
            cfg = base.model_copy(update={"emulator": base.emulator.model_copy(update={"costs": mode})})
            w0 = time.perf_counter()
            s, _ = run_system(cfg, spec, tl)
            w = time.perf_counter() - w0
            first = first or s["cpu_s"]
            print(f"  {spec.name:10s} {mode:9s} wall {w:6.1f} s  cpu {s['cpu_s']:6.1f} s ({s['cpu_s'] / first:4.2f}x)  "
                  f"events {s['sim_events']:8d}  {s['sim_events_per_cpu_s']:8.0f} events/cpu-s  "
                  f"simulated/cpu {7200 / s['cpu_s']:6.0f}x  traj/h {s['trajectories_per_hour']:.0f}", flush=True)


if __name__ == "__main__":
    main()
