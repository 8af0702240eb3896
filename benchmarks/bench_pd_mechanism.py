"""Where forced PD loses on few GPUs: each candidate mechanism removed in turn, measured.

For each model, pool size and allocation (colocation and every P:D split), one rollout batch of
the ``paper`` workload on a fixed pool, ``--seeds`` paired workload seeds. Printed per split:
throughput against colocation (``M_coloc / M_split - 1``, paired per seed, then averaged), the
mean seconds per request waiting for a prefill worker (``prefill_queue``), waiting for KV room on
the decode worker (``kv_wait``), in transfer, the prefill pool's busy share (prefill busy s on
prefill workers / (N_P M)) and the decode link's share (KV bytes / (N_D link_bw M)).

Each batch has the trainer's weight update landing ``train.step_time_s`` into it (the
asynchronous steady state, as ``pearl calibrate`` measures). Then the same gap with one candidate
removed (a counterfactual, not a calibration):

* ``no-flush``: no weight update inside the batch - no prefix-cache flush, no re-prefill burst;
* ``no-kv-pressure``: device memory x 8 - every worker's KV pool holds the whole batch (no
  eviction, no retraction, no decode-side KV waits);
* ``no-engine-time``: none of the engine's time beyond the kernels (scheduler, launches);
* ``no-transfer``: link 100x faster;
* ``no-batch-cap``: ``emulator.max_running`` 100000.

The candidate whose removal closes most of the gap is the mechanism. Run:
``python benchmarks/bench_pd_mechanism.py [--models qwen3-8b,qwen3-30b-a3b] [--gpus 4,8] [--seeds 2]
[--batch 64] [--physics host_cpu_factor=2] [--variants ...]`` (``--variants ''``: the split table only).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

from pearl.config import RunConfig
from pearl.engines.emulated import EmulatedEngine
from pearl.engines.emulated_physics import EmulatorPhysics, load_physics
from pearl.sim.presets import load_preset_config
from pearl.sim.simulate import measure_makespan

CONFIGS = {"qwen3-8b": "qwen3-8b-h200", "qwen3-30b-a3b": "qwen3-30b-a3b-h200"}


def _variant(cfg: RunConfig, phys: EmulatorPhysics, name: str) -> tuple[RunConfig, EmulatorPhysics]:
    if name == "no-engine-time":  # outside the physical bounds on purpose: a counterfactual
        return cfg, phys.model_copy(update={"host_cpu_factor": 0.0, "launch_per_layer_s": 0.0})
    if name == "no-kv-pressure":
        hw = cfg.hardware.model_copy(update={"memory_gb": cfg.hardware.memory_gb * 8})
        return cfg.model_copy(update={"hardware": hw}), phys
    if name == "no-transfer":
        hw = cfg.hardware.model_copy(update={"interconnect_gbs": cfg.hardware.interconnect_gbs * 100})
        return cfg.model_copy(update={"hardware": hw}), phys
    if name == "no-batch-cap":
        return cfg.model_copy(update={"emulator": cfg.emulator.model_copy(update={"max_running": 100000})}), phys
    return cfg, phys


def measure(cfg: RunConfig, phys: EmulatorPhysics, n: int, label: str, flush: bool = True) -> dict[str, float]:
    engines: list[EmulatedEngine] = []
    m, _ = measure_makespan(cfg, n, label, 1, physics=phys, engines=engines,
                            sync_at_s=cfg.train.step_time_s if flush else None)
    eng = engines[0]
    sp = eng.request_split()
    busy = eng.worker_busy().values()
    n_p = sum(1 for role, _, _ in busy if role == "prefill")
    n_d = sum(1 for role, _, _ in busy if role == "decode")
    p_busy = sum(p for role, p, _ in busy if role == "prefill")
    req = max(sp["requests"], 1.0)
    return {
        "makespan": m,
        "prefill_queue": sp["prefill_queue_s"] / req,
        "kv_wait": sp["kv_wait_s"] / req,
        "transfer": sp["transfer_s"] / req,
        "prefill_pool_busy": p_busy / (n_p * m) if n_p else 0.0,
        "link_busy": sp["transfer_bytes"] / (n_d * cfg.hardware.interconnect_gbs * 1e9 * m) if n_d else 0.0,
    }


def splits(n: int) -> list[str]:
    return [f"{p}P{n - p}D" for p in range(1, n)]


def run(model: str, n: int, seeds: int, variants: list[str], physics: dict[str, float] | None = None,
        batch: int = 64) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for var in ["as-is", *variants]:
        rows: dict[str, list[dict[str, float]]] = {}
        for s in range(seeds):
            cfg = load_preset_config(CONFIGS[model], "paper", {"workload.seed": s, "workload.batch_size": batch})
            phys = load_physics(cfg.model.name, cfg.hardware.name).engine.model_copy(update=physics or {})
            cfg, phys = _variant(cfg, phys, var)
            for lab in ["coloc", *splits(n)]:
                rows.setdefault(lab, []).append(measure(cfg, phys, n, lab, flush=var != "no-flush"))
        res = {}
        for lab, rs in rows.items():
            gain = statistics.fmean(c["makespan"] / r["makespan"] - 1 for c, r in zip(rows["coloc"], rs, strict=True))
            res[lab] = {"gain": gain, **{k: statistics.fmean(r[k] for r in rs) for k in rs[0]}}
        out[var] = res
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="qwen3-8b,qwen3-30b-a3b")
    ap.add_argument("--gpus", default="4,8")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--variants", default="no-flush,no-kv-pressure,no-engine-time,no-transfer,no-batch-cap")
    ap.add_argument("--physics", default="", help="EmulatorPhysics overrides, e.g. host_cpu_factor=2,moe_floor=0.1")
    ap.add_argument("--batch", type=int, default=64)
    a = ap.parse_args(argv)
    physics = {k: float(v) for k, v in (kv.split("=", 1) for kv in a.physics.split(",") if kv)}
    EmulatorPhysics(**physics)  # bounds
    variants = [v for v in a.variants.split(",") if v]
    for model in a.models.split(","):
        for n in (int(x) for x in a.gpus.split(",")):
            res = run(model, n, a.seeds, variants, physics, a.batch)
            print(f"\n{model}, {n} GPUs, batch {a.batch}, {a.seeds} seeds, physics {physics or 'the file'}: "
                  "throughput vs colocation")
            t = res["as-is"]
            print(f"{'alloc':>6} {'makespan':>9} {'gain':>7} {'pq s':>6} {'kvw s':>6} {'xfer s':>6} "
                  f"{'P busy':>6} {'link':>6} " + " ".join(f"{v:>16}" for v in variants))
            for lab, r in t.items():
                cf = " ".join(f"{100 * res[v][lab]['gain']:+15.1f}%" for v in variants)
                print(f"{lab:>6} {r['makespan']:9.1f} {100 * r['gain']:+6.1f}% {r['prefill_queue']:6.2f} "
                      f"{r['kv_wait']:6.2f} {r['transfer']:6.3f} {r['prefill_pool_busy']:6.2f} "
                      f"{r['link_busy']:6.3f} {cf}")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
