"""One trainer rank: a torch.distributed process that applies GRPO updates and publishes weights.

Started by ``pearl.train.client.TrainerClient`` (or by ``torchrun``: the environment is the same)
as ``python -m pearl.train.trainer --model DIR --work-dir DIR --spec JSON [--resume]`` with
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` set.

Life cycle of a rank::

    setup      init the process group (gloo on CPU, NCCL on GPUs) when WORLD_SIZE > 1, load the
               model (and a frozen reference when kl_coef > 0), build AdamW, resume from the
               latest checkpoint if asked; report {"ready": true, "step", "version"}
    serve      one JSON command per stdin line, one JSON reply per line on the original stdout
               (everything printed by libraries goes to stderr = the rank's log file):
                 step        {"step": n, "samples": [...], "denominator": d} -> metrics, timings,
                             and on rank 0 the snapshot ref of version n
                 digest      sha256 of this rank's parameters (replication check)
                 bcast_layout  the wire layout of the weights (pearl.train.broadcast)
                 bcast_init  host the weight-broadcast group as its rank 0 (trainer rank 0 only)
                 bcast       broadcast the current weights to the inference servers
                 offload     release this rank's device memory for a borrowing inference worker
                             (parameters, reference model and optimizer state to host memory,
                             gradients dropped, the CUDA caching allocator emptied)
                 reload      bring them back before the next update (no-ops on a CPU device)
                 shutdown    leave the loop, destroy the process group
    exit

Data parallelism. On CPU every rank holds the full model (replicated) and gradients are summed
with bucketed ``all_reduce`` (DDP-style, explicit). On GPUs (``TrainSpec.fsdp="gpu"``, or on any
device with ``"always"``) the decoder layers and the root are wrapped with FSDP2 ``fully_shard``,
the loss share is scaled by the world size (FSDP2 averages; we want the sum), gradient sync runs only in the last
micro-batch, and ranks pad to the same number of micro-batches (zero-loss dummies). In both cases the loss share of a rank is already divided by the *global*
denominator (``pearl.train.grpo``), so summed gradients equal the single-process gradient.

After every update rank 0 writes a weight snapshot ``v<step>`` for the engines
(``pearl.train.snapshot.write_snapshot``, ``TrainSpec.snapshot_dtype``) and a checkpoint
``checkpoints/step-<n>/trainer.pt`` (model, optimizer, step, RNG) to resume from; version == step
(version 0 is the base model folder). Checkpoints are written to a temporary folder and renamed,
so a crash never leaves a half checkpoint that ``latest_checkpoint`` would pick.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TextIO, cast

import torch
import torch.distributed as dist

from pearl.config import TrainSpec
from pearl.dtypes import choose_dtype, read_cpu_features
from pearl.train.batch import Sample, micro_batches, pad
from pearl.train.grpo import aggregate, token_logprobs, token_terms

CKPT_FILE = "trainer.pt"
#: the per-step sums a rank accumulates over its loss tokens (then all-reduced), in order
_SUMS = ("loss", "clipped", "ratio", "ratio_abs_dev", "kl", "tokens", "dual_clipped", "is_weight", "rejected",
         "truncated", "behav_k3", "behav_k1")
_DT = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class TrainerStepError(RuntimeError):
    """A command could not be executed by a rank; the message says which and why."""


def latest_checkpoint(ckpt_root: Path) -> Path | None:
    """The newest complete checkpoint folder (``step-<n>`` holding ``trainer.pt``), or None."""
    best: tuple[int, Path] | None = None
    for d in ckpt_root.glob("step-*"):
        if not (d / CKPT_FILE).is_file():
            continue
        try:
            n = int(d.name.removeprefix("step-"))
        except ValueError:
            continue
        if best is None or n > best[0]:
            best = (n, d)
    return best[1] if best else None


def _buckets(tensors: list[torch.Tensor], bucket_bytes: int) -> Iterator[list[torch.Tensor]]:
    cur: list[torch.Tensor] = []
    size = 0
    for t in tensors:
        n = t.numel() * t.element_size()
        if cur and size + n > bucket_bytes:
            yield cur
            cur, size = [], 0
        cur.append(t)
        size += n
    if cur:
        yield cur


@dataclass(frozen=True)
class RankConfig:
    model_path: str
    work_dir: str
    spec: TrainSpec
    rank: int = 0
    world_size: int = 1
    device: str = "cpu"
    resume: bool = False


class TrainerRank:
    """The state of one rank (model, optimizer, step) and the commands it executes."""

    def __init__(self, cfg: RankConfig) -> None:
        self.cfg = cfg
        self.spec = cfg.spec
        self.rank = cfg.rank
        self.world_size = cfg.world_size
        self.device = torch.device(cfg.device)
        # auto: probed here when the caller did not resolve it (``pearl run`` resolves it once for the run)
        self.compute_dtype = choose_dtype(self.spec.compute_dtype, read_cpu_features(), self.device.type).dtype
        self.work = Path(cfg.work_dir)
        self.step = 0
        self.sharded = False
        self._bcast: Any = None
        self._layout: list[Any] | None = None
        self.model: Any = None
        self.ref: Any = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.offloaded = False
        self.nonfinite_skipped = 0  # updates refused for a non-finite loss or gradient norm
        self._state_devices: dict[tuple[int, str], torch.device] = {}

    # ---------------------------------------------------------------------------- setup
    def setup(self) -> dict[str, Any]:
        from transformers import AutoModelForCausalLM

        t0 = time.perf_counter()
        torch.manual_seed(self.spec.seed)
        if self.world_size > 1 and not dist.is_initialized():
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            dist.init_process_group(backend, init_method="env://", rank=self.rank,
                                    world_size=self.world_size, timeout=timedelta(hours=6))
        dtype = _DT[self.spec.param_dtype]
        model = AutoModelForCausalLM.from_pretrained(self.cfg.model_path, dtype=dtype)
        if getattr(model.config, "tie_word_embeddings", False):
            raise TrainerStepError(
                f"{self.cfg.model_path} ties embed_tokens and lm_head: engines reloading weights would keep a "
                "stale lm_head; build the untied folder with `python -m pearl.models build`")
        # transformers wraps .to in @wraps(nn.Module.to), whose typed signature drops the bound self
        model.to(self.device)  # type: ignore[arg-type]
        model.train()
        fsdp = self.spec.fsdp == "always" or (self.spec.fsdp == "gpu" and self.device.type == "cuda")
        if fsdp and self.world_size > 1:
            self._fully_shard(model)
        self.model = model
        if self.spec.kl_coef > 0:
            ref = AutoModelForCausalLM.from_pretrained(self.cfg.model_path, dtype=dtype)
            ref = ref.to(self.device)  # type: ignore[arg-type]  # @wraps(nn.Module.to), as above
            ref.eval()
            ref.requires_grad_(False)
            self.ref = ref
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=self.spec.learning_rate, betas=self.spec.adam_betas, weight_decay=self.spec.weight_decay,
            # fused: one kernel over all parameters (7x faster than foreach on CPU); DTensor: foreach
            fused=not self.sharded, foreach=None if not self.sharded else True,
        )
        resumed_from = None
        if self.cfg.resume:
            ck = latest_checkpoint(self.work / "checkpoints")
            if ck is not None:
                self.load_checkpoint(ck)
                resumed_from = str(ck)
        n_params = sum(p.numel() for p in model.parameters())
        return {"ready": True, "step": self.step, "version": self.step, "n_params": n_params,
                "resumed_from": resumed_from, "setup_s": time.perf_counter() - t0}

    def _fully_shard(self, model: Any) -> None:
        """FSDP2: shard each decoder layer, then the root. FSDP2 *averages* gradients over ranks;
        ``train_step`` multiplies the loss share by the world size so the result is the sum. (A
        divide factor of 1 would do the same on NCCL but needs ReduceOp.PREMUL_SUM, which gloo
        lacks.)"""
        from torch.distributed.fsdp import FSDPModule, fully_shard

        layers = getattr(getattr(model, "model", None), "layers", None)
        if layers is None:
            raise TrainerStepError(f"{type(model).__name__} has no model.layers to shard with FSDP2")
        for layer in layers:
            fully_shard(layer)
        fully_shard(model)
        assert isinstance(model, FSDPModule)
        self.sharded = True

    # ----------------------------------------------------------------------------- step
    def train_step(self, step: int, samples: list[Sample], denominator: float) -> dict[str, Any]:
        assert self.model is not None and self.optimizer is not None
        if step != self.step + 1:
            raise TrainerStepError(f"rank {self.rank} is at step {self.step}; asked to run step {step} "
                                   f"(expected {self.step + 1}): client and trainer disagree, restart with resume")
        if self.offloaded:
            raise TrainerStepError(f"rank {self.rank}: step {step} asked while the rank's memory is offloaded "
                                   "(its GPU may still be lent to rollout): send 'reload' first")
        spec = self.spec
        t0 = time.perf_counter()
        c0 = time.process_time()  # CPU seconds of all threads: compute cost independent of CPU contention
        self.optimizer.zero_grad(set_to_none=False)
        acc = torch.zeros(len(_SUMS), dtype=torch.float64)  # sums over this rank's loss tokens (_SUMS)
        peak = torch.zeros(1, dtype=torch.float64)  # max behaviour weight
        mbs: list[list[Sample] | None] = list(micro_batches(samples, spec.micro_batch_tokens))
        if self.sharded:
            # FSDP2 all-gathers in every forward and reduce-scatters in the last backward: every
            # rank must run the same number of micro-batches (padded with zero-loss dummies).
            n = torch.tensor([len(mbs)], device=self.device)
            dist.all_reduce(n, op=dist.ReduceOp.MAX)
            mbs += [None] * (int(n.item()) - len(mbs))
        for i, mb in enumerate(mbs):
            if self.sharded:
                self.model.set_requires_gradient_sync(i == len(mbs) - 1)
            if mb is None:
                dummy = torch.zeros((1, 2), dtype=torch.long, device=self.device)
                (self.model(input_ids=dummy).logits.sum() * 0.0).backward()
                continue
            pb = pad(mb)
            ids = pb.input_ids.to(self.device)
            att = pb.attention_mask.to(self.device)
            mask = pb.loss_mask.to(self.device).bool()
            with self._autocast():
                logits = self.model(input_ids=ids, attention_mask=att).logits[:, :-1]
            lp = token_logprobs(logits, pb.targets.to(self.device))  # float32 whatever the compute dtype
            del logits
            ref_lp = None
            if self.ref is not None:
                with torch.no_grad(), self._autocast():
                    ref_logits = self.ref(input_ids=ids, attention_mask=att).logits[:, :-1]
                ref_lp = token_logprobs(ref_logits, pb.targets.to(self.device))
            terms = token_terms(lp, pb.old_logprobs.to(self.device), pb.advantages.to(self.device),
                                spec.clip_eps_low, spec.clip_eps_high, ref_lp, spec.kl_coef, mask=mask,
                                dual_clip=spec.dual_clip, policy_loss=spec.policy_loss,
                                is_correction=spec.is_correction, is_level=spec.is_level,
                                is_threshold=spec.is_threshold)
            loss = aggregate(terms.loss, mask, spec.loss_agg, denominator)
            # torch's Tensor.backward is unannotated
            (loss * self.world_size if self.sharded else loss).backward()  # type: ignore[no-untyped-call]
            with torch.no_grad():
                lr = terms.log_ratio[mask].double()
                rho = terms.ratio[mask].double()
                acc += torch.stack([
                    loss.detach().double(), terms.clipped.sum().double(), rho.sum(), (rho - 1).abs().sum(),
                    terms.kl[mask].double().sum(), mask.sum().double(), terms.dual_clipped.sum().double(),
                    terms.is_weight[mask].double().sum(), terms.rejected.sum().double(),
                    terms.truncated.sum().double(), (rho - lr - 1).sum(), (-lr).sum(),
                ]).cpu()
                if mask.any():
                    peak = torch.maximum(peak, terms.is_weight[mask].double().max().cpu().reshape(1))
        t_fb = time.perf_counter()
        if self.world_size > 1 and not self.sharded:
            self._all_reduce_grads()
        if self.world_size > 1:
            acc_dev = acc.to(self.device)  # NCCL reduces device tensors only
            dist.all_reduce(acc_dev)
            acc = acc_dev.cpu()
            peak_dev = peak.to(self.device)
            dist.all_reduce(peak_dev, op=dist.ReduceOp.MAX)
            peak = peak_dev.cpu()
        t_ar = time.perf_counter()
        params = [p for p in self.model.parameters() if p.requires_grad]
        norm = torch.nn.utils.clip_grad_norm_(params, spec.max_grad_norm)
        grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        # the loss and the gradient norm are global (all-reduced): every rank takes the same decision
        finite = math.isfinite(float(acc[0].item())) and math.isfinite(grad_norm)
        if finite:
            self.optimizer.step()
            self.step = step
        else:
            # refuse the update: the weights, the optimizer moments and the version stay those of the
            # last good step, so no snapshot of non-finite weights is ever written or served
            self.optimizer.zero_grad(set_to_none=False)
            self.nonfinite_skipped += 1
        t_opt = time.perf_counter()
        tokens = max(acc[5].item(), 1.0)
        sums = dict(zip(_SUMS, acc.tolist(), strict=True))
        out: dict[str, Any] = {
            "step": self.step,
            "version": self.step,
            "skipped": not finite,
            "metrics": {
                "loss": sums["loss"],
                "clip_frac": sums["clipped"] / tokens,
                "ratio_mean": sums["ratio"] / tokens,
                "ratio_abs_dev": sums["ratio_abs_dev"] / tokens,
                "kl": sums["kl"] / tokens,
                "tokens": int(sums["tokens"]),
                "rank_samples": len(samples),
                "grad_norm": grad_norm,
                "dual_clip_frac": sums["dual_clipped"] / tokens,
                "is_weight_mean": sums["is_weight"] / tokens,
                "is_weight_max": float(peak.item()),
                "is_masked_frac": sums["rejected"] / tokens,
                "is_truncated_frac": sums["truncated"] / tokens,
                "behav_kl": sums["behav_k3"] / tokens,
                "behav_kl_k1": sums["behav_k1"] / tokens,
                "nonfinite_skipped": self.nonfinite_skipped,
            },
            "timings": {"forward_backward_s": t_fb - t0, "allreduce_s": t_ar - t_fb, "optimizer_s": t_opt - t_ar,
                        "update_cpu_s": time.process_time() - c0},
        }
        if finite:
            out.update(self._publish(step))
        else:
            out["timings_publish"] = {}
        return out

    def _autocast(self) -> Any:
        """Mixed precision for the forward pass when the compute dtype is bfloat16 (the backward
        follows the forward's dtypes); a no-op context otherwise."""
        import contextlib

        if self.compute_dtype == "float32" or self.spec.param_dtype == self.compute_dtype:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=_DT[self.compute_dtype])

    def _all_reduce_grads(self) -> None:
        """Sum gradients over ranks in flat buckets (one collective per ~bucket instead of per tensor)."""
        assert self.model is not None
        grads = []
        for p in self.model.parameters():
            if not p.requires_grad:
                continue
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        for bucket in _buckets(grads, 32 << 20):
            flat = torch.cat([g.reshape(-1) for g in bucket])
            dist.all_reduce(flat)
            off = 0
            for g in bucket:
                n = g.numel()
                g.copy_(flat[off : off + n].view_as(g))
                off += n

    # ------------------------------------------------------------------ lending the device
    def offload(self) -> dict[str, Any]:
        """Free this rank's device memory while its GPU is lent to rollout (paper Sec. 4.6: the
        training GPUs are idle between updates). Parameters (FSDP2 shards included: ``Module.to``
        moves the DTensor locals), the reference model and every optimizer state tensor move to host
        memory, gradients are dropped (``zero_grad(set_to_none=True)``: the next step recomputes
        them), and the caching allocator returns its blocks. On a CPU device nothing moves."""
        assert self.model is not None and self.optimizer is not None
        t0 = time.perf_counter()
        if self.device.type != "cuda" or self.offloaded:
            return {"offloaded": self.offloaded, "moved_bytes": 0, "seconds": 0.0}
        self.optimizer.zero_grad(set_to_none=True)
        moved = self._move(torch.device("cpu"))
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        self.offloaded = True
        return {"offloaded": True, "moved_bytes": moved, "seconds": time.perf_counter() - t0,
                "device_allocated_bytes": int(torch.cuda.memory_allocated(self.device))}

    def reload(self) -> dict[str, Any]:
        """Undo ``offload`` (before an update): everything back on the rank's device."""
        t0 = time.perf_counter()
        if not self.offloaded:
            return {"offloaded": False, "moved_bytes": 0, "seconds": 0.0}
        moved = self._move(self.device)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.offloaded = False
        return {"offloaded": False, "moved_bytes": moved, "seconds": time.perf_counter() - t0}

    def _move(self, target: torch.device) -> int:
        """Move model, reference model and optimizer state to ``target`` (host on offload, each
        optimizer tensor's own original device on reload: fused AdamW keeps ``step`` on the GPU,
        the foreach variant on the host); returns bytes moved."""
        assert self.model is not None and self.optimizer is not None
        moved: int = sum(p.numel() * p.element_size() for p in self.model.parameters())
        self.model.to(target)
        if self.ref is not None:
            moved += sum(p.numel() * p.element_size() for p in self.ref.parameters())
            self.ref.to(target)
        to_host = target.type == "cpu"
        if to_host:
            self._state_devices = {}
        for i, st in enumerate(self.optimizer.state.values()):
            for k, v in list(st.items()):
                if not isinstance(v, torch.Tensor):
                    continue
                if to_host:
                    self._state_devices[(i, k)] = v.device
                    dest = target
                else:
                    dest = self._state_devices.get((i, k), target)
                if v.device != dest:
                    moved += v.numel() * v.element_size()
                    st[k] = v.to(dest)
        return moved

    # ----------------------------------------------------------------- snapshots, checkpoints
    def _full_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Full (unsharded, CPU) model and optimizer state; collective under FSDP2."""
        assert self.model is not None and self.optimizer is not None
        if self.sharded:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

            opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
            model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=opts)
            # full_state_dict gathers every DTensor shard into a plain tensor; torch types the values as
            # the union of all it can hold (DTensor, ShardedTensor, scalars)
            return cast(dict[str, torch.Tensor], model_sd), optim_sd
        return self.model.state_dict(), self.optimizer.state_dict()

    def _publish(self, step: int) -> dict[str, Any]:
        from pearl.train.snapshot import write_snapshot

        t0 = time.perf_counter()
        model_sd, optim_sd = self._full_state()
        if self.rank != 0:
            return {"timings_publish": {}}
        dt = _DT[self.spec.snapshot_dtype]
        snap_sd = {k: v.detach().to("cpu", dt) if v.is_floating_point() else v for k, v in model_sd.items()}
        ref = write_snapshot(snap_sd, self.work / "snapshots", step, self.cfg.model_path,
                             {"step": step, "producer": "pearl.train", "dtype": self.spec.snapshot_dtype})
        t1 = time.perf_counter()
        if step % self.spec.checkpoint_every == 0:
            self._write_checkpoint(step, model_sd, optim_sd)
        t2 = time.perf_counter()
        return {"snapshot": ref.to_dict(), "timings_publish": {"snapshot_s": t1 - t0, "checkpoint_s": t2 - t1}}

    def _write_checkpoint(self, step: int, model_sd: dict[str, Any], optim_sd: dict[str, Any]) -> None:
        root = self.work / "checkpoints"
        final = root / f"step-{step:06d}"
        tmp = root / f".tmp-step-{step:06d}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        torch.save({"model": model_sd, "optimizer": optim_sd, "step": step,
                    "rng": torch.get_rng_state(), "spec": self.spec.model_dump(mode="json")},
                   tmp / CKPT_FILE)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        done = sorted(d for d in root.glob("step-*") if (d / CKPT_FILE).is_file())
        for old in done[: -self.spec.checkpoint_keep]:
            shutil.rmtree(old, ignore_errors=True)

    def load_checkpoint(self, path: Path) -> None:
        assert self.model is not None and self.optimizer is not None
        state = torch.load(path / CKPT_FILE, map_location="cpu", weights_only=False)
        if self.sharded:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

            set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                           optim_state_dict=state["optimizer"],
                           options=StateDictOptions(full_state_dict=True))
        else:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        self.step = int(state["step"])

    def digest(self) -> str:
        """sha256 over this rank's parameter bytes (names sorted): equal digests = equal weights."""
        assert self.model is not None
        h = hashlib.sha256()
        for name, t in sorted(self.model.state_dict().items()):
            local = t.to_local() if hasattr(t, "to_local") else t
            h.update(name.encode())
            h.update(local.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        return h.hexdigest()

    # -------------------------------------------------------------------------- broadcast
    def _weights(self) -> dict[str, torch.Tensor]:
        assert self.model is not None
        return self._full_state()[0] if self.sharded else self.model.state_dict()

    def bcast_layout(self, per_tensor: bool) -> dict[str, Any]:
        from pearl.train.broadcast import layout_of

        self._layout = layout_of(self._weights(), _DT[self.spec.snapshot_dtype], per_tensor)
        return {"layout": self._layout}

    def bcast_init(self, host: str, port: int, world_size: int, backend: str, group_name: str | None = None,
                   load_format: str | None = None) -> dict[str, Any]:
        from pearl.train.broadcast import open_group

        if self.rank != 0:
            raise TrainerStepError(f"only rank 0 joins the weight group (this is rank {self.rank})")
        t0 = time.perf_counter()
        if self._bcast is not None:
            self._bcast.close()
        self._bcast = open_group(host, port, 0, world_size, backend, group_name=group_name, load_format=load_format)
        return {"init_s": time.perf_counter() - t0}

    def bcast(self) -> dict[str, Any]:
        from pearl.train.broadcast import send_weights

        if self._bcast is None or self._layout is None:
            raise TrainerStepError("no weight group or layout: send bcast_layout and bcast_init first")
        if self.offloaded and self.device.type == "cuda":
            raise TrainerStepError(f"rank {self.rank}: weights are offloaded to host memory (the GPU may be lent to "
                                   "rollout); broadcast before 'offload' or publish through the snapshot instead")
        st = send_weights(self._bcast, self._weights(), self._layout)
        return {"version": self.step, "tensors": st.tensors, "buckets": st.buckets, "bytes": st.bytes,
                "seconds": st.seconds}

    def close(self) -> None:
        if self._bcast is not None:
            self._bcast.close()
            self._bcast = None
        if dist.is_initialized():
            dist.destroy_process_group()


def serve(rank: TrainerRank, inp: TextIO, out: TextIO) -> None:
    """The command loop (see module docstring); an exception becomes an error reply."""

    def reply(obj: dict[str, Any]) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    try:
        reply({"ok": True, **rank.setup()})
    except Exception as e:
        reply({"ok": False, "error": f"setup failed on rank {rank.rank}: {e}", "traceback": traceback.format_exc()})
        return
    for line in inp:
        if not line.strip():
            continue
        msg: dict[str, Any] = {}
        try:
            msg = json.loads(line)
            cmd = msg.get("cmd")
            if cmd == "shutdown":
                reply({"ok": True})
                break
            if cmd == "step":
                samples = [Sample.from_wire(x) for x in msg["samples"]]
                res = rank.train_step(int(msg["step"]), samples, float(msg["denominator"]))
            elif cmd == "digest":
                res = {"digest": rank.digest(), "step": rank.step}
            elif cmd == "bcast_layout":
                res = rank.bcast_layout(bool(msg.get("per_tensor", False)))
            elif cmd == "bcast_init":
                res = rank.bcast_init(msg["host"], int(msg["port"]), int(msg["world_size"]),
                                      msg.get("backend", "gloo"), msg.get("group_name"), msg.get("load_format"))
            elif cmd == "bcast":
                res = rank.bcast()
            elif cmd == "offload":
                res = rank.offload()
            elif cmd == "reload":
                res = rank.reload()
            else:
                raise TrainerStepError(f"unknown command {cmd!r}")
            reply({"ok": True, **res})
        except Exception as e:
            reply({"ok": False, "error": f"rank {rank.rank} {msg.get('cmd')!r}: {type(e).__name__}: {e}",
                   "traceback": traceback.format_exc()})
    rank.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="PEARL trainer rank (started by TrainerClient or torchrun)")
    ap.add_argument("--model", required=True)
    ap.add_argument("--work-dir", required=True)
    ap.add_argument("--spec", default="{}", help="TrainSpec as JSON")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args(argv)
    rank_id = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    device = args.device
    if device == "cuda":
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
        torch.cuda.set_device(device)
    # Replies go to the original stdout; anything libraries print goes to stderr (the log).
    channel = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    cfg = RankConfig(args.model, args.work_dir, TrainSpec.model_validate_json(args.spec), rank_id, world,
                     device, args.resume)
    serve(TrainerRank(cfg), sys.stdin, channel)


if __name__ == "__main__":
    main()
