"""``python -m pearl simulate`` and ``python -m pearl experiments``: argument parsing only.

``pearl/cli.py`` registers the subcommands with::

    from pearl.sim.cli import add_simulate_parser, add_experiments_parser
    add_simulate_parser(subparsers)      # each sets ``func`` (args -> exit code) as a default
    add_experiments_parser(subparsers)

``python -m pearl.sim.cli simulate|experiments ...`` runs them without the main CLI.

simulate: ``--config C --trace FILE [--start-hour H --hours 2 | --segment abundant|scarce|volatile]
--systems pearl,roll,rlboost+,oracle [--json] [--out DIR] [--set workload.batch_size=32 ...]``.
With ``--json`` one JSON object ``{"systems": {NAME: summary}, "wall_s": s, "meta": {...}}`` is
printed to stdout; otherwise a rich progress display and a report folder (markdown + PNG).
Exit codes: 0 ok, 2 bad input (config / trace / system name; the message names what).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from pearl.config import ConfigError


def _parse_set(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for it in items:
        if "=" not in it:
            raise ConfigError(f"--set {it!r}: expected KEY=VALUE, e.g. workload.batch_size=32")
        k, v = it.split("=", 1)
        out[k.strip()] = yaml.safe_load(v)
    return out


def add_simulate_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "simulate", help="replay an availability trace through the real control plane (virtual time)")
    p.add_argument("--config", default="configs/qwen3-8b-h200.yaml", help="run config YAML (or a name in configs/)")
    p.add_argument("--trace", required=True,
                   help="spot-traces JSON, time_s,available CSV or Bamboo time_ms,add|remove,node event log "
                   "(shipped: configs/traces/bamboo-g4dn/g4dn-trace.csv)")
    p.add_argument("--start-hour", type=float, default=None, help="segment start in the trace (hours)")
    p.add_argument("--hours", type=float, default=2.0, help="segment length (hours)")
    p.add_argument("--segment", choices=["abundant", "scarce", "volatile", "like-14", "like-10", "like-12"],
                   default=None, help="let the picker choose the segment (instead of --start-hour); like-N: "
                   "the segment matched to the paper's with a ROLL-Large pool of N GPUs (experiments fig5-paper)")
    p.add_argument("--systems", default="pearl,roll,rlboost+,oracle",
                   help="comma-separated: roll, roll-large, rlboost+, pearl, oracle, pearl-coloc, pearl-nogate")
    p.add_argument("--roll-large-gpus", type=int, default=None,
                   help="roll-large pool size (default: reserved + the segment's mean preemptible GPUs)")
    p.add_argument("--seed", type=int, default=None, help="workload seed (default: the config's)")
    p.add_argument("--notice-s", type=float, default=120.0, help="reclaim notice before a drop (AWS: 120 s)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    p.add_argument("--out", default=None, help="report folder (default runs/simulate/<config>-<segment>)")
    p.set_defaults(func=simulate_main)
    return p


def add_experiments_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "experiments", help="regenerate the paper's figures and tables (Fig. 5/7/8, Tables 2/3)")
    p.add_argument("which", nargs="?", default="all",
                   choices=["fig5", "fig5-paper", "fig7", "fig8", "table2", "table3", "all", "collect", "worlds"],
                   help="an experiment, all of them, collect (rebuild EXPERIMENTS.md from the tables in --out), or "
                        "worlds (where the best PD mode changes: pearl/sim/worlds.py; not part of all)")
    p.add_argument("--out", default="runs/experiments", help="output folder (tables, PNGs, results.json)")
    p.add_argument("--trace", default=None, help="trace for Fig. 5 / Fig. 8 / Table 3 (default: the shipped configs/traces/bamboo-g4dn/g4dn-trace.csv)")
    p.add_argument("--hours", type=float, default=2.0, help="segment length for Fig. 5")
    p.add_argument("--jobs", type=int, default=1, help="worker processes for independent replays")
    p.add_argument("--systems", default=None, help="fig5: comma list of systems (default: all of them); fig7: the "
                   "ablation rungs to run (default all: roll,+pd,+pd+toggle,+pd+toggle+gate; roll always runs)")
    p.add_argument("--table2-seeds", type=int, default=None,
                   help="table2 only: paired workload seeds per budget (default 24; more resolve near-ties)")
    p.add_argument("--seeds", type=int, default=1,
                   help="fig5 / fig5-paper / fig7 / fig8: workload seeds per cell (default 1; >1 adds a table of "
                        "means and spreads over the seeds)")
    p.add_argument("--quick", action="store_true", help="small scale (short segments, fewer points): for tests")
    p.add_argument("--docs", default="docs/EXPERIMENTS.md", help="markdown with every table ('' to skip)")
    w = p.add_argument_group("worlds")
    w.add_argument("--worlds", type=int, default=60, help="worlds drawn from the space (Latin hypercube)")
    w.add_argument("--seed", type=int, default=0, help="the design's and the workload's seed")
    w.add_argument("--batches", type=int, default=3, help="rollout batches per run of a world")
    w.add_argument("--top-k", type=int, default=3, help="splits the prior ranks best that the static search measures")
    w.add_argument("--exhaustive", type=int, default=0,
                   help="measure every split in this many worlds (those of at most 16 GPUs first) and report how "
                        "often the static search found the exhaustive best")
    w.add_argument("--world", action="append", default=[], metavar="KEY=VALUE,...",
                   help="an extra world, e.g. 'hardware=h100_sxm,model=qwen3-30b-a3b,gpus=12,batch=96' (repeatable)")
    w.add_argument("--no-paper", action="store_true", help="leave out the paper's own points")
    w.add_argument("--json", action="store_true", help="print one JSON object {worlds, summary} on stdout")
    p.set_defaults(func=experiments_main)
    return p


def simulate_main(args: argparse.Namespace) -> int:
    from pearl.sim.simulate import SimulationError, run_simulation_cli
    from pearl.sim.systems import UnknownSystemError
    from pearl.sim.traces import TraceError

    try:
        from pearl.sim.presets import load_preset_config

        cfg = load_preset_config(args.config, "paper", _parse_set(args.set))
        result = run_simulation_cli(cfg, args)
    except (ConfigError, TraceError, UnknownSystemError, SimulationError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"systems": result["systems"], "wall_s": result["wall_s"], "meta": result["meta"]}))
    return 0


def experiments_main(args: argparse.Namespace) -> int:
    from pearl.sim.experiments import run_experiments
    from pearl.sim.systems import UnknownSystemError
    from pearl.sim.traces import TraceError

    if args.which == "worlds":
        from pearl.sim.worlds_report import worlds_main

        return worlds_main(args)
    if args.seeds < 1:
        print(f"error: --seeds {args.seeds}: give at least 1 workload seed per cell", file=sys.stderr)
        return 2
    try:
        out = run_experiments(args.which, Path(args.out), trace=args.trace, hours=args.hours, quick=args.quick,
                              docs=args.docs or None,
                              jobs=args.jobs, systems=args.systems.split(",") if args.systems else None,
                              table2_seeds=args.table2_seeds, seeds=args.seeds)
    except (ConfigError, TraceError, UnknownSystemError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


def add_calibrate_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "calibrate", help="fit the emulator's free constants to the paper's single-system measurements",
        description="Weighted least squares on makespan ratios (pearl/sim/calibrate.py): a coarse grid, then "
                    "local search; writes the constants and every target's residual to configs/emulator/.")
    p.add_argument("--params", default="host_cpu_factor,launch_per_layer_s,response_tokens,observation_tokens,env_step_s",
                   help="comma list of constants to fit (pearl.sim.calibrate.PARAMS)")
    p.add_argument("--targets", default="colocated",
                   help="comma list of target names or prefixes ('colocated': Sec. 2.1, 3.1, 3.2; '' for all)")
    p.add_argument("--seeds", type=int, default=8, help="paired workload seeds per point of the search")
    p.add_argument("--final-seeds", type=int, default=None, help="seeds of the final scoring (default --seeds)")
    p.add_argument("--grid", type=int, default=3,
                   help="grid levels per constant (0: start the local search from the files' values)")
    p.add_argument("--local-rounds", type=int, default=2)
    p.add_argument("--step", type=float, default=None,
                   help="local search step as a fraction of each constant's bound range "
                        "(default: half a grid cell; 1/6 with --grid 0)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes measuring the batches")
    p.add_argument("--evaluate", action="store_true", help="score the physics files as they are; no search")
    p.add_argument("--dry-run", action="store_true", help="do not write the physics files")
    p.set_defaults(func=calibrate_main)
    return p


def _cpu_s() -> float:
    """CPU seconds of this process and of its finished worker processes."""
    import os

    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def calibrate_main(args: argparse.Namespace) -> int:
    import contextlib
    import shlex
    import time

    from pearl.engines.emulated_physics import PhysicsError
    from pearl.sim.calibrate import CalibrationError, calibrate, evaluate, select_targets, table, write_fit

    t0, c0 = time.time(), _cpu_s()
    try:
        targets = select_targets(args.targets)
        if args.evaluate:
            from concurrent.futures import ProcessPoolExecutor

            with ProcessPoolExecutor(max_workers=args.jobs) if args.jobs > 1 else contextlib.nullcontext() as pool:
                ev = evaluate({}, targets, args.final_seeds or args.seeds, pool=pool,
                              progress=lambda m: print(m, file=sys.stderr, flush=True))
            print(table(ev, ev, targets))
            return 0
        params = [p for p in args.params.split(",") if p]
        start, fit, hist = calibrate(params, targets, args.seeds, args.grid, args.local_rounds, args.final_seeds,
                                     step=args.step, jobs=args.jobs,
                                     progress=lambda m: print(m, file=sys.stderr, flush=True))
    except (CalibrationError, PhysicsError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(table(start, fit, targets))
    record = {"command": "python -m pearl calibrate " + " ".join(shlex.quote(a) for a in sys.argv[2:]),
              "params": params, "seeds": args.seeds, "final_seeds": args.final_seeds or args.seeds,
              "grid": args.grid, "local_rounds": args.local_rounds, "jobs": args.jobs, "points": len(hist),
              "batches": sum(e.batches for e in hist),
              "cpu_s": round(_cpu_s() - c0, 1), "wall_s": round(time.time() - t0, 1),
              "start_loss": round(start.loss, 4)}
    print(f"\n{record['points']} points, {record['batches']} batches, {record['cpu_s']} CPU s, "
          f"{record['wall_s']} s wall")
    if not args.dry_run:
        for p in write_fit(fit, targets, record):
            print(f"wrote {p}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pearl")
    sub = parser.add_subparsers(dest="command", required=True)
    add_simulate_parser(sub)
    add_experiments_parser(sub)
    add_calibrate_parser(sub)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
