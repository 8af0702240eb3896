"""Forward+backward of the GRPO loss in float32 vs bfloat16 mixed precision, side by side.

Run: ``.venv/bin/python benchmarks/bench_train_dtype.py [--seqs 4 --tokens 1024 --reps 3]``

The same SmolLM2-135M weights (float32 master copy) and the same synthetic batch; the variants are
interleaved rep by rep (this machine is noisy) and the median of each is printed with the ratio
float32 / bfloat16. ``TrainSpec.compute_dtype`` selects the variant in the trainer. Also printed:
the relative difference of the two losses and gradient norms (what mixed precision costs in
accuracy on this batch). Speeds are printed, never asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pearl.train.grpo import token_logprobs  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=ROOT / ".models" / "smollm2-135m")
    ap.add_argument("--seqs", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    model.train()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (args.seqs, args.tokens), generator=g)
    adv = torch.randn(args.seqs, 1, generator=g)

    def run(dtype: str) -> tuple[float, float, float]:
        model.zero_grad(set_to_none=True)
        ctx = (torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bfloat16" else contextlib.nullcontext())
        t0 = time.perf_counter()
        with ctx:
            logits = model(input_ids=ids).logits[:, :-1]
        lp = token_logprobs(logits, ids[:, 1:])
        loss = -(lp * adv).mean()
        loss.backward()
        dt = time.perf_counter() - t0
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9).item()
        return dt, loss.item(), gn

    print(f"{args.model.name}: {args.seqs} x {args.tokens} tokens, {torch.get_num_threads()} threads, "
          f"{args.reps} interleaved reps after a warm-up of each")
    run("float32")
    run("bfloat16")
    res: dict[str, list[tuple[float, float, float]]] = {"float32": [], "bfloat16": []}
    for _ in range(args.reps):
        for d in res:
            res[d].append(run(d))
    med = {d: statistics.median(r[0] for r in rs) for d, rs in res.items()}
    for d in res:
        print(f"  {d:9s} forward+backward median {med[d]:.2f} s "
              f"({args.seqs * args.tokens / med[d]:.0f} tokens/s)")
    l32, g32 = res["float32"][0][1:]
    l16, g16 = res["bfloat16"][0][1:]
    print(f"  float32 / bfloat16 time ratio {med['float32'] / med['bfloat16']:.2f}x; "
          f"loss rel. diff {abs(l16 - l32) / max(abs(l32), 1e-12):.2%}, grad-norm rel. diff "
          f"{abs(g16 - g32) / max(g32, 1e-12):.2%}")


if __name__ == "__main__":
    main()
