"""Load: 10,000 concurrent trajectories through the real controller; control-plane CPU per request.

Runs one rollout batch of N trajectories (all admitted at once) twice in virtual time
(``pearl.reliability.load``): on ``InstantEngine`` (no serving cost: the CPU is the control
plane's own) and on the emulated engine (plus the emulator's simulation). Prints both side by
side and their ratio.

    .venv/bin/python benchmarks/bench_load.py [--trajectories 10000] [--json]
"""

from __future__ import annotations

import argparse
import json

from pearl.reliability.load import run_load


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trajectories", type=int, default=10_000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = [run_load(args.trajectories, e) for e in ("instant", "emulated")]
    if args.json:
        print(json.dumps([r.to_dict() for r in rows], indent=2))
        return
    print(f"one rollout batch of {args.trajectories} concurrent trajectories (real controller, virtual time)")
    print(f"{'engine':10s} {'done':>7s} {'requests':>9s} {'peak':>7s} {'CPU s':>7s} {'us/req':>8s} {'wall s':>7s}")
    for r in rows:
        print(f"{r.engine:10s} {r.completed:7d} {r.requests:9d} {r.peak_in_flight:7d} {r.cpu_s:7.2f} "
              f"{r.cpu_us_per_request:8.1f} {r.wall_s:7.2f}")
    a, b = rows
    print(f"control plane alone (instant) = {a.cpu_us_per_request:.0f} us CPU per request; "
          f"with the emulator {b.cpu_us_per_request / a.cpu_us_per_request:.2f}x that")


if __name__ == "__main__":
    main()
