"""NIXL progress-thread pacing on a CPU host, side by side in one run (tiny Qwen3, vLLM CPU).

    .venv/bin/python benchmarks/bench_pd_idle.py [--delays 0,1000] [--requests 4] [--tokens 24]

For each ``engine.nixl_progress_delay_us`` value: start a 1P1D pair (prefill on core 0, decode on
core 1), measure each server's CPU use over ``--idle-s`` seconds of idleness (all its processes,
from /proc), then the wall time of ``--requests`` concurrent PD requests (three rounds: the first
includes the NIXL handshake) and of the same requests colocated on the decode server. vLLM's own
setting is 0 (the progress thread spins); PEARL's default is 1000 µs (docs/engines.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import psutil

from pearl.core.state import Role
from pearl.engines.base import GenerateRequest, SamplingParams, ServerSpec
from pearl.engines.vllm import VllmEngine
from pearl.engines.vllm_server import VllmSettings
from pearl.models import ensure_models


def _cpu_s(pid: int) -> float:
    root = psutil.Process(pid)
    total = 0.0
    for p in [root, *root.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


async def one(delay_us: int, a: argparse.Namespace, tiny: Path) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="pd-idle-") as run:
        eng = VllmEngine(run, VllmSettings(max_model_len=1024, kv_cache_gib=1, start_timeout_s=900,
                                           nixl_progress_delay_us=delay_us))
        try:
            await asyncio.gather(eng.launch(ServerSpec("p", ("0",), Role.PREFILL, str(tiny))),
                                 eng.launch(ServerSpec("d", ("1",), Role.DECODE, str(tiny))))
            pids = {w: eng.server(w).proc.pid for w in ("p", "d")}  # type: ignore[union-attr]
            before = {w: _cpu_s(pid) for w, pid in pids.items()}
            await asyncio.sleep(a.idle_s)
            idle = {w: round(100 * (_cpu_s(pid) - before[w]) / a.idle_s, 1) for w, pid in pids.items()}

            def reqs(tag: str) -> list[GenerateRequest]:
                return [GenerateRequest(f"{tag}{i}", tuple(range(100 + 7 * i, 160 + 7 * i)),
                                        SamplingParams(max_new_tokens=a.tokens, temperature=0.0))
                        for i in range(a.requests)]

            pd = []
            for k in range(3):
                t0 = time.perf_counter()
                await asyncio.gather(*(eng.generate_pd("p", "d", r) for r in reqs(f"pd{k}-")))
                pd.append(round(time.perf_counter() - t0, 3))
            t0 = time.perf_counter()
            await asyncio.gather(*(eng.generate("d", r) for r in reqs("co-")))
            coloc = round(time.perf_counter() - t0, 3)
        finally:
            await eng.close()
    return {"delay_us": delay_us, "idle_cpu_pct": idle, "pd_s": pd, "colocated_s": coloc}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--delays", default="0,1000")
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--idle-s", type=float, default=10.0)
    a = ap.parse_args()
    tiny = ensure_models(names=("tiny-qwen3",))["tiny-qwen3"]
    rows = []
    for d in (int(x) for x in a.delays.split(",")):
        row = await one(d, a, tiny)
        rows.append(row)
        print(json.dumps(row), flush=True)
    base = rows[0]
    for r in rows[1:]:
        print(f"delay {r['delay_us']} us vs {base['delay_us']} us: PD after handshake "
              f"{min(base['pd_s'][1:]) / min(r['pd_s'][1:]):.1f}x faster; idle CPU "
              f"{base['idle_cpu_pct']} -> {r['idle_cpu_pct']} (% of a core)")


if __name__ == "__main__":
    asyncio.run(main())
