"""From ``TrajectoryRecord`` s to padded training tensors: staleness filter, advantages, sharding.

Life of a batch (all pure functions; the client runs the first three, each rank the last two)::

    records --filter_records--> kept records + FilterReport (counts of what was dropped and why)
            --make_samples-----> Sample per record (tokens, loss mask, rollout logprobs, advantage)
            --shard_samples----> one list per rank, balanced by tokens
    rank:   --micro_batches----> groups of samples under a padded-token budget
            --pad--------------> PackedBatch tensors (shifted for next-token prediction)

Bounded staleness (asynchronous RL): a record produced by weight version ``v`` (its oldest response
token's version, ``TrajectoryRecord.policy_version``) trained at trainer version ``V`` has
staleness ``V - v``. It is kept iff ``V - v <= max_staleness``; older records are **dropped and
counted** (never silently). A record from a future version (``v > V``) is an upstream bug and is
rejected with an error naming it. Records with no response token or without a weight version are
dropped and counted too, as are records that did not complete.

Exactly once: a ``traj_id`` is trained at most once. A second record with the same id in a batch
(it would be trained twice and shift its group's baseline) is dropped and counted
(``dropped_duplicate``), and so is a record the trainer already consumed (status ``consumed``, or
an id in ``consumed``: the ids of earlier updates, ``dropped_consumed``).

Truncation (one place, counted): an episode cut by a limit (``info["truncated"]``: the turn, token
or trajectory limit ran out) is trained as it stands under ``keep``; under ``mask`` it counts in its
group's baseline but none of its tokens is in the loss; under ``drop`` it is removed before the
advantages (``dropped_truncated``).

Placeholder logprobs: a response token whose logprob the engine did not report holds NaN
(``MISSING_LOGPROB``); it is left out of the loss mask and counted (``placeholder_tokens``).

Advantages are computed over the records that survive the filter (a group's baseline is the mean
reward of the samples we actually train on, from policies within the staleness bound).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, cast

import torch
from torch import Tensor

from pearl.core.trajectory import TrajectoryRecord, TrajectoryStatus
from pearl.train.grpo import AdvantageScale, group_advantages


class BatchError(ValueError):
    """A batch cannot be trained on; the message names the record and what to fix."""


TruncationPolicy = Literal["keep", "mask", "drop"]


@dataclass(frozen=True)
class FilterReport:
    """What ``filter_records`` kept and dropped (counts), for metrics and logs."""

    kept: int = 0
    dropped_stale: int = 0
    dropped_empty: int = 0
    dropped_unversioned: int = 0
    dropped_status: int = 0
    dropped_duplicate: int = 0
    dropped_consumed: int = 0
    dropped_truncated: int = 0
    masked_truncated: int = 0
    truncated: int = 0
    placeholder_tokens: int = 0
    max_staleness_seen: int = 0
    dropped_ids: tuple[str, ...] = field(default=(), repr=False)
    #: kept records whose tokens stay out of the loss (truncated, policy "mask"): baseline only
    no_loss_ids: frozenset[str] = field(default=frozenset(), repr=False)

    @property
    def dropped(self) -> int:
        return (self.dropped_stale + self.dropped_empty + self.dropped_unversioned + self.dropped_status
                + self.dropped_duplicate + self.dropped_consumed + self.dropped_truncated)

    def to_dict(self) -> dict[str, int]:
        return {
            "kept": self.kept,
            "dropped": self.dropped,
            "dropped_stale": self.dropped_stale,
            "dropped_empty": self.dropped_empty,
            "dropped_unversioned": self.dropped_unversioned,
            "dropped_status": self.dropped_status,
            "dropped_duplicate": self.dropped_duplicate,
            "dropped_consumed": self.dropped_consumed,
            "dropped_truncated": self.dropped_truncated,
            "masked_truncated": self.masked_truncated,
            "truncated": self.truncated,
            "placeholder_tokens": self.placeholder_tokens,
            "max_staleness_seen": self.max_staleness_seen,
        }


def is_truncated(r: TrajectoryRecord) -> bool:
    """The episode was cut by a limit (``info["truncated"]``, set by the agent session)."""
    return bool(r.info.get("truncated", False))


def filter_records(
    records: Sequence[TrajectoryRecord],
    current_version: int,
    max_staleness: int,
    *,
    consumed: Collection[str] = frozenset(),
    truncation: TruncationPolicy = "keep",
) -> tuple[list[TrajectoryRecord], FilterReport]:
    """Keep the records within the staleness bound, each ``traj_id`` once (rules in the module
    docstring); apply the truncation policy."""
    if max_staleness < 0:
        raise BatchError(f"max_staleness must be >= 0, got {max_staleness}")
    if truncation not in ("keep", "mask", "drop"):
        raise BatchError(f"unknown truncation policy {truncation!r}; use 'keep', 'mask' or 'drop'")
    kept: list[TrajectoryRecord] = []
    n: dict[str, int] = dict.fromkeys(
        ("stale", "empty", "unversioned", "status", "duplicate", "consumed", "drop_trunc", "truncated"), 0)
    worst = 0
    dropped: list[str] = []
    seen: set[str] = set()
    no_loss: set[str] = set()

    def drop(r: TrajectoryRecord, why: str) -> None:
        n[why] += 1
        dropped.append(r.traj_id)

    for r in records:
        if r.traj_id in seen:
            drop(r, "duplicate")
            continue
        seen.add(r.traj_id)
        if r.status is TrajectoryStatus.CONSUMED or r.traj_id in consumed:
            drop(r, "consumed")
            continue
        if r.status is not TrajectoryStatus.COMPLETED:
            drop(r, "status")
            continue
        if r.response_tokens == 0:
            drop(r, "empty")
            continue
        v = r.policy_version
        if v < 0:
            drop(r, "unversioned")
            continue
        if v > current_version:
            raise BatchError(
                f"trajectory {r.traj_id!r} has policy_version {v} > trainer version {current_version}: "
                "the rollout side reported a weight version the trainer never produced"
            )
        lag = current_version - v
        worst = max(worst, lag)
        if lag > max_staleness:
            drop(r, "stale")
            continue
        if is_truncated(r):
            n["truncated"] += 1
            if truncation == "drop":
                drop(r, "drop_trunc")
                continue
            if truncation == "mask":
                no_loss.add(r.traj_id)
        kept.append(r)
    report = FilterReport(
        kept=len(kept),
        dropped_stale=n["stale"],
        dropped_empty=n["empty"],
        dropped_unversioned=n["unversioned"],
        dropped_status=n["status"],
        dropped_duplicate=n["duplicate"],
        dropped_consumed=n["consumed"],
        dropped_truncated=n["drop_trunc"],
        masked_truncated=len(no_loss),
        truncated=n["truncated"],
        placeholder_tokens=sum(r.missing_logprobs for r in kept if r.traj_id not in no_loss),
        max_staleness_seen=worst,
        dropped_ids=tuple(dropped),
        no_loss_ids=frozenset(no_loss),
    )
    return kept, report


@dataclass(frozen=True)
class Sample:
    """One sequence ready for the trainer (JSON-friendly: sent to the rank processes)."""

    token_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    logprobs: tuple[float, ...]
    advantage: float

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if len(self.loss_mask) != n or len(self.logprobs) != n:
            raise BatchError(
                f"sample has {n} tokens, {len(self.loss_mask)} mask entries, {len(self.logprobs)} logprobs"
            )

    @property
    def n_loss_tokens(self) -> int:
        """Trained tokens that can be scored (the first token has no context: never scored)."""
        return sum(self.loss_mask[1:])

    def to_wire(self) -> list[object]:
        return [list(self.token_ids), list(self.loss_mask), list(self.logprobs), self.advantage]

    @staticmethod
    def from_wire(x: Sequence[object]) -> Sample:
        # ``x`` is ``to_wire()`` as decoded from JSON (untyped): [token_ids, loss_mask, logprobs, advantage]
        ids, mask, lps, adv = cast(tuple[Iterable[int], Iterable[int], Iterable[float], float], x)
        return Sample(tuple(ids), tuple(mask), tuple(float(v) for v in lps), float(adv))


def loss_mask_of(r: TrajectoryRecord) -> tuple[int, ...]:
    """The record's loss mask without its placeholder tokens (a response token whose logprob the
    engine did not report, ``MISSING_LOGPROB``: its ratio would be against nothing)."""
    return tuple(m if lp == lp else 0 for m, lp in zip(r.loss_mask, r.rollout_logprobs, strict=True))  # NaN != NaN


def make_samples(
    records: Sequence[TrajectoryRecord], scale: AdvantageScale = "std", no_loss: Collection[str] = frozenset()
) -> list[Sample]:
    """Group-relative advantages over ``records`` (grouped by ``group_id``) and one ``Sample`` each.
    Every record counts in its group's baseline; the records named in ``no_loss`` (truncated under
    the "mask" policy) get an all-zero loss mask, and placeholder tokens are never in a loss mask."""
    if not records:
        return []
    ids: dict[str, int] = {}
    index = torch.tensor([ids.setdefault(r.group_id, len(ids)) for r in records], dtype=torch.int64)
    rewards = torch.tensor([float(r.reward) for r in records], dtype=torch.float64)
    adv = group_advantages(rewards, index, scale=scale)
    out = []
    for r, a in zip(records, adv.tolist(), strict=True):
        mask = (0,) * len(r.token_ids) if r.traj_id in no_loss else loss_mask_of(r)
        out.append(Sample(tuple(r.token_ids), mask, tuple(r.rollout_logprobs), float(a)))
    return out


def shard_samples(samples: Sequence[Sample], world_size: int) -> list[list[Sample]]:
    """Split across ranks balancing token counts: longest first onto the least-loaded rank (LPT).
    Deterministic. A rank may get nothing when there are fewer samples than ranks."""
    if world_size < 1:
        raise BatchError(f"world_size must be >= 1, got {world_size}")
    shards: list[list[Sample]] = [[] for _ in range(world_size)]
    load = [0] * world_size
    order = sorted(range(len(samples)), key=lambda i: (-len(samples[i].token_ids), i))
    for i in order:
        k = min(range(world_size), key=lambda j: (load[j], j))
        shards[k].append(samples[i])
        load[k] += len(samples[i].token_ids)
    return shards


def micro_batches(samples: Sequence[Sample], max_tokens: int) -> list[list[Sample]]:
    """Group samples (sorted by length) so that ``len(group) * longest <= max_tokens`` (padded
    tokens); a sample longer than the budget forms its own micro-batch."""
    if max_tokens < 1:
        raise BatchError(f"max_tokens must be >= 1, got {max_tokens}")
    out: list[list[Sample]] = []
    cur: list[Sample] = []
    for s in sorted(samples, key=lambda s: len(s.token_ids)):
        longest = len(s.token_ids)  # sorted ascending: the newest is the longest
        if cur and (len(cur) + 1) * longest > max_tokens:
            out.append(cur)
            cur = []
        cur.append(s)
    if cur:
        out.append(cur)
    return out


@dataclass(frozen=True)
class PackedBatch:
    """Padded tensors of one micro-batch, shifted for next-token prediction.

    ``input_ids``/``attention_mask``: [B, T]. ``targets``, ``loss_mask``, ``old_logprobs``:
    [B, T-1], position ``t`` scores token ``t+1`` from the logits at ``t``. ``advantages``: [B].
    """

    input_ids: Tensor
    attention_mask: Tensor
    targets: Tensor
    loss_mask: Tensor
    old_logprobs: Tensor
    advantages: Tensor

    @property
    def n_loss_tokens(self) -> int:
        return int(self.loss_mask.sum().item())


def pad(samples: Sequence[Sample], pad_id: int = 0) -> PackedBatch:
    """Right-pad ``samples`` to the longest; pads have attention 0 and loss mask 0."""
    if not samples:
        raise BatchError("cannot pad an empty micro-batch")
    b = len(samples)
    t = max(len(s.token_ids) for s in samples)
    if t < 2:
        raise BatchError("every micro-batch needs a sequence of at least 2 tokens (a context and a target)")
    ids = torch.full((b, t), pad_id, dtype=torch.long)
    att = torch.zeros((b, t), dtype=torch.long)
    mask = torch.zeros((b, t), dtype=torch.float32)
    old = torch.zeros((b, t), dtype=torch.float32)
    for i, s in enumerate(samples):
        n = len(s.token_ids)
        ids[i, :n] = torch.tensor(s.token_ids, dtype=torch.long)
        att[i, :n] = 1
        mask[i, :n] = torch.tensor(s.loss_mask, dtype=torch.float32)
        old[i, :n] = torch.tensor(s.logprobs, dtype=torch.float32)
    adv = torch.tensor([s.advantage for s in samples], dtype=torch.float32)
    return PackedBatch(
        input_ids=ids,
        attention_mask=att,
        targets=ids[:, 1:],
        loss_mask=mask[:, 1:],
        old_logprobs=old[:, 1:],
        advantages=adv,
    )
