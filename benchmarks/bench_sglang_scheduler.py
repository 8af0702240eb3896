"""SGLang 0.5.23's scheduler CPU time per iteration, measured from its own code on this CPU.

    .venv/bin/python benchmarks/bench_sglang_scheduler.py [--reps 5] [--json] [--out FILE]
        [--write configs/emulator/sglang-scheduler.yaml]

What runs is SGLang's own Python (the pinned wheel in ``.sglang``, imported in a child process as
the contract tests do: ``tests/contract/sglang_env.py``), on real ``Req`` objects and a real
``RadixCache``; nothing of it is re-implemented here:

* **a decode iteration of n requests** (``process_batch_result_decode``'s per-request body,
  ``managers/scheduler_components/batch_result_processor.py``): ``time_stats.
  set_last_decode_finish_time``, ``output_ids.extend``, ``Req.update_finish_state`` (the vocab,
  stop-string, EOS / stop-token and length checks, ``managers/schedule_batch.py``) and, as RL
  clients ask for log-probabilities, ``_apply_decode_logprobs``' two appends; then the batch's
  own per-step work that does not need a GPU: ``ScheduleBatch._get_decode_retraction_order``-free
  bookkeeping is not included (it runs only when the pool is full);
* **an extend batch of m requests with X new tokens over c cached**: per request, the radix
  cache's ``match_prefix`` of its c + X tokens and, at the end of its prefill, ``insert`` of them
  (``mem_cache/radix_cache.py``; the tree's KV allocator is the narrow seam faked, as in
  ``tests/contract/sglang_radix.py``: a counter of freed indices), plus ``Req``'s
  ``init_next_round_input``-free part: ``update_finish_state`` of its first token.

Not included, because they need a GPU or another process: tensor preparation
(``prepare_for_decode`` / ``prepare_for_extend``), the CUDA graph launch, and the ZMQ hand-off to
the detokenizer. The figures are therefore the part of SGLang's per-iteration CPU time that grows
with the batch; the emulator scales them to the GPU host's CPU by ``EmulatorPhysics.
host_cpu_factor`` (``pearl/engines/emulated_overheads.py``).

Fitted (least squares over the measured points): ``t_dec(n) = a_dec + b_dec n`` and
``t_ext(m, T) = a_ext + b_ext m + c_ext T`` with ``T = sum (c_i + x_i)`` the prompt tokens the tree
walks (SGLang's radix tree compares token lists in Python: its cost is per token of the prompt,
cached or new). ``--write`` records the points, the fit, the CPU model
and this command in the YAML the emulator reads.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DECODE_N = (1, 2, 4, 8, 16, 32, 64, 128, 256)
#: (requests m, new tokens per request x, cached tokens per request c)
EXTEND = ((1, 512, 0), (1, 2048, 16384), (1, 8192, 0), (4, 1024, 8192), (8, 1024, 16384), (16, 512, 20000),
          (2, 4096, 24000), (32, 256, 24000))


def _child(reps: int) -> dict[str, Any]:
    """In the child: measure with SGLang's own code (module docstring)."""
    import statistics
    import warnings

    sys.path.insert(0, str(ROOT))
    from tests.contract.sglang_env import MISSING, use_sglang

    if not use_sglang():
        raise SystemExit(MISSING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.mem_cache import radix_cache as rc
        from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
        from sglang.srt.runtime_context import publish
        from sglang.srt.sampling.sampling_params import SamplingParams
        from sglang.srt.server_args import prepare_server_args

        server_args = prepare_server_args(["--model-path", str(ROOT / ".models" / "tiny-qwen3"), "--device", "cpu"])
        publish(server_args, role="scheduler")

    class _Allocator:  # the tree's KV pool: ``free_segment`` releases indices (counted)
        device = "cpu"
        freed = 0

        def free_segment(self, value: Any, start_pos: int = 0) -> None:
            self.freed += len(value) - start_pos

    def request(i: int, prompt: int) -> Any:
        sp = SamplingParams(max_new_tokens=1 << 20, stop_token_ids=[151643, 151645])
        sp.normalize(None)
        return Req(f"r{i}", "", list(range(prompt)), sp, return_logprob=True, eos_token_ids={151645},
                   vocab_size=151936)

    decode: dict[int, float] = {}
    for n in DECODE_N:
        reqs = [request(i, 20000) for i in range(n)]
        steps = max(20, 4000 // n)
        best = []
        for _ in range(reps):
            t0 = time.process_time()
            for s in range(steps):
                tok = 1000 + s
                for req in reqs:  # process_batch_result_decode's body for a plain request with logprobs
                    req.time_stats.set_last_decode_finish_time()
                    req.output_ids.extend([tok])
                    req.update_finish_state(1)
                    req.logprob.output_token_logprobs_val.append(-0.5)
                    req.logprob.output_token_logprobs_idx.append(tok)
            best.append((time.process_time() - t0) / steps)
            for req in reqs:
                assert not req.finished(), req.finished_reason  # a stop token never came: nothing finished
        decode[n] = statistics.median(best)
    # EOS is what stops a response: SGLang's own finish check on the tokenizer's EOS id
    probe = request(0, 10)
    probe.output_ids.extend([151645])
    probe.update_finish_state(1)
    assert probe.finished(), "SGLang's finish check did not stop on EOS"

    extend: list[tuple[int, int, int, float]] = []
    for m, x, c in EXTEND:
        best = []
        for r in range(reps):
            tree = rc.RadixCache.create_simulated(mock_allocator=_Allocator())
            prompts = [list(range(1_000_000 * (i + 1) + r, 1_000_000 * (i + 1) + r + c + x)) for i in range(m)]
            for ids in prompts:  # their c cached tokens are in the tree, as a conversation's earlier turns are
                if c:
                    tree.insert(InsertParams(key=rc.RadixKey(token_ids=ids[:c])))
            reqs = [request(i, c + x) for i in range(m)]
            t0 = time.process_time()
            for ids, req in zip(prompts, reqs, strict=True):
                got = tree.match_prefix(MatchPrefixParams(key=rc.RadixKey(token_ids=ids)))
                assert got.device_prefix_len == c
                tree.insert(InsertParams(key=rc.RadixKey(token_ids=ids)))
                req.output_ids.extend([7])
                req.update_finish_state(1)
            best.append(time.process_time() - t0)
            assert tree.evictable_size() == m * (c + x)
        extend.append((m, x, c, statistics.median(best)))
    return {"decode": {str(n): t for n, t in decode.items()}, "extend": extend}


def _fit(data: dict[str, Any]) -> dict[str, dict[str, float]]:
    import numpy as np

    n = np.array([float(k) for k in data["decode"]])
    t = np.array(list(data["decode"].values()))
    (b_dec, a_dec) = np.polyfit(n, t, 1)
    rows = np.array([[1.0, m, (x + c) * m] for m, x, c, _t in data["extend"]])
    y = np.array([tt for *_r, tt in data["extend"]])
    (a_ext, b_ext, c_ext), *_ = np.linalg.lstsq(rows, y, rcond=None)
    clamp = lambda v: float(max(v, 0.0))  # noqa: E731 - a negative intercept is noise: no time is negative
    return {"decode": {"a": clamp(a_dec), "b": clamp(b_dec)},
            "extend": {"a": clamp(a_ext), "b": clamp(b_ext), "c": clamp(c_ext)}}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=5, help="repetitions per point (the median is kept)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    ap.add_argument("--write", default=None, help="write the points and the fit to this YAML (the emulator's file)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(_child(a.reps)))
        return
    run = subprocess.run([sys.executable, __file__, "--child", "--reps", str(a.reps)], cwd=ROOT,
                         capture_output=True, text=True, timeout=1800)
    if run.returncode != 0:
        raise SystemExit(f"the measurement failed:\n{run.stderr[-3000:]}")
    data = json.loads(run.stdout.strip().splitlines()[-1])
    fit = _fit(data)
    cmd = "python benchmarks/bench_sglang_scheduler.py " + " ".join(sys.argv[1:])
    out = {"cpu": _cpu_model(), "command": cmd.strip(), "sglang": "0.5.23", **data, "fit": fit}
    if a.json:
        print(json.dumps(out))
    else:
        print(f"SGLang 0.5.23 scheduler CPU on {out['cpu']} (median of {a.reps})")
        print("decode batch n | s per iteration | us per request")
        for k, v in data["decode"].items():
            print(f"{int(k):14d} | {v * 1e3:9.3f} ms    | {v / int(k) * 1e6:7.2f}")
        print("extend m x new over cached | s per batch")
        for m, x, c, t in data["extend"]:
            print(f"{m:3d} x {x:5d} over {c:5d} | {t * 1e3:9.3f} ms")
        print(f"fit: t_dec(n) = {fit['decode']['a'] * 1e6:.1f} us + {fit['decode']['b'] * 1e6:.2f} us n; "
              f"t_ext(m, T) = {fit['extend']['a'] * 1e6:.1f} us + {fit['extend']['b'] * 1e6:.1f} us m + "
              f"{fit['extend']['c'] * 1e9:.1f} ns T")
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))
    if a.write:
        import yaml

        head = ("# SGLang 0.5.23's scheduler CPU seconds per iteration, measured from its own code "
                "(benchmarks/bench_sglang_scheduler.py; what is and is not included: its docstring).\n"
                "# Read by pearl/engines/emulated_overheads.py (fit), scaled by EmulatorPhysics.host_cpu_factor.\n")
        Path(a.write).write_text(head + yaml.safe_dump(out, sort_keys=False))


if __name__ == "__main__":
    main()
