"""``python -m pearl costs``: the emulator's cost surface for a config, beside the database's own.

For the config's model, hardware, TP and ``emulator.costs`` the command prints, on a fixed grid:

* decode iteration ms, ``n`` sequences of ``s`` context tokens each (``DECODE_N`` x ``DECODE_S``,
  only where ``n s`` fits the worker's KV pool);
* prefill ms of one request of ``x`` new tokens over ``c`` cached ones (``PREFILL_X`` x ``PREFILL_C``);
* the KV pool in tokens, ``H_max = (tp memory u - W) / kv``.

With ``--compare`` each cell also holds the aiconfigurator database's answer to the same question,
asked directly (``decode_step_latency(n, s, 2)``, ``predict_prefill_latency(1, x + c, c)``) and the
ratio emulator / database: the emulator's interpolation error for ``costs: database``, its
departure from the measured kernels for ``costs: datasheet``. ``--json`` prints one object
(``{"config", "costs", "kv_capacity_tokens", "decode": [...], "prefill": [...], "range": {...}}``);
``--list`` prints the database's systems, backends, versions and models.

Exit codes: 0, 2 for bad input (a config, a model or system the database lacks: the message names
what it has).
"""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any

from pearl.config import ConfigError, RunConfig, load_config

DECODE_N = (1, 4, 16, 64, 128)
DECODE_S = (2048, 8192, 16384, 32768)
PREFILL_X = (256, 1024, 4096, 8192)
PREFILL_C = (0, 4096, 16384, 24576)


def _database_handle(cfg: RunConfig) -> Any:
    from pearl.engines.emulated_tables import _handle, resolve_model_id, table_key

    key = table_key(resolve_model_id(cfg.model.name, cfg.emulator.database_model),
                    cfg.hardware.database_system or cfg.hardware.name, cfg.emulator.backend,
                    cfg.emulator.backend_version, cfg.cluster.tp_size)
    return _handle(key)[0]


def cost_surface(cfg: RunConfig, compare: bool = False) -> dict[str, Any]:
    """The grid of the module docstring for ``cfg`` (with the physics file of its model and hardware)."""
    from pearl.engines.emulated import EmulatedEngine
    from pearl.engines.emulated_costs import worker_costs

    physics = EmulatedEngine.emulator_physics(cfg)
    costs = worker_costs(cfg.model, cfg.hardware, cfg.emulator, cfg.cluster.tp_size, physics)
    db = _database_handle(cfg) if compare else None
    cap = costs.kv_capacity_tokens
    decode, prefill = [], []
    for n in DECODE_N:
        for s in DECODE_S:
            if n * s > cap:
                continue
            row: dict[str, Any] = {"n": n, "s": s, "emulator_ms": costs.decode_step_s(n, float(n * s)) * 1e3}
            if db is not None:
                row["database_ms"] = db.decode_step_latency(n, s, 2)
                row["ratio"] = row["emulator_ms"] / row["database_ms"]
            decode.append(row)
    for x in PREFILL_X:
        for c in PREFILL_C:
            row = {"x": x, "c": c, "emulator_ms": costs.prefill_chunk_s([(x, c)]) * 1e3}
            if db is not None:
                row["database_ms"] = db.predict_prefill_latency(1, x + c, c)
                row["ratio"] = row["emulator_ms"] / row["database_ms"]
            prefill.append(row)
    out: dict[str, Any] = {"config": cfg.name, "model": cfg.model.name, "hardware": cfg.hardware.name,
                           "tp": cfg.cluster.tp_size, "costs": cfg.emulator.costs, "kv_capacity_tokens": cap,
                           "decode": decode, "prefill": prefill}
    if db is not None:
        out["range"] = {k: [min(r["ratio"] for r in rows), max(r["ratio"] for r in rows)]
                        for k, rows in (("decode", decode), ("prefill", prefill))}
    return out


def format_surface(s: dict[str, Any]) -> str:
    cmp = "range" in s
    head = f"{s['config']}: {s['model']} on {s['hardware']} x tp {s['tp']}, costs: {s['costs']}, " \
           f"KV pool {s['kv_capacity_tokens']:,} tokens"
    lines = [head, "", "decode iteration (ms)" + ("  emulator / database = ratio" if cmp else "")]
    for r in s["decode"]:
        cell = f"  n={r['n']:>4} s={r['s']:>6}  {r['emulator_ms']:8.2f}"
        if cmp:
            cell += f"  / {r['database_ms']:8.2f} = {r['ratio']:.3f}"
        lines.append(cell)
    lines += ["", "prefill, one request (ms)" + ("  emulator / database = ratio" if cmp else "")]
    for r in s["prefill"]:
        cell = f"  x={r['x']:>6} c={r['c']:>6}  {r['emulator_ms']:8.2f}"
        if cmp:
            cell += f"  / {r['database_ms']:8.2f} = {r['ratio']:.3f}"
        lines.append(cell)
    if cmp:
        d, p = s["range"]["decode"], s["range"]["prefill"]
        lines += ["", f"ratio range: decode {d[0]:.3f}-{d[1]:.3f}, prefill {p[0]:.3f}-{p[1]:.3f}"]
    return "\n".join(lines)


def add_costs_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "costs", help="print the emulator's cost surface (decode / prefill ms, KV pool) for a config")
    p.add_argument("--config", default="qwen3-8b-h200", help="run config (name in configs/ or a path)")
    p.add_argument("--costs", choices=["database", "datasheet"], default=None,
                   help="override emulator.costs (default: the config's)")
    p.add_argument("--compare", action="store_true", help="also ask the database directly, with ratios")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("--list", action="store_true", help="the database's systems, backends, versions, models")
    p.set_defaults(func=costs_main)
    return p


def costs_main(args: argparse.Namespace) -> int:
    from pearl.engines.emulated_tables import CostDatabaseError, database_catalog, database_models

    logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
    try:
        if args.list:
            out: dict[str, Any] = {"systems": database_catalog(), "models": database_models()}
            print(json.dumps(out, indent=1) if args.json else "\n".join(
                [f"{s}: " + "; ".join(f"{b} {', '.join(v)}" for b, v in bk.items()) for s, bk in
                 out["systems"].items()] + ["models: " + ", ".join(out["models"])]))
            return 0
        overrides = {"emulator.costs": args.costs} if args.costs else None
        cfg = load_config(args.config, overrides)
        surface = cost_surface(cfg, compare=args.compare)
    except (ConfigError, CostDatabaseError, ValueError) as e:
        print(f"error: {e}")
        return 2
    print(json.dumps(surface, indent=1) if args.json else format_surface(surface))
    return 0
