"""Staleness filtering, samples, sharding and padding (pearl/train/batch.py)."""

from __future__ import annotations

import math

import pytest
import torch

from pearl.core.trajectory import Segment, TrajectoryRecord, TrajectoryStatus
from pearl.train.batch import (
    BatchError,
    Sample,
    filter_records,
    make_samples,
    micro_batches,
    pad,
    shard_samples,
)


def rec(tid: str, group: str, version: int | tuple[int, ...], reward: float = 0.0, n_resp: int = 2,
        status: TrajectoryStatus = TrajectoryStatus.COMPLETED) -> TrajectoryRecord:
    versions = version if isinstance(version, tuple) else (version,)
    segs = [Segment((1, 2, 3), False)]
    for i, v in enumerate(versions):
        segs.append(Segment(tuple(range(10, 10 + n_resp)), True, tuple([-0.5] * n_resp), v, turn=i))
        segs.append(Segment((4,), False, turn=i))
    return TrajectoryRecord(tid, group, tuple(segs), reward=reward, status=status)


def test_staleness_filter_counts_exactly() -> None:
    records = [
        rec("fresh", "g", 5),
        rec("lag1", "g", 4),
        rec("lag2", "g", 3),  # stale for max_staleness=1
        rec("mixed", "g", (3, 5)),  # oldest token version 3 -> stale
        rec("empty", "g", 5, n_resp=0),
        rec("noversion", "g", -1),
        rec("failed", "g", 5, status=TrajectoryStatus.FAILED),
    ]
    kept, rep = filter_records(records, current_version=5, max_staleness=1)
    assert [r.traj_id for r in kept] == ["fresh", "lag1"]
    assert (rep.kept, rep.dropped_stale, rep.dropped_empty, rep.dropped_unversioned, rep.dropped_status) == (
        2, 2, 1, 1, 1)
    assert rep.dropped == 5
    assert rep.max_staleness_seen == 2
    assert set(rep.dropped_ids) == {"lag2", "mixed", "empty", "noversion", "failed"}
    kept0, rep0 = filter_records(records[:3], current_version=5, max_staleness=0)
    assert [r.traj_id for r in kept0] == ["fresh"] and rep0.dropped_stale == 2


def test_future_version_is_rejected_with_a_clear_error() -> None:
    with pytest.raises(BatchError, match=r"'ahead'.*policy_version 7 > trainer version 5"):
        filter_records([rec("ahead", "g", 7)], current_version=5, max_staleness=1)
    with pytest.raises(BatchError, match="max_staleness"):
        filter_records([], 0, -1)


def test_make_samples_group_advantages_and_alignment() -> None:
    records = [rec("a", "g1", 0, 1.0), rec("b", "g1", 0, 0.0), rec("c", "g2", 0, 3.0), rec("d", "g2", 0, 3.0)]
    samples = make_samples(records)
    a = 0.5 / math.sqrt(0.5)  # group g1: mean .5, unbiased std sqrt(.5)
    assert [s.advantage for s in samples] == pytest.approx([a, -a, 0.0, 0.0], abs=1e-5)
    s = samples[0]
    assert s.token_ids == (1, 2, 3, 10, 11, 4)
    assert s.loss_mask == (0, 0, 0, 1, 1, 0)
    assert s.logprobs == (0.0, 0.0, 0.0, -0.5, -0.5, 0.0)
    assert s.n_loss_tokens == 2
    assert Sample.from_wire(s.to_wire()) == s


def test_shard_balances_tokens_and_keeps_every_sample() -> None:
    lens = [9, 8, 7, 3, 2, 2, 1]
    samples = [Sample(tuple(range(n)), (0,) * n, (0.0,) * n, float(i)) for i, n in enumerate(lens)]
    shards = shard_samples(samples, 2)
    assert sorted(s.advantage for sh in shards for s in sh) == [float(i) for i in range(len(lens))]
    loads = [sum(len(s.token_ids) for s in sh) for sh in shards]
    assert loads == [16, 16]  # LPT: 9+3+2+2 / 8+7+1
    assert shard_samples(samples[:1], 3)[1:] == [[], []]


def test_micro_batches_respect_padded_budget() -> None:
    samples = [Sample(tuple(range(n)), (0,) * n, (0.0,) * n, 0.0) for n in (5, 4, 3, 3, 12)]
    mbs = micro_batches(samples, max_tokens=10)
    assert [[len(s.token_ids) for s in mb] for mb in mbs] == [[3, 3], [4, 5], [12]]  # 2 x 5 = 10 fits
    for mb in mbs:
        assert len(mb) * max(len(s.token_ids) for s in mb) <= 10 or len(mb) == 1


def test_pad_shifts_for_next_token_prediction() -> None:
    s1 = Sample((5, 6, 7), (0, 1, 1), (0.0, -1.0, -2.0), 1.5)
    s2 = Sample((8, 9), (0, 1), (0.0, -3.0), -1.0)
    pb = pad([s1, s2], pad_id=0)
    assert pb.input_ids.tolist() == [[5, 6, 7], [8, 9, 0]]
    assert pb.attention_mask.tolist() == [[1, 1, 1], [1, 1, 0]]
    assert pb.targets.tolist() == [[6, 7], [9, 0]]
    assert pb.loss_mask.tolist() == [[1.0, 1.0], [1.0, 0.0]]
    assert pb.old_logprobs.tolist() == [[-1.0, -2.0], [-3.0, 0.0]]
    torch.testing.assert_close(pb.advantages, torch.tensor([1.5, -1.0]))
    assert pb.n_loss_tokens == 3
    with pytest.raises(BatchError, match="empty"):
        pad([])


def test_exactly_once_duplicates_and_consumed_records_are_dropped_and_counted() -> None:
    from dataclasses import replace

    a = rec("a", "g", 5, reward=1.0)
    records = [a, rec("b", "g", 5), replace(a, reward=0.0), rec("c", "g", 5, status=TrajectoryStatus.CONSUMED),
               rec("d", "g", 5)]
    kept, rep = filter_records(records, 5, 1, consumed={"d"})
    assert [(r.traj_id, r.reward) for r in kept] == [("a", 1.0), ("b", 0.0)]  # the first "a" is kept
    assert (rep.dropped_duplicate, rep.dropped_consumed, rep.dropped) == (1, 2, 3)
    assert rep.to_dict()["dropped_duplicate"] == 1 and rep.to_dict()["dropped_consumed"] == 2
    # a duplicate would shift the group baseline: advantages over the kept records only
    assert [s.advantage for s in make_samples(kept)] == pytest.approx([0.5 / math.sqrt(0.5), -0.5 / math.sqrt(0.5)],
                                                                      rel=1e-5)


def truncated(r: TrajectoryRecord) -> TrajectoryRecord:
    from dataclasses import replace
    from types import MappingProxyType

    return replace(r, info=MappingProxyType({"truncated": True, "end_reason": "max_turns"}))


@pytest.mark.parametrize("policy", ["keep", "mask", "drop"])
def test_truncation_policy_keep_mask_drop(policy: str) -> None:
    records = [rec("ok", "g", 5, reward=1.0), truncated(rec("cut", "g", 5, reward=0.0)), rec("ok2", "g", 5)]
    kept, rep = filter_records(records, 5, 1, truncation=policy)  # type: ignore[arg-type]
    assert rep.truncated == 1
    samples = make_samples(kept, no_loss=rep.no_loss_ids)
    if policy == "drop":
        assert [r.traj_id for r in kept] == ["ok", "ok2"] and rep.dropped_truncated == 1
        return
    assert [r.traj_id for r in kept] == ["ok", "cut", "ok2"] and rep.dropped_truncated == 0
    cut = samples[1]
    assert cut.advantage < 0  # in the group's baseline either way
    if policy == "mask":
        assert rep.masked_truncated == 1 and cut.n_loss_tokens == 0 and sum(cut.loss_mask) == 0
    else:
        assert rep.masked_truncated == 0 and cut.n_loss_tokens == 2
    with pytest.raises(BatchError, match="truncation policy"):
        filter_records(records, 5, 1, truncation="clip")  # type: ignore[arg-type]


def test_placeholder_logprobs_are_out_of_the_loss_and_counted() -> None:
    from pearl.core.trajectory import MISSING_LOGPROB

    segs = (Segment((1, 2), False), Segment((10, 11, 12), True, (-0.5, MISSING_LOGPROB, -0.7), 5),
            Segment((4,), False), Segment((13, 14), True, (MISSING_LOGPROB, MISSING_LOGPROB), 5))
    r = TrajectoryRecord("p", "g", segs, reward=1.0)
    assert r.missing_logprobs == 3 and segs[1].missing_logprobs == 1
    kept, rep = filter_records([r, rec("q", "g", 5)], 5, 1)
    assert rep.placeholder_tokens == 3
    s = make_samples(kept)[0]
    assert s.loss_mask == (0, 0, 1, 0, 1, 0, 0, 0) and s.n_loss_tokens == 2


def test_a_part_without_logprobs_becomes_placeholders_never_zeros() -> None:
    """An engine part whose logprobs did not all arrive (``StreamState.output_logprobs`` gives none)
    is merged with ``MISSING_LOGPROB`` per token; the trainer leaves those tokens out and counts them."""
    from pearl.engines.base import FinishReason, GenerateResult
    from pearl.engines.resume import merge_parts

    parts = [GenerateResult("r/1", (10, 11), (-0.3, -0.4), FinishReason.ABORT, 4, 3),
             GenerateResult("r/1+", (12, 13, 14), (), FinishReason.STOP, 5, 5)]
    segs = merge_parts(parts, turn=1)
    assert [s.missing_logprobs for s in segs] == [0, 3] and segs[0].logprobs == (-0.3, -0.4)
    assert all(x != x for x in segs[1].logprobs)  # NaN, not 0.0
    r = TrajectoryRecord("x", "g", (Segment((1, 2, 3), False), *segs), reward=1.0)
    kept, rep = filter_records([r, rec("y", "g", 5)], 5, 1)
    assert rep.placeholder_tokens == 3
    assert make_samples(kept)[0].loss_mask == (0, 0, 0, 1, 1, 0, 0, 0)
