"""TrainerClient with real rank processes: 2-rank gloo replication, events, staleness, broadcast."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from pearl.config import TrainSpec
from pearl.core.events import TrainingFinished, TrainingStarted
from pearl.core.trajectory import TrajectoryRecord
from pearl.train.batch import BatchError
from pearl.train.client import TrainerClient, TrainerError, free_port
from pearl.train.toytask import ToyTask

SPEC = TrainSpec(learning_rate=1e-3, micro_batch_tokens=64)


def records(micro_model: Path, version: int, seed: int) -> list[TrajectoryRecord]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(micro_model, dtype=torch.float32)
    return ToyTask(vocab_size=512, n_groups=3, group_size=4).rollout(model, version, seed)


def checkpoint_model(work: Path, step: int) -> dict[str, torch.Tensor]:
    ck = torch.load(work / "checkpoints" / f"step-{step:06d}" / "trainer.pt", map_location="cpu")
    return ck["model"]


def stale(recs: list[TrajectoryRecord], shift: float = 0.3) -> list[TrajectoryRecord]:
    """Every other record's behaviour logprobs lowered by ``shift``: off-policy, so the loss is far from 0."""
    from dataclasses import replace

    out = []
    for i, r in enumerate(recs):
        d = shift if i % 2 else 0.0
        out.append(replace(r, segments=tuple(
            replace(s, logprobs=tuple(x - d for x in s.logprobs)) if s.trained else s for s in r.segments)))
    return out


async def test_two_gloo_ranks_stay_identical_and_match_one_rank(micro_model: Path, tmp_path: Path) -> None:
    recs = stale(records(micro_model, 0, seed=5))
    events: list[object] = []

    async def sink(ev: TrainingStarted | TrainingFinished) -> None:
        events.append(ev)

    two = TrainerClient(micro_model, tmp_path / "two", SPEC.model_copy(update={"world_size": 2}),
                        max_staleness=1, on_event=sink, threads_per_rank=1)
    one = TrainerClient(micro_model, tmp_path / "one", SPEC, max_staleness=1, threads_per_rank=1)
    await asyncio.gather(two.start(), one.start())
    try:
        res2, res1 = await asyncio.gather(two.train_step(recs), one.train_step(recs))
        d = await two.digests()
        assert len(d) == 2 and d[0] == d[1]  # bitwise-identical replicas after the all-reduce
        assert res2.version == res1.version == 1 == two.version
        # off-policy records: |loss| > 0.01, a sum of +-1 terms (float32 summation order: ~1e-6
        # relative), so a wrong denominator (doubled, per rank) fails
        assert abs(res1.metrics["loss"]) > 1e-2
        assert res2.metrics["loss"] == pytest.approx(res1.metrics["loss"], rel=1e-5)
        assert res2.metrics["ratio_mean"] == pytest.approx(res1.metrics["ratio_mean"], rel=1e-6)
        assert res2.metrics["tokens"] == res1.metrics["tokens"] == 12 * 8
        # the gradient norm catches a wrong scale (Adam's first step would hide one in the weights)
        assert res2.metrics["grad_norm"] == pytest.approx(res1.metrics["grad_norm"], rel=1e-5)
        w2, w1 = checkpoint_model(tmp_path / "two", 1), checkpoint_model(tmp_path / "one", 1)
        # Summed gradients = the global loss's gradient: the 2-rank update equals the 1-rank update
        # up to float summation order. Adam's first step moves each weight by ~lr = 1e-3; we allow 1% of it.
        from safetensors.torch import load_file

        w0 = load_file(str(micro_model / "model.safetensors"))
        moved = 0
        for k in w1:
            torch.testing.assert_close(w2[k], w1[k], rtol=0, atol=1e-5)
            moved += int(((w1[k] - w0[k]).abs() > 5e-4).sum())
        assert moved > 10_000
        assert [type(e) for e in events] == [TrainingStarted, TrainingFinished]
        assert events[0] == TrainingStarted(step=1, event_id="train-start-1")
        fin = events[1]
        assert isinstance(fin, TrainingFinished) and fin.weight_version == 1 and fin.expected_idle_s is None
        assert {"forward_backward_s", "allreduce_s", "snapshot_s", "checkpoint_s", "gpu_return_wait_s"} <= set(
            res2.timings)

        # The same records again: consumed by the update, never trained twice.
        again = await two.train_step(recs)
        assert not again.updated and again.report.dropped_consumed == len(recs)

        # Staleness: version-0 records at trainer version 1 with max_staleness=0 -> all dropped, no update.
        recs = records(micro_model, 0, seed=8)
        two.max_staleness = 0
        skipped = await two.train_step(recs)
        assert not skipped.updated and skipped.version == 1
        assert skipped.report.dropped_stale == len(recs) and skipped.report.kept == 0
        assert len(events) == 2  # no training happened, no notification

        # A record from a version the trainer never produced: a clear error, the trainer stays usable.
        with pytest.raises(BatchError, match="policy_version 9 > trainer version 1"):
            await two.train_step(records(micro_model, 9, seed=6))

        two.max_staleness = 1  # lag 1 is within the bound: trained, and the idle gap is now known
        res = await two.train_step(recs)
        assert res.version == 2 and res.report.kept == len(recs)
        assert isinstance(events[-1], TrainingFinished) and events[-1].expected_idle_s is not None
    finally:
        await asyncio.gather(two.close(), one.close())


async def test_training_waits_for_borrowed_gpus(micro_model: Path, tmp_path: Path) -> None:
    """TrainingStarted is awaited before the ranks get the step: the toggle manager's return of
    borrowed GPUs delays the update (and is timed), never overlaps it."""
    returned = asyncio.Event()
    started = asyncio.Event()
    order: list[str] = []

    async def sink(ev: TrainingStarted | TrainingFinished) -> None:
        if isinstance(ev, TrainingStarted):
            order.append("started")
            started.set()
            await returned.wait()
            order.append("gpus back")
        else:
            order.append("finished")

    async with TrainerClient(micro_model, tmp_path, SPEC, max_staleness=1, on_event=sink) as c:
        task = asyncio.create_task(c.train_step(records(micro_model, 0, seed=1)))
        await started.wait()
        assert c.version == 0 and not task.done()
        returned.set()
        res = await task
        assert order == ["started", "gpus back", "finished"] and res.version == 1
        assert res.timings["gpu_return_wait_s"] > 0
    # a restarted client resumes from the checkpoint at the same version
    async with TrainerClient(micro_model, tmp_path, SPEC, max_staleness=1, resume=True) as again:
        assert again.version == 1 and again.setup_info["resumed_from"].endswith("step-000001")


async def test_weight_broadcast_reaches_the_vllm_worker_extension(micro_model: Path, tmp_path: Path) -> None:
    """Trainer rank 0 hosts the gloo group; vLLM's worker extension (pearl.engines.vllm_worker_ext,
    the code that runs inside each vLLM worker) joins and receives. Only vLLM's own
    ``reload_weights`` is replaced by a recorder: that part needs a vLLM worker."""
    from pearl.engines.vllm_worker_ext import PearlWorkerExtension

    class Worker(PearlWorkerExtension):
        got: dict[str, torch.Tensor]

        def reload_weights(self, weights_iterator: Iterator[tuple[str, torch.Tensor]]) -> None:
            self.got = {n: t.clone() for n, t in weights_iterator}

    worker = Worker()
    async with TrainerClient(micro_model, tmp_path, SPEC, max_staleness=1) as c:
        await c.train_step(records(micro_model, 0, seed=2))
        layout = await c.weight_layout()
        assert [d for d, _ in layout] == ["bfloat16"]  # one bucket per dtype: one collective
        port = free_port()
        await asyncio.gather(c.init_broadcast("127.0.0.1", port, 1),
                             asyncio.to_thread(worker.pearl_join_group, "127.0.0.1", port, 1, 2))
        stats, n = await asyncio.gather(c.broadcast(), asyncio.to_thread(worker.pearl_receive, layout))
        assert stats["version"] == 1 and stats["tensors"] == n == len(worker.got)
        snap = checkpoint_model(tmp_path, 1)
        assert set(worker.got) == set(snap)
        for k, v in snap.items():
            assert torch.equal(worker.got[k], v.to(torch.bfloat16)), k

        # a second update reuses the group; a per-tensor layout (SGLang's order) also round-trips
        await c.train_step(records(micro_model, 1, seed=3))
        per_tensor = await c.weight_layout(per_tensor=True)
        assert len(per_tensor) == len(snap)
        group_stats, received = await asyncio.gather(c.broadcast(),
                                                     asyncio.to_thread(worker.pearl_receive, per_tensor))
        assert group_stats["version"] == 2 and received == len(snap)
        snap2 = checkpoint_model(tmp_path, 2)
        assert torch.equal(worker.got["lm_head.weight"], snap2["lm_head.weight"].to(torch.bfloat16))
        worker.pearl_leave_group()


async def test_setup_failure_names_the_rank(tmp_path: Path) -> None:
    c = TrainerClient(tmp_path / "no-such-model", tmp_path / "w", SPEC, max_staleness=1)
    with pytest.raises(TrainerError, match="setup failed on rank 0"):
        await c.start()
    await c.close()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
async def test_two_fsdp2_ranks_match_one_rank(micro_model: Path, tmp_path: Path, device: str) -> None:
    """The GPU code path (FSDP2 fully_shard, sharded checkpoint gathering, micro-batch padding) on
    gloo here and on NCCL on GPU hosts: the 2-rank update equals the 1-rank one. 3 groups of 4 over
    2 ranks minus one record, 64-token budget: the ranks get different numbers of micro-batches."""
    recs = records(micro_model, 0, seed=5)
    fsdp = SPEC.model_copy(update={"fsdp": "always", "backend": "nccl" if device == "cuda" else "gloo"})
    two = TrainerClient(micro_model, tmp_path / "two", fsdp.model_copy(update={"world_size": 2}),
                        max_staleness=1, device=device, threads_per_rank=1)
    one = TrainerClient(micro_model, tmp_path / "one", fsdp, max_staleness=1, device=device, threads_per_rank=1)
    await asyncio.gather(two.start(), one.start())
    try:
        uneven = recs[:11]  # shards of 6 and 5 records of 12 tokens: 2 and 1 micro-batches of <= 64 tokens
        r2, r1 = await asyncio.gather(two.train_step(uneven), one.train_step(uneven))
        assert r2.metrics["tokens"] == r1.metrics["tokens"] == 11 * 8
        # the gradient norm catches a wrong scale (Adam's first step would hide one in the weights)
        assert r2.metrics["grad_norm"] == pytest.approx(r1.metrics["grad_norm"], rel=1e-5)
        w2, w1 = checkpoint_model(tmp_path / "two", 1), checkpoint_model(tmp_path / "one", 1)
        assert set(w2) == set(w1)
        for k in w1:  # Adam moves each weight by ~lr = 1e-3; float noise in ~0 gradients stays < 10% of it
            torch.testing.assert_close(w2[k].cpu(), w1[k].cpu(), rtol=0, atol=1e-4)
    finally:
        await asyncio.gather(two.close(), one.close())


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
async def test_release_when_idle_offloads_between_updates(micro_model: Path, tmp_path: Path, device: str) -> None:
    """With ``release_when_idle`` the ranks free their device memory after each update (before
    TrainingFinished lets the toggle manager lend the GPU) and take it back before the next one,
    after TrainingStarted; the updates are the same as without it. On CPU nothing moves."""
    seen: list[tuple[str, bool]] = []
    lent = TrainerClient(micro_model, tmp_path / "lent", SPEC, max_staleness=2, device=device, threads_per_rank=1,
                         release_when_idle=True)

    async def sink(ev: TrainingStarted | TrainingFinished) -> None:
        seen.append((type(ev).__name__, lent.offloaded))

    lent._on_event = sink
    plain = TrainerClient(micro_model, tmp_path / "plain", SPEC, max_staleness=2, device=device, threads_per_rank=1)
    await asyncio.gather(lent.start(), plain.start())
    try:
        for seed in (1, 2):
            recs = records(micro_model, lent.version, seed=seed)
            a, b = await asyncio.gather(lent.train_step(recs), plain.train_step(recs))
            assert a.metrics["grad_norm"] == pytest.approx(b.metrics["grad_norm"], rel=1e-6)
            assert "offload_s" in a.timings and "offload_s" not in b.timings
        # offloaded when the GPU may be lent; the second update started offloaded and reloaded first
        assert seen == [("TrainingStarted", False), ("TrainingFinished", True),
                        ("TrainingStarted", True), ("TrainingFinished", True)]
        # only the lent client made reload round trips (the plain one's reload_s is exactly 0)
        assert a.timings["reload_s"] > 0.0 and b.timings["reload_s"] == 0.0
        assert await lent.digests() == await plain.digests()
    finally:
        await asyncio.gather(lent.close(), plain.close())


async def test_step_refused_while_offloaded(micro_model: Path, tmp_path: Path) -> None:
    """A rank asked to step while offloaded says so (the client always reloads first)."""
    from pearl.config import TrainSpec as _Spec
    from pearl.train.trainer import RankConfig, TrainerRank, TrainerStepError

    rank = TrainerRank(RankConfig(str(micro_model), str(tmp_path), _Spec(micro_batch_tokens=64)))
    rank.setup()
    rank.offloaded = True  # as after "offload" on a GPU rank
    with pytest.raises(TrainerStepError, match="send 'reload' first"):
        rank.train_step(1, [], 1.0)
    assert rank.reload()["offloaded"] is False
    rank.close()


async def test_nonfinite_batch_is_refused_and_consumed_records_are_not_trained_again(micro_model: Path,
                                                                                     tmp_path: Path) -> None:
    """A NaN reward makes the loss NaN: the ranks refuse the update (no version, no snapshot), the
    events of the retried step get fresh ids; records an update consumed are never trained again."""
    from dataclasses import replace

    events: list[str] = []

    async def sink(ev: TrainingStarted | TrainingFinished) -> None:
        events.append(ev.event_id)

    c = TrainerClient(micro_model, tmp_path, SPEC, max_staleness=2, on_event=sink, threads_per_rank=1)
    await c.start()
    try:
        recs = records(micro_model, 0, seed=7)
        bad = await c.train_step([replace(recs[0], reward=float("nan")), *recs[1:]])
        assert not bad.updated and bad.version == 0 == c.version
        assert bad.metrics["skipped_nonfinite"] == 1.0 and bad.metrics["nonfinite_skipped"] == 1.0
        assert not (tmp_path / "snapshots").exists() and not c.consumed
        ok = await c.train_step(recs)
        assert ok.updated and ok.version == 1 and ok.metrics["skipped_nonfinite"] == 0.0
        assert events == ["train-start-1", "train-finish-1", "train-start-1-retry1", "train-finish-1-retry1"]
        again = await c.train_step(recs)
        assert not again.updated and again.report.dropped_consumed == len(recs) and again.report.kept == 0
    finally:
        await c.close()
