"""One-GPU smoke test (``make test-gpu``): what can run on a lent GPU host with torch + CUDA only.

Such a host has torch (CUDA build), no SGLang, no network and no PEARL venv, so this script needs
only torch and PEARL's own modules; the last part also needs transformers and is reported as
skipped without it. It stops itself after ``--budget-s`` (default 420 s, under the 8 minutes a
lent device run gets). Parts, each timed and checked exactly:

1. ``nccl``: a one-rank NCCL group (``FileStore``): ``all_reduce``, ``broadcast``, ``all_gather``,
   ``reduce_scatter`` on CUDA tensors with known results (what NCCL allows on a single GPU);
2. ``fsdp2``: FSDP2 ``fully_shard`` over that one-rank mesh of a small bf16 decoder-shaped model
   (``torch.nn.TransformerEncoderLayer`` x 4), three AdamW steps: the loss falls, parameters stay
   bf16 DTensors;
3. ``offload``: parameters and optimizer state to host memory and back, as
   ``pearl.train.trainer.TrainerRank.offload`` / ``reload`` do: ``torch.cuda.memory_allocated``
   before, after offload and after reload; the freed bytes must be at least the parameter + state
   bytes, and the parameters come back bit-exact;
4. ``trainer``: PEARL's ``TrainerClient`` with ``device="cuda"`` and ``release_when_idle`` on a
   tiny random Qwen3 (built from a config, nothing downloaded), two GRPO steps on
   ``pearl.train.toytask`` records; its offload reply's device bytes are reported.

Output: one JSON object (``{"parts": {name: {...}}, "ok": bool}``) on stdout; exit code 1 if any
part failed. Run: ``make test-gpu`` (= ``python scripts/gpu_smoke.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.distributed as dist


def part_nccl(tmp: Path) -> dict[str, Any]:
    dev = torch.device("cuda", 0)
    dist.init_process_group("nccl", store=dist.FileStore(str(tmp / "nccl-store"), 1), rank=0, world_size=1,
                            device_id=dev)
    x = torch.arange(1 << 20, device=dev, dtype=torch.float32)
    dist.all_reduce(x)
    assert torch.equal(x, torch.arange(1 << 20, device=dev, dtype=torch.float32))
    y = torch.full((1024,), 7.0, device=dev, dtype=torch.bfloat16)
    dist.broadcast(y, 0)
    assert bool((y == 7).all())
    out = [torch.empty(4, device=dev)]
    dist.all_gather(out, torch.ones(4, device=dev))
    assert torch.equal(out[0], torch.ones(4, device=dev))
    rs = torch.empty(8, device=dev)
    dist.reduce_scatter_tensor(rs, torch.arange(8.0, device=dev))
    assert torch.equal(rs, torch.arange(8.0, device=dev))
    torch.cuda.synchronize()
    return {"backend": dist.get_backend(), "nccl_version": ".".join(map(str, torch.cuda.nccl.version()))}


def _model() -> torch.nn.Module:
    layers = [torch.nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True, dtype=torch.bfloat16)
              for _ in range(4)]
    return torch.nn.Sequential(*layers).cuda()


def part_fsdp2(_: Path) -> dict[str, Any]:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    torch.manual_seed(0)
    model = _model()
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(8, 32, 256, device="cuda", dtype=torch.bfloat16)
    target = torch.randn_like(x)
    losses = []
    for _ in range(3):
        loss = torch.nn.functional.mse_loss(model(x).float(), target.float())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss))
    params = list(model.parameters())
    assert all(isinstance(p, DTensor) and p.dtype == torch.bfloat16 for p in params)
    assert losses[-1] < losses[0], losses
    return {"losses": losses, "params": sum(p.numel() for p in params)}


def part_offload(_: Path) -> dict[str, Any]:
    torch.manual_seed(1)
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 16, 256, device="cuda", dtype=torch.bfloat16)).float().sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    state_bytes = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values()
                      if isinstance(t, torch.Tensor) and t.is_cuda)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    ref = [p.detach().cpu().clone() for p in model.parameters()]
    t0 = time.perf_counter()
    model.to("cpu")
    for s in opt.state.values():
        for k, v in s.items():
            if isinstance(v, torch.Tensor):
                s[k] = v.cpu()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    offload_s = time.perf_counter() - t0
    after = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    model.to("cuda")
    for s in opt.state.values():
        for k, v in s.items():
            if isinstance(v, torch.Tensor) and k != "step":
                s[k] = v.cuda()
    torch.cuda.synchronize()
    reload_s = time.perf_counter() - t0
    freed = before - after
    assert freed >= param_bytes + state_bytes, (freed, param_bytes, state_bytes)
    assert all(torch.equal(a.cpu(), b) for a, b in zip(model.parameters(), ref, strict=True))
    return {"allocated_before": before, "allocated_offloaded": after, "freed_bytes": freed,
            "param_bytes": param_bytes, "optimizer_state_bytes": state_bytes, "offload_s": offload_s,
            "reload_s": reload_s, "allocated_reloaded": torch.cuda.memory_allocated()}


def part_trainer(tmp: Path) -> dict[str, Any]:
    try:
        import transformers
    except ImportError:
        return {"skipped": "transformers is not installed on this host"}
    from pearl.config import TrainSpec
    from pearl.train.client import TrainerClient
    from pearl.train.toytask import ToyTask

    cfg = transformers.Qwen3Config(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                   tie_word_embeddings=False, max_position_embeddings=256)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    path = tmp / "tiny-qwen3"
    model.save_pretrained(path)
    spec = TrainSpec(learning_rate=1e-3, micro_batch_tokens=256, param_dtype="bfloat16")
    task = ToyTask(vocab_size=512)

    async def run() -> dict[str, Any]:
        out: dict[str, Any] = {"steps": []}
        async with TrainerClient(path, tmp / "train", spec, max_staleness=4, device="cuda",
                                 release_when_idle=True) as client:
            for step in range(2):
                recs = task.rollout(model, version=step, seed=step)
                res = await client.train_step(recs)
                out["steps"].append({"version": res.version, "timings": res.timings,
                                     "loss": res.metrics.get("loss")})
            assert client.offloaded and out["steps"][-1]["version"] == 2
        return out

    return asyncio.run(run())


PARTS: dict[str, Callable[[Path], dict[str, Any]]] = {
    "nccl": part_nccl, "fsdp2": part_fsdp2, "offload": part_offload, "trainer": part_trainer}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget-s", type=float, default=420.0)
    ap.add_argument("--parts", default=",".join(PARTS))
    args = ap.parse_args()
    report: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda, "parts": {}}
    if not torch.cuda.is_available():
        report.update(ok=False, error="no CUDA device visible to torch")
        print(json.dumps(report, indent=1))
        return 1
    report["device"] = torch.cuda.get_device_name(0)
    t_start = time.monotonic()
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.parts.split(","):
            if time.monotonic() - t_start > args.budget_s:
                report["parts"][name] = {"skipped": f"past the {args.budget_s:.0f} s budget"}
                continue
            t0 = time.perf_counter()
            try:
                res = PARTS[name](Path(tmp))
                res["seconds"] = time.perf_counter() - t0
                res["ok"] = "skipped" not in res
            except Exception as e:  # a failed part is reported, the others still run
                res = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-2000:]}
                ok = False
            report["parts"][name] = res
        if dist.is_initialized():
            dist.destroy_process_group()
    report["ok"] = ok
    print(json.dumps(report, indent=1, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
