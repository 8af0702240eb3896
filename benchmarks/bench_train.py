"""Training figures on this machine: GRPO step time, weight-sync time, and the smoke-test reward curve.

Run: ``.venv/bin/python benchmarks/bench_train.py`` (``--quick`` for the tiny model only).

1. **Step time** (SmolLM2-135M, the real ``TrainerClient`` with one CPU rank): ``--seqs`` sequences
   of ``--tokens`` tokens (half prompt, half response), ``--steps`` measured updates after one
   warm-up; the breakdown is forward+backward, all-reduce, optimizer, snapshot write, checkpoint.
2. **Weight sync**, side by side as a ratio: (a) snapshot write (measured inside the step) + load of
   that folder by transformers in this process, vs (b) a gloo broadcast of the same weights from
   trainer rank 0 to a receiver in this process (``pearl.train.broadcast``).
3. **Reward curve** of the learning smoke test (toy task, tiny Qwen3; ``pearl.train.toytask``).

Speeds are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pearl.config import TrainSpec  # noqa: E402
from pearl.core.trajectory import Segment, TrajectoryRecord  # noqa: E402
from pearl.train.broadcast import open_group, recv_tensors  # noqa: E402
from pearl.train.client import TrainerClient, free_port  # noqa: E402
from pearl.train.toytask import ToyTask  # noqa: E402


def synthetic_records(n: int, tokens: int, vocab: int, version: int, seed: int) -> list[TrajectoryRecord]:
    rng = random.Random(seed)
    half = tokens // 2
    out = []
    for i in range(n):
        prompt = tuple(rng.randrange(vocab) for _ in range(half))
        resp = tuple(rng.randrange(vocab) for _ in range(tokens - half))
        lps = tuple(-rng.uniform(0.5, 4.0) for _ in resp)
        out.append(TrajectoryRecord(f"b{seed}-{i}", f"g{seed}-{i // 4}",
                                    (Segment(prompt, False), Segment(resp, True, lps, version)),
                                    reward=float(rng.random() < 0.5)))
    return out


async def bench_step_and_sync(model: Path, seqs: int, tokens: int, steps: int, work: Path,
                              micro_batch_tokens: int) -> dict[str, object]:
    from transformers import AutoModelForCausalLM

    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    spec = TrainSpec(learning_rate=1e-6, micro_batch_tokens=micro_batch_tokens)
    rows = []
    async with TrainerClient(model, work, spec, max_staleness=1) as c:
        print(f"[step] {model.name}: {c.setup_info['n_params'] / 1e6:.1f} M params, rank setup "
              f"{c.setup_info['setup_s']:.1f} s; {seqs} x {tokens} tokens, 1 warm-up + {steps} steps")
        for s in range(steps + 1):
            res = await c.train_step(synthetic_records(seqs, tokens, vocab, c.version, s))
            if s:
                rows.append(res.timings)
            print(f"  step {res.step}: " + ", ".join(f"{k}={v:.2f}" for k, v in res.timings.items()))
        snap = Path(res.snapshot.path) if res.snapshot else model
        t0 = time.perf_counter()
        AutoModelForCausalLM.from_pretrained(snap, dtype=torch.bfloat16)
        load_s = time.perf_counter() - t0

        layout = await c.weight_layout()
        port = free_port()
        _, group = await asyncio.gather(c.init_broadcast("127.0.0.1", port, 1),
                                        asyncio.to_thread(open_group, "127.0.0.1", port, 1, 2))

        def receive() -> tuple[float, int]:
            t = time.perf_counter()
            n = sum(v.numel() * v.element_size() for _, v in recv_tensors(group, layout))
            return time.perf_counter() - t, n

        bc_runs = []
        for _ in range(2):
            stats, (recv_s, nbytes) = await asyncio.gather(c.broadcast(), asyncio.to_thread(receive))
            bc_runs.append((float(stats["seconds"]), recv_s, nbytes))
        group.close()

    def med(k: str) -> float:
        return statistics.median(r[k] for r in rows)

    write_s = med("snapshot_s")
    bc_s = min(r[0] for r in bc_runs)
    nbytes = bc_runs[0][2]
    out = {
        "model": model.name, "seqs": seqs, "tokens_per_seq": tokens, "micro_batch_tokens": micro_batch_tokens,
        "step_total_s": med("step_total_s"), "forward_backward_s": med("forward_backward_s"),
        "optimizer_s": med("optimizer_s"), "snapshot_write_s": write_s, "checkpoint_s": med("checkpoint_s"),
        "snapshot_load_s": load_s, "broadcast_s": bc_s, "broadcast_bytes": nbytes,
        "tokens_per_s": seqs * tokens / med("forward_backward_s"),
        "update_cpu_s": med("update_cpu_s"),
    }
    print(f"[step] median step {out['step_total_s']:.2f} s (forward+backward {out['forward_backward_s']:.2f} s, "
          f"optimizer {out['optimizer_s']:.2f} s, snapshot {write_s:.2f} s, checkpoint {out['checkpoint_s']:.2f} s); "
          f"{out['tokens_per_s']:.0f} train tokens/s; update CPU time {out['update_cpu_s']:.1f} CPU-s "
          f"(wall / CPU-s shows the CPU share the rank got)")
    print(f"[sync] snapshot write {write_s:.2f} s + load {load_s:.2f} s = {write_s + load_s:.2f} s; "
          f"gloo broadcast {bc_s:.2f} s ({nbytes / 1e6:.0f} MB, {nbytes / bc_s / 1e9:.2f} GB/s); "
          f"broadcast / (write + load) = {bc_s / (write_s + load_s):.2f}")
    return out


async def reward_curve(model: Path, steps: int, work: Path) -> list[float]:
    from transformers import AutoModelForCausalLM

    spec = TrainSpec(learning_rate=1e-2, checkpoint_every=steps)
    curve: list[float] = []
    t0 = time.perf_counter()
    async with TrainerClient(model, work, spec, max_staleness=0) as c:
        path = model
        for step in range(steps):
            m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
            recs = ToyTask(vocab_size=m.config.vocab_size).rollout(m, c.version, seed=step)
            curve.append(sum(r.reward for r in recs) / len(recs))
            res = await c.train_step(recs)
            assert res.snapshot is not None
            path = Path(res.snapshot.path)
    print(f"[smoke] reward per step ({model.name}, {steps} GRPO steps, {time.perf_counter() - t0:.1f} s): "
          + " ".join(f"{r:.3f}" for r in curve))
    return curve


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=ROOT / ".models")
    ap.add_argument("--seqs", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--micro-batch-tokens", type=int, default=2048, help="padded tokens per forward/backward")
    ap.add_argument("--smoke-steps", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="tiny model for the step figures too")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    big = args.models / ("tiny-qwen3" if args.quick else "smollm2-135m")
    for m in (big, args.models / "tiny-qwen3"):
        if not (m / "model.safetensors").is_file():
            raise SystemExit(f"{m} missing: run `make models` (python -m pearl.models build --out .models)")
    with tempfile.TemporaryDirectory(prefix="pearl-bench-train-") as tmp:
        figures: dict[str, object] = {
            "step": await bench_step_and_sync(big, args.seqs, args.tokens, args.steps, Path(tmp) / "step",
                                              args.micro_batch_tokens)}
        if args.smoke_steps > 0:
            figures["reward_curve"] = await reward_curve(args.models / "tiny-qwen3", args.smoke_steps,
                                                         Path(tmp) / "smoke")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
