"""``python -m pearl chaos`` and ``python -m pearl reliability``: the reliability commands.

* ``pearl chaos --seed S [--events N] [--json]`` - one fault-injection run on the emulated engine
  in virtual time through the real runtime (``pearl.reliability.chaos``); exit code 1 if any
  invariant was violated. JSON keys: ``faults`` (count per kind), ``faults_not_reached``,
  ``invariant_violations`` (count; ``violations.first`` describes the first few),
  ``trajectories_completed``, ``trajectories_trained``, ``max_return_delay_s``, ``checks``,
  ``virtual_s``, ``wall_s``.
* ``pearl reliability [--out docs/RELIABILITY.md] [--seeds K] [--events N] [--fuzz-examples M]
  [--load-trajectories T]`` - regenerates ``docs/RELIABILITY.md`` from fresh runs: chaos over
  ``K`` seeds, controller kill -9 + restart recovery, parser fuzzing volume and crashes, the
  10,000-trajectory load test (``pearl.reliability.summary``). ``make reliability`` runs it.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def _chaos_cmd(args: argparse.Namespace) -> int:
    from pearl.reliability.chaos import chaos_config, run_chaos

    cfg = chaos_config(args.config, seed=args.seed)

    def progress(i: int) -> None:
        if not args.json and i % 10 == 0:
            print(f"  {i}/{args.events} faults", file=sys.stderr)

    res = run_chaos(seed=args.seed, events=args.events, cfg=cfg, mean_gap_s=args.mean_gap_s, progress=progress)
    d = res.to_dict()
    if args.json:
        print(json.dumps(d, indent=2))
    else:
        print(f"chaos seed {args.seed}: {d['faults_total']} faults injected in {d['virtual_s']:.0f} virtual s "
              f"({d['wall_s']:.1f} s wall)")
        for k, n in d["faults"].items():
            print(f"  {k:24s} {n}")
        if d["faults_not_reached"]:
            print(f"  not reached (phase did not occur in time): {d['faults_not_reached']}")
        print(f"trajectories completed {d['trajectories_completed']}, trained {d['trajectories_trained']}; "
              f"worst return delay {d['max_return_delay_s']:.1f} s over {d['returns']} returns")
        print(f"invariant violations: {d['invariant_violations']} ({d['checks']} checks)")
        for v in d["violations"].get("first", []):
            print(f"  [{v['invariant']}] t={v['t']}: {v['detail']}")
    return 1 if d["invariant_violations"] else 0


def add_chaos_parser(sub: Any) -> None:
    p = sub.add_parser("chaos", help="fault injection through the real runtime on the emulated engine (virtual time)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--events", type=int, default=60, help="faults to inject (default 60)")
    p.add_argument("--mean-gap-s", type=float, default=20.0, help="mean virtual seconds between faults")
    p.add_argument("--config", default="qwen3-8b-h200", help="base run config (shrunk to the chaos cluster)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_chaos_cmd)


def _reliability_cmd(args: argparse.Namespace) -> int:
    from pearl.reliability.summary import build_report

    _text, ok = build_report(seeds=args.seeds, events=args.events, fuzz_examples=args.fuzz_examples,
                            load_trajectories=args.load_trajectories, out=args.out,
                            log=lambda m: print(m, file=sys.stderr), vllm=args.vllm)
    print(f"wrote {args.out}")
    return 0 if ok else 1


def add_reliability_parser(sub: Any) -> None:
    p = sub.add_parser("reliability", help="regenerate docs/RELIABILITY.md (chaos, restart, fuzzing, load)")
    p.add_argument("--out", default="docs/RELIABILITY.md")
    p.add_argument("--seeds", type=int, default=5, help="chaos runs (seeds 0..K-1)")
    p.add_argument("--events", type=int, default=100, help="faults per chaos run")
    p.add_argument("--fuzz-examples", type=int, default=2000, help="hypothesis examples per parser")
    p.add_argument("--load-trajectories", type=int, default=10_000, help="concurrent trajectories in the load test")
    p.add_argument("--vllm", action="store_true",
                   help="also run the real-vLLM fault test (tests/reliability/test_vllm_faults.py, ~15 min)")
    p.set_defaults(func=_reliability_cmd)
