"""``python -m pearl <command>``: the command-line entry (the same code ``pearl/main.py`` runs).

Core commands (pure, instant; their JSON shapes are stable and documented in the README):

* ``decide`` — the PD decision for a GPU budget (every candidate's predicted makespan + reason);
* ``plan``   — the minimal-change plan from a state JSON to a target allocation.

Other commands are contributed by their packages through ``add_<name>_parser(subparsers)``
functions listed in ``_PLUGINS`` (simulate / experiments, serve, run, chaos, reliability, ...).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pearl.config import ConfigError, RunConfig, load_config
from pearl.core.decision import Allocation, Decision, DecisionError, decide
from pearl.core.planner import PlanError, plan
from pearl.core.profile import (
    HardwareProfile,
    ProfileError,
    TelemetryRecord,
    WorkloadProfile,
    fit_hardware,
    fit_workload,
)
from pearl.core.state import ClusterState, StateError, Zone

#: (module, function) pairs that add sub-commands; a module that does not exist yet is skipped.
_PLUGINS: tuple[tuple[str, str], ...] = (
    ("pearl.sim.cli", "add_simulate_parser"),
    ("pearl.sim.cli", "add_experiments_parser"),
    ("pearl.sim.cli", "add_calibrate_parser"),
    ("pearl.sim.costs", "add_costs_parser"),
    ("pearl.serve", "add_serve_parser"),
    ("pearl.run", "add_run_parser"),
    ("pearl.reliability.cli", "add_chaos_parser"),
    ("pearl.reliability.cli", "add_reliability_parser"),
)


class CliError(Exception):
    """A user error: printed without a traceback, exit code 2."""


# ------------------------------------------------------------------------------------ decide
def profiles(cfg: RunConfig, telemetry: str | None = None) -> tuple[HardwareProfile, WorkloadProfile]:
    """Profiles from the config's first principles, refit on a telemetry JSON-lines file if given."""
    hw = HardwareProfile.from_specs(cfg.model, cfg.hardware, cfg.cluster.tp_size)
    wl = WorkloadProfile.from_spec(cfg.workload)
    if telemetry:
        recs = read_telemetry(telemetry)
        hw = fit_hardware(hw, recs, alpha=1.0)
        wl = fit_workload(wl, recs, alpha=cfg.policy.profile_ema_alpha)
    return hw, wl


def read_telemetry(path: str) -> list[TelemetryRecord]:
    fields = set(TelemetryRecord.__dataclass_fields__)
    out: list[TelemetryRecord] = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise CliError(f"cannot read telemetry {path}: {e.strerror}") from None
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            out.append(TelemetryRecord(**{k: v for k, v in row.items() if k in fields}))
        except (json.JSONDecodeError, TypeError) as e:
            raise CliError(f"telemetry {path} line {i}: {e}") from None
    return out


def _decide_cmd(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    if args.gpus < 1:
        raise CliError(f"--gpus {args.gpus}: need at least 1 GPU")
    limit = cfg.cluster.max_rollout_gpus
    if args.gpus > limit:
        raise CliError(
            f"--gpus {args.gpus} exceeds the cluster's rollout GPUs ({limit} = reserved "
            f"{cfg.cluster.reserved_gpus} + preemptible {cfg.cluster.max_preemptible_gpus} + training "
            f"{cfg.cluster.training_gpus})"
        )
    n_workers = args.gpus // cfg.cluster.tp_size
    if n_workers < 1:
        raise CliError(f"--gpus {args.gpus} is less than one worker (tp_size={cfg.cluster.tp_size})")
    batches = [int(b) for b in str(args.batch or cfg.workload.batch_size).split(",")]
    hw, wl = profiles(cfg, args.telemetry)
    current = Allocation.parse(args.current, n_workers) if args.current else None
    decisions = [decide(n_workers, b, hw, wl, cfg.policy, current) for b in batches]
    if args.json:
        body: Any = decisions[0].to_dict() if len(decisions) == 1 else [d.to_dict() for d in decisions]
        print(json.dumps(body, indent=2))
    else:
        _print_decisions(cfg, args.gpus, decisions)
    return 0


def _print_decisions(cfg: RunConfig, gpus: int, decisions: Sequence[Decision]) -> None:
    print(f"{cfg.model.name} on {gpus} x {cfg.hardware.name} (tp={cfg.cluster.tp_size}); predicted batch makespan (s)")
    labels = [c.allocation.label for c in decisions[0].candidates]
    print("batch  " + " ".join(f"{lab:>8}" for lab in labels) + "   choice   best-disagg vs coloc")
    for d in decisions:
        cells = [f"{c.makespan_s:7.1f}{'' if c.feasible else '*'}" for c in d.candidates]
        cells = [f"{x:>8}" for x in cells]
        coloc = d.candidates[0].makespan_s
        dis = [c for c in d.candidates[1:] if c.feasible]
        if dis:
            b = min(dis, key=lambda c: c.makespan_s)
            cmp = f"{b.allocation.label} {coloc / b.makespan_s - 1:+.1%}"
        else:
            cmp = "none feasible"
        print(f"{d.batch:5d}  " + " ".join(cells) + f"   {d.target.label:>6}   {cmp}")
    print("(* infeasible: prefill capacity, KV memory or prefix cache; '+x%' = disaggregation faster than colocation)")
    for d in decisions:
        print(f"B={d.batch}: {d.reason}")


# -------------------------------------------------------------------------------------- plan
def _read_json(path: str, what: str) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except OSError as e:
        raise CliError(f"cannot read {what} {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise CliError(f"{what} {path} is not valid JSON: line {e.lineno}, column {e.colno}: {e.msg}") from None


def parse_target(data: Any, n_default: int) -> tuple[Allocation, list[str] | None, int]:
    """Target JSON: ``{"allocation": "2P2D"}`` or ``{"mode": ..., "n_prefill": .., "n_decode": ..,
    "n_colocated": ..}``, optional ``"rollout_gpus": [...]`` and ``"tp_size": k``."""
    if not isinstance(data, dict):
        raise CliError(f"target must be a JSON object, got {type(data).__name__}")
    gpus = data.get("rollout_gpus")
    if gpus is not None and not (isinstance(gpus, list) and all(isinstance(g, str) for g in gpus)):
        raise CliError("target.rollout_gpus must be a list of GPU id strings")
    tp = data.get("tp_size", 1)
    if not isinstance(tp, int) or tp < 1:
        raise CliError(f"target.tp_size must be a positive integer, got {tp!r}")
    try:
        if "allocation" in data:
            return Allocation.parse(str(data["allocation"]), int(data.get("n_colocated", n_default))), gpus, tp
        mode = data.get("mode")
        if mode == "colocated":
            return Allocation.colocated(int(data.get("n_colocated", n_default))), gpus, tp
        if mode == "disaggregated":
            return Allocation.disaggregated(int(data["n_prefill"]), int(data["n_decode"])), gpus, tp
    except (KeyError, TypeError, ValueError, OverflowError) as e:
        raise CliError(f"target: {e}") from None
    raise CliError("target needs 'allocation' (e.g. \"2P2D\" or \"coloc\") or 'mode' colocated|disaggregated")


def default_rollout_gpus(state: ClusterState) -> list[str]:
    """Every GPU rollout may use now: reserved, preemptible, and overlap GPUs that are lent."""
    return sorted(g.gpu_id for g in state.gpus.values() if g.zone is not Zone.OVERLAP or g.lent)


def _plan_cmd(args: argparse.Namespace) -> int:
    state = ClusterState.from_dict(_read_json(args.state, "state"))
    tdata = _read_json(args.target, "target")
    pool_default = default_rollout_gpus(state)
    target, gpus, tp = parse_target(tdata, len(pool_default))
    p = plan(state, target, gpus if gpus is not None else pool_default, tp)
    if args.json:
        print(json.dumps(p.to_dict(), indent=2))
    else:
        print(f"plan to {target.label}: {p.n_changes} worker change(s)")
        for s in p.steps:
            extra = f" ({s.prev_role.value} -> {s.role.value})" if s.prev_role else f" as {s.role.value}"
            print(f"  {s.kind.value:12s} {s.worker_id:24s} gpus={','.join(s.gpus)}{extra}")
    return 0


# -------------------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="pearl", description="PEARL: elastic agentic-RL rollout with adaptive PD execution")
    sub = ap.add_subparsers(dest="command", required=True)
    d = sub.add_parser("decide", help="PD decision for a GPU budget (predicted makespan of every candidate)")
    d.add_argument("--config", required=True, help="run config YAML (or a name in configs/)")
    d.add_argument("--gpus", type=int, required=True, help="rollout GPUs available")
    d.add_argument("--batch", help="batch size B, or a comma list (default: workload.batch_size)")
    d.add_argument("--current", help="current allocation: coloc | P:D | 4P4D (enables hysteresis)")
    d.add_argument("--telemetry", help="refit the profiles on telemetry records (JSON lines) first")
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=_decide_cmd)
    p = sub.add_parser("plan", help="minimal-change plan from a state to a target allocation")
    p.add_argument("--state", required=True, help="GPU-worker-role state JSON (ClusterState.to_dict shape)")
    p.add_argument("--target", required=True, help='target JSON, e.g. {"allocation": "2P2D"}')
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_plan_cmd)
    for module, func in _PLUGINS:
        if importlib.util.find_spec(module) is None:
            continue
        fn = getattr(importlib.import_module(module), func, None)
        if fn is not None:
            fn(sub)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        rc = args.func(args)
        return int(rc or 0)
    except (CliError, ConfigError, DecisionError, PlanError, StateError, ProfileError) as e:
        print(f"pearl {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
