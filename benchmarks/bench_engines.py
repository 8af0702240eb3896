"""Real-engine figures on this CPU, side by side in one run (vLLM servers, 1 thread each).

    .venv/bin/python benchmarks/bench_engines.py --telemetry-out runs/bench/telemetry.jsonl

Measures, in order, with two servers bound to cores 0 and 1:

1. start-to-ready of two colocated tiny-Qwen3 servers (launched together);
2. throughput of a multi-turn workload at each concurrency C (C trajectories, ``--turns`` turns,
   ``--max-new`` output tokens per turn, ``--obs`` new observation tokens between turns), first on
   the 2 colocated servers (trajectory i sticks to server i mod 2, so its prefix stays cached), then
   on 1P1D (prefill server -> NIXL KV transfer -> decode server); tokens/s = output tokens / wall;
3. role change by relaunch (colocated -> prefill/decode) and its cost;
4. KV transfer time per token: least-squares fit ``transfer_s = a + b * prompt_tokens`` over the
   PD requests (``b`` = seconds per token);
5. resumed requests: a request aborted half-way and continued on the other server; extra prefill
   = the continuation's time to first token, relative to the request's total generation time;
6. weight sync time: disk reload (``collective_rpc reload_weights``) and gloo broadcast, for the
   tiny model and SmolLM2-135M (a SmolLM2 server replaces the second server for this step).

Per-request telemetry (prompt_tokens, cached_tokens, output_tokens, queue_s, prefill_s, transfer_s,
decode_s, decode_concurrency, mode, ...) is written as JSON lines to ``--telemetry-out``; figures
are printed and written as JSON to ``--out``. Speed is measured here, never asserted in tests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from pearl.core.state import Role
from pearl.engines.base import FinishReason, GenerateRequest, GenerateResult, SamplingParams, ServerSpec
from pearl.engines.resume import continuation_request
from pearl.engines.vllm import VllmEngine
from pearl.engines.vllm_server import VllmSettings
from pearl.models import ensure_models


def traj_prompts(rng: random.Random, n: int, prompt_len: int) -> list[list[int]]:
    return [[rng.randrange(100, 40000) for _ in range(prompt_len)] for _ in range(n)]


async def run_workload(eng: VllmEngine, mode: str, conc: int, args: argparse.Namespace,
                       records: list[dict[str, Any]]) -> dict[str, float]:
    """``conc`` trajectories in parallel, each ``args.turns`` sequential turns."""
    rng = random.Random(1000 + conc)
    contexts = traj_prompts(rng, conc, args.prompt)
    out_tokens = 0

    async def trajectory(i: int) -> None:
        nonlocal out_tokens
        ctx = contexts[i]
        for turn in range(args.turns):
            req = GenerateRequest(f"{mode}-{conc}-{i}-{turn}", tuple(ctx),
                                  SamplingParams(max_new_tokens=args.max_new, temperature=0.0))
            if mode == "colocated":
                res = await eng.generate("a" if i % 2 == 0 else "b", req)
            else:
                res = await eng.generate_pd("a", "b", req)
            out_tokens += len(res.output_ids)
            records.append(telemetry(res, f"{mode}-{conc}-{i}", turn, mode, conc))
            ctx = ctx + list(res.output_ids) + [rng.randrange(100, 40000) for _ in range(args.obs)]

    t0 = time.perf_counter()
    await asyncio.gather(*(trajectory(i) for i in range(conc)))
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "output_tokens": out_tokens, "tokens_per_s": out_tokens / wall}


def telemetry(res: GenerateResult, traj: str, turn: int, mode: str, conc: int) -> dict[str, Any]:
    t = res.timings
    return {"traj_id": traj, "turn": turn, "prompt_tokens": res.prompt_tokens, "cached_tokens": res.cached_tokens,
            "output_tokens": len(res.output_ids), "queue_s": t.queue_s, "prefill_s": t.prefill_s,
            "transfer_s": t.transfer_s, "decode_s": t.decode_s, "env_s": 0.0,
            "decode_concurrency": t.decode_concurrency,
            "mode": "disaggregated" if mode == "pd" else "colocated", "worker_id": res.decode_worker_id,
            "batch": conc}


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares ``y = a + b x``; returns (a, b)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0
    return my - b * mx, b


async def resumed_overhead(eng: VllmEngine, n: int, out_len: int) -> list[dict[str, float]]:
    rng = random.Random(7)
    rows = []
    for k in range(n):
        prompt = tuple(rng.randrange(100, 40000) for _ in range(256))
        req = GenerateRequest(f"res-{k}", prompt, SamplingParams(max_new_tokens=out_len, temperature=0.0))
        t0 = time.perf_counter()
        task = asyncio.create_task(eng.generate("a", req))
        # abort early enough that the abort lands before the request ends even on a loaded CPU
        await asyncio.wait_for(eng.wait_tokens(req.rid, out_len // 4), 300)
        await eng.abort("a", req.rid)
        part = await task
        cont = continuation_request(req, [part], attempt=1)
        if cont is None or part.finish_reason is not FinishReason.ABORT:
            print(f"resumed request {k}: not aborted ({part.finish_reason}, {len(part.output_ids)} tokens); "
                  "skipped", flush=True)
            continue
        rest = await eng.generate("b", cont)
        total = time.perf_counter() - t0
        rows.append({"generated_before_abort": len(part.output_ids), "resume_prefill_tokens": len(cont.input_ids),
                     "extra_prefill_s": rest.timings.prefill_s, "total_generation_s": total,
                     "extra_fraction": rest.timings.prefill_s / total})
    return rows


async def kv_probe(eng: VllmEngine, lengths: list[int], reps: int) -> dict[str, Any]:
    """KV hand-off time vs prompt length on an idle 1P1D pair (one request at a time, 2 output
    tokens), so queueing does not pollute it; fit ``transfer_s = a + b * prompt_tokens``."""
    rng = random.Random(11)
    xs: list[float] = []
    ys: list[float] = []
    for n in lengths:
        for k in range(reps):
            prompt = tuple(rng.randrange(100, 40000) for _ in range(n))
            res = await eng.generate_pd("a", "b", GenerateRequest(f"kv-{n}-{k}", prompt, SamplingParams(2, 0.0)))
            xs.append(float(res.prompt_tokens))
            ys.append(res.timings.transfer_s)
    a, b = fit_line(xs, ys)
    means = {n: statistics.fmean(y for x, y in zip(xs, ys, strict=True) if x == n) for n in lengths}
    return {"fixed_s": a, "per_token_s": b, "mean_transfer_s_by_prompt": means}


async def weight_sync(eng: VllmEngine, worker: str, folder: Path, version: int, reps: int) -> dict[str, float]:
    from safetensors.torch import load_file

    state = load_file(str(folder / "model.safetensors"))
    disk, bcast, connect = [], [], []
    for r in range(reps):
        t0 = time.perf_counter()
        await eng.load_weights(worker, str(folder), version + 2 * r)
        disk.append(time.perf_counter() - t0)
        timing = await eng.broadcast_weights([worker], state, version + 2 * r + 1)
        bcast.append(timing.transfer_s)
        connect.append(timing.connect_s)
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    return {"bytes": nbytes, "disk_reload_s": statistics.median(disk), "gloo_broadcast_s": statistics.median(bcast),
            "gloo_connect_s": statistics.median(connect)}


def decision_check(records: list[dict[str, Any]], throughput: dict[int, dict[str, float]],
                   args: argparse.Namespace) -> list[dict[str, Any]]:
    """Refit the predictor on the real telemetry and compare its choice with the measured best.

    Prior: ``HardwareProfile.from_specs(tiny-qwen3, cpu.yaml)``; fit: ``fit_hardware`` on every
    record (alpha=1: the fit replaces the prior) and ``fit_workload`` on the records of each
    concurrency; the workload prior is this benchmark's workload (constant turns, prompt,
    observation and output lengths, no environment time). ``decide(2 workers, batch=C)`` picks
    colocated (2 servers) or 1P1D; the measured best is the mode with more tokens/s at C."""
    import yaml

    from pearl.config import CONFIG_DIR, Distribution, HardwareSpec, ModelSpec, PolicySpec, WorkloadSpec
    from pearl.core.decision import decide
    from pearl.core.profile import HardwareProfile, TelemetryRecord, WorkloadProfile, fit_hardware, fit_workload

    model = ModelSpec(**yaml.safe_load((CONFIG_DIR / "models" / "tiny-qwen3.yaml").read_text()))
    hw = HardwareSpec(**yaml.safe_load((CONFIG_DIR / "hardware" / "cpu.yaml").read_text()))
    fields = set(TelemetryRecord.__dataclass_fields__)
    recs = [TelemetryRecord(**{k: v for k, v in r.items() if k in fields}, final=r["turn"] == args.turns - 1)
            for r in records]
    prior = HardwareProfile.from_specs(model, hw, 1)
    fitted = fit_hardware(prior, recs, alpha=1.0)
    rows = []
    for c, tp in throughput.items():
        spec = WorkloadSpec(batch_size=c, group_size=1, max_trajectory_tokens=args.max_model_len,
                            turns=Distribution(mean=args.turns, cv=0, min=args.turns, max=args.turns),
                            system_prompt_tokens=args.prompt, observation_tokens=Distribution(mean=args.obs, cv=0),
                            response_tokens=Distribution(mean=args.max_new, cv=0),
                            env_step_s=Distribution(mean=0.001, cv=0), prefix_cache_hit=0.9)
        wl_prior = WorkloadProfile.from_spec(spec)
        wl = fit_workload(wl_prior, [r for r, raw in zip(recs, records, strict=True) if raw["batch"] == c], 1.0)
        before = decide(2, c, prior, wl_prior, PolicySpec())
        after = decide(2, c, fitted, wl, PolicySpec())
        best = "1P1D" if tp["pd_tok_s"] > tp["colocated_tok_s"] else "coloc"
        rows.append({"batch": c, "measured_best": best, "measured_ratio_pd_over_coloc": tp["pd_over_coloc"],
                     "prior_choice": before.target.label, "refit_choice": after.target.label,
                     "refit_predicted_makespan_s": after.predicted_makespan_s,
                     "match": (after.target.label == "coloc") == (best == "coloc")})
    return rows


async def smollm2_phase(eng: VllmEngine, smol: Path, args: argparse.Namespace, fig: dict[str, Any]) -> None:
    t2 = time.perf_counter()
    await eng.launch(ServerSpec("s", ("1",), Role.COLOCATED, str(smol)))
    fig.setdefault("start_to_ready_s", {})["smollm2_alone_wall"] = time.perf_counter() - t2
    fig.setdefault("weight_sync", {})["smollm2-135m"] = await weight_sync(eng, "s", smol, 10, args.sync_reps)
    print(f"start-to-ready SmolLM2: {fig['start_to_ready_s']['smollm2_alone_wall']:.1f} s; weight sync "
          f"SmolLM2: {fig['weight_sync']['smollm2-135m']}", flush=True)


async def main(args: argparse.Namespace, fig: dict[str, Any]) -> dict[str, Any]:
    models = ensure_models()
    tiny, smol = models["tiny-qwen3"], models["smollm2-135m"]
    run_dir = Path(args.run_dir)
    eng = VllmEngine(run_dir, VllmSettings(max_model_len=args.max_model_len, kv_cache_gib=1,
                                           start_timeout_s=args.start_timeout))
    records: list[dict[str, Any]] = []
    fig["args"] = vars(args)
    try:
        if args.only == "smollm2":
            await smollm2_phase(eng, smol, args, fig)
            return fig
        t0 = time.perf_counter()
        first = (Role.PREFILL, Role.DECODE) if args.only == "extra" else (Role.COLOCATED, Role.COLOCATED)
        await asyncio.gather(eng.launch(ServerSpec("a", ("0",), first[0], str(tiny))),
                             eng.launch(ServerSpec("b", ("1",), first[1], str(tiny))))
        fig["start_to_ready_s"] = {"tiny_pair_wall": time.perf_counter() - t0, "a": eng.ready_seconds("a"),
                                   "b": eng.ready_seconds("b")}
        print(f"start-to-ready (2 tiny servers together): {fig['start_to_ready_s']}", flush=True)
        if args.only == "extra":  # both servers also serve plain (colocated) requests
            fig["resumed"] = await resumed_overhead(eng, args.resume_reps, args.resume_len)
            print(f"resumed requests: {fig['resumed']}", flush=True)
            fig["kv_probe"] = await kv_probe(eng, args.kv_lengths, 3)
            print(f"KV transfer probe (idle pair): {fig['kv_probe']}", flush=True)
            return fig
        await run_workload(eng, "colocated", 2, args, [])  # warm-up, not recorded
        coloc = {c: await run_workload(eng, "colocated", c, args, records) for c in args.concurrency}
        for c, r in coloc.items():
            print(f"colocated x2  C={c:3d}: {r['tokens_per_s']:8.1f} tok/s ({r['output_tokens']} tokens)", flush=True)
        fig["resumed"] = await resumed_overhead(eng, args.resume_reps, args.resume_len)
        print(f"resumed requests: {fig['resumed']}", flush=True)

        t1 = time.perf_counter()
        await asyncio.gather(eng.set_role("a", Role.PREFILL), eng.set_role("b", Role.DECODE))
        fig["role_change_relaunch_s"] = time.perf_counter() - t1
        print(f"role change coloc -> 1P1D by relaunch (both servers, in parallel): "
              f"{fig['role_change_relaunch_s']:.1f} s", flush=True)
        await run_workload(eng, "pd", 2, args, [])
        pd = {c: await run_workload(eng, "pd", c, args, records) for c in args.concurrency}
        fig["throughput"] = {c: {"colocated_tok_s": coloc[c]["tokens_per_s"], "pd_tok_s": pd[c]["tokens_per_s"],
                                 "pd_over_coloc": pd[c]["tokens_per_s"] / coloc[c]["tokens_per_s"]}
                             for c in args.concurrency}
        for c, r in fig["throughput"].items():
            print(f"C={c:3d}: colocated x2 {r['colocated_tok_s']:8.1f} tok/s | 1P1D {r['pd_tok_s']:8.1f} tok/s | "
                  f"ratio 1P1D/coloc {r['pd_over_coloc']:.2f}", flush=True)
        pdrec = [r for r in records if r["mode"] == "disaggregated"]
        a, b = fit_line([r["prompt_tokens"] for r in pdrec], [r["transfer_s"] for r in pdrec])
        fig["kv_transfer"] = {"fixed_s": a, "per_token_s": b, "mean_transfer_s": statistics.fmean(
            r["transfer_s"] for r in pdrec), "bytes_per_token": 2048}
        print(f"KV transfer under load (fit over the workload's PD requests, includes decode-side queueing): "
              f"{a * 1e3:.2f} ms + {b * 1e6:.2f} us/token (tiny: 2048 B/token)", flush=True)
        fig["kv_probe"] = await kv_probe(eng, args.kv_lengths, 3)
        print(f"KV transfer probe (idle pair): {fig['kv_probe']}", flush=True)

        fig["decision"] = decision_check(records, fig["throughput"], args)
        for row in fig["decision"]:
            print(f"decision C={row['batch']:3d}: measured best {row['measured_best']:5s} "
                  f"(1P1D/coloc {row['measured_ratio_pd_over_coloc']:.2f}) | prior picks {row['prior_choice']} | "
                  f"refit picks {row['refit_choice']} -> {'match' if row['match'] else 'MISS'}", flush=True)
        fig["weight_sync"] = {"tiny-qwen3": await weight_sync(eng, "a", tiny, 10, args.sync_reps)}
        print(f"weight sync tiny: {fig['weight_sync']['tiny-qwen3']}", flush=True)
        await eng.stop("b")
        await smollm2_phase(eng, smol, args, fig)
    finally:
        await eng.close()
        if args.telemetry_out and records:
            out = Path(args.telemetry_out)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text("".join(json.dumps(r) + "\n" for r in records))
    return fig


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[4, 16, 64])
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=256, help="initial prompt tokens per trajectory")
    ap.add_argument("--obs", type=int, default=64, help="observation tokens appended between turns")
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--resume-reps", type=int, default=3)
    ap.add_argument("--resume-len", type=int, default=512)
    ap.add_argument("--sync-reps", type=int, default=3)
    ap.add_argument("--run-dir", default="runs/bench-engines")
    ap.add_argument("--telemetry-out", default="runs/bench-engines/telemetry.jsonl")
    ap.add_argument("--out", default="runs/bench-engines/figures.json")
    ap.add_argument("--only", choices=["all", "extra", "smollm2"], default="all",
                    help="extra: only resumed requests + the idle KV-transfer probe, on a 1P1D pair; "
                         "smollm2: only SmolLM2 start-to-ready + weight sync")
    ap.add_argument("--start-timeout", type=float, default=900.0, help="server start-to-ready limit, s")
    ap.add_argument("--kv-lengths", type=lambda s: [int(x) for x in s.split(",")], default=[128, 512, 1024, 1536])
    return ap.parse_args(argv)


if __name__ == "__main__":
    ns = parse()
    figures: dict[str, Any] = {}
    try:
        asyncio.run(main(ns, figures))
    finally:  # whatever was measured is kept, even if a later phase failed
        Path(ns.out).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.out).write_text(json.dumps(figures, indent=2, default=str) + "\n")
        print(json.dumps(figures, indent=2, default=str))
    sys.exit(0)
