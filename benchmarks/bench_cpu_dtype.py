"""float32 vs bfloat16 on this CPU, side by side: the demo model's matmuls and its forward+backward.

Run: ``.venv/bin/python benchmarks/bench_cpu_dtype.py [--threads 1 --reps 5 --no-train]``

What ``auto`` (``pearl/dtypes.py``) decides on this machine, then, with ``--threads`` torch threads
(a server runs on one, ``engine.threads_per_server``):

* the matmuls of one SmolLM2-135M layer and its LM head (hidden 576, MLP 1536, vocab 49152) at a
  decode batch of 8 tokens and a prefill of 512 tokens: median time of each in float32 and in
  bfloat16 (both operands bf16, as vLLM's ``--dtype bfloat16`` runs them);
* the forward+backward of the GRPO loss on the model (float32 master weights; bfloat16 = autocast,
  as ``train.compute_dtype: bfloat16``), ``--seqs`` x ``--tokens``.

Variants are interleaved rep by rep (the machine is shared and noisy); every line prints both
medians and the ratio bf16 / fp32 (above 1: bf16 is slower). Speeds are printed, never asserted.
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

from pearl.dtypes import choose_dtype, read_cpu_features  # noqa: E402

#: (name, m, k, n): an m x k by k x n matmul of SmolLM2-135M
SHAPES = (
    ("decode 8 tok, MLP up", 8, 576, 1536),
    ("decode 8 tok, MLP down", 8, 1536, 576),
    ("decode 8 tok, LM head", 8, 576, 49152),
    ("prefill 512 tok, MLP up", 512, 576, 1536),
    ("prefill 512 tok, LM head", 512, 576, 49152),
)


def _median_s(fn: object, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_matmuls(reps: int) -> None:
    g = torch.Generator().manual_seed(0)
    print(f"{'matmul':28s} {'fp32 ms':>9s} {'bf16 ms':>9s} {'bf16/fp32':>10s}")
    for name, m, k, n in SHAPES:
        a32, b32 = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
        a16, b16 = a32.bfloat16(), b32.bfloat16()
        inner = max(1, int(2e8 // (m * k * n)))  # ~0.2 GFLOP per timed call: small shapes are repeated

        def f32(a: torch.Tensor = a32, b: torch.Tensor = b32, r: int = inner) -> None:
            for _ in range(r):
                torch.mm(a, b)

        def f16(a: torch.Tensor = a16, b: torch.Tensor = b16, r: int = inner) -> None:
            for _ in range(r):
                torch.mm(a, b)

        f32(), f16()  # warm-up
        t32: list[float] = []
        t16: list[float] = []
        for _ in range(reps):  # interleaved
            t32.append(_median_s(f32, 1) / inner)
            t16.append(_median_s(f16, 1) / inner)
        m32, m16 = statistics.median(t32), statistics.median(t16)
        print(f"{name:28s} {m32 * 1e3:9.3f} {m16 * 1e3:9.3f} {m16 / m32:9.2f}x")


def bench_train(model_dir: Path, seqs: int, tokens: int, reps: int) -> None:
    from transformers import AutoModelForCausalLM

    from pearl.train.grpo import token_logprobs

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (seqs, tokens), generator=g)
    adv = torch.randn(seqs, 1, generator=g)

    def step(dtype: str) -> None:
        model.zero_grad(set_to_none=True)
        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bfloat16" else contextlib.nullcontext()
        with ctx:
            logits = model(input_ids=ids).logits[:, :-1]
        (-(token_logprobs(logits, ids[:, 1:]) * adv).mean()).backward()

    step("float32"), step("bfloat16")
    res: dict[str, list[float]] = {"float32": [], "bfloat16": []}
    for _ in range(reps):
        for d in res:
            res[d].append(_median_s(lambda d=d: step(d), 1))
    m32, m16 = statistics.median(res["float32"]), statistics.median(res["bfloat16"])
    print(f"{'forward+backward ' + f'{seqs}x{tokens}':28s} {m32 * 1e3:9.0f} {m16 * 1e3:9.0f} {m16 / m32:9.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--model", type=Path, default=ROOT / ".models" / "smollm2-135m")
    ap.add_argument("--seqs", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--no-train", action="store_true", help="matmuls only")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    feats = read_cpu_features()
    choice = choose_dtype("auto", feats)
    print(f"torch {torch.__version__}, capability {feats.capability}, {args.threads} thread(s), {args.reps} "
          f"interleaved reps; dtype auto -> {choice.dtype} ({choice.reason})")
    bench_matmuls(args.reps)
    if not args.no_train:
        if (args.model / "config.json").is_file():
            bench_train(args.model, args.seqs, args.tokens, max(1, args.reps // 2))
        else:
            print(f"(forward+backward skipped: no model in {args.model}; `python -m pearl.models build`)")


if __name__ == "__main__":
    main()
