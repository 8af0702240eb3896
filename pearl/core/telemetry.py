"""What the predictor learns from: one ``TelemetryRecord`` per served request (one turn of one
trajectory), one ``IterationRecord`` per engine iteration (or span of iterations at one batch),
and the serving ``Mode`` they ran in.

The pipeline writes a request record when a turn's response is back; an engine that exposes its
iterations (the emulator always) writes iteration records; the tracker keeps a window of them and
refits the profiles from it (``fitting.fit_hardware`` / ``fitting.fit_workload``).

Bad telemetry is screened out before any fit, each record with one ``Rejection`` reason, and the
reasons are counted (``Rejections``) on the profile the fit returns, so a decision record shows
what its profiles did not learn from:

==================  ===========================================================================
reason              what was wrong
==================  ===========================================================================
non_finite          a NaN or infinite time or count
negative_duration   a negative time
zero_duration       tokens served in no time (a request's prefill + decode, an iteration's wall)
bad_tokens          a negative token count, more cached than prompt tokens, a batch below 1
clock_backwards     an iteration that ends before it starts, or starts before its worker's
                    previous iteration ended
silent_worker       a worker said to be serving reported nothing in the window (its load and its
                    trajectories are missing: the window's tail statistics are not used), or a
                    worker that served requests logged no engine iteration (the window's
                    iterations are not used: the decode step keeps its fit)
non_physical_fit    a refit with a negative or non-finite coefficient or statistic: the previous
                    profile is kept
==================  ===========================================================================
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

#: how far (s) an iteration may start before its worker's previous one ended (clock rounding)
CLOCK_SLACK_S = 1e-9


class Mode(StrEnum):
    """How the rollout pool serves: every worker prefills and decodes, or a P:D split."""

    COLOCATED = "colocated"
    DISAGGREGATED = "disaggregated"


@dataclass(frozen=True, slots=True)
class TelemetryRecord:
    """One request (one turn of one trajectory) as measured by the engine and the pipeline.

    ``mode`` accepts the enum or its value (``"colocated"`` / ``"disaggregated"``, as JSON
    telemetry and the pipeline carry it) and holds the enum after construction; any other value
    raises ``ValueError``."""

    traj_id: str
    turn: int
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    queue_s: float = 0.0
    prefill_s: float = 0.0
    transfer_s: float = 0.0
    decode_s: float = 0.0
    env_s: float = 0.0
    decode_concurrency: float = 1.0
    mode: Mode | str = Mode.COLOCATED
    worker_id: str = ""
    final: bool = False  # the trajectory ended after this turn
    #: the turn was served by a worker other than the one that served the trajectory's previous
    #: turn (a cost-aware or slack move, an interruption): its prefix cache was elsewhere
    moved: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.mode, Mode):
            object.__setattr__(self, "mode", Mode(self.mode))

    def valid(self) -> bool:
        """Finite, non-negative times and token counts with ``cached <= prompt``."""
        return self.rejection() is None

    def rejection(self) -> Rejection | None:
        """Why the record cannot be learned from at all (module docstring), or None."""
        nums = (self.queue_s, self.prefill_s, self.transfer_s, self.decode_s, self.env_s, self.decode_concurrency)
        if any(not math.isfinite(v) for v in nums):
            return Rejection.NON_FINITE
        if any(v < 0 for v in nums):
            return Rejection.NEGATIVE_DURATION
        if not (self.prompt_tokens >= 0 and 0 <= self.cached_tokens <= self.prompt_tokens and self.output_tokens >= 0):
            return Rejection.BAD_TOKENS
        return None

    def timing_rejection(self) -> Rejection | None:
        """``rejection``, or ``zero_duration`` for a request that computed tokens (a prefill or more
        than the first output token) in no prefill and no decode time: no cost can be read from it
        (its token statistics still count for the workload)."""
        why = self.rejection()
        if why is None and self.prefill_s + self.decode_s <= 0 and (
                self.prompt_tokens > self.cached_tokens or self.output_tokens > 1):
            return Rejection.ZERO_DURATION
        return why


class Rejection(StrEnum):
    """Why telemetry was not learned from (module docstring)."""

    NON_FINITE = "non_finite"
    NEGATIVE_DURATION = "negative_duration"
    ZERO_DURATION = "zero_duration"
    BAD_TOKENS = "bad_tokens"
    CLOCK_BACKWARDS = "clock_backwards"
    SILENT_WORKER = "silent_worker"
    NON_PHYSICAL_FIT = "non_physical_fit"


@dataclass(frozen=True, slots=True)
class Rejections:
    """Counts of rejected telemetry by reason, accumulated over the fits of a profile (sorted by
    reason; a profile's equality and hash do not read it)."""

    counts: tuple[tuple[Rejection, int], ...] = ()

    @staticmethod
    def of(reasons: Iterable[Rejection]) -> Rejections:
        return Rejections().plus(Counter(reasons))

    def plus(self, more: Mapping[Rejection, int] | Rejections) -> Rejections:
        extra = dict(more.counts) if isinstance(more, Rejections) else dict(more)
        if not any(extra.values()):
            return self
        total = Counter(dict(self.counts))
        total.update({k: v for k, v in extra.items() if v})
        return Rejections(tuple(sorted(total.items())))

    def __getitem__(self, reason: Rejection) -> int:
        return dict(self.counts).get(reason, 0)

    @property
    def total(self) -> int:
        return sum(v for _k, v in self.counts)

    def to_dict(self) -> dict[str, int]:
        return {k.value: v for k, v in self.counts}


@dataclass(frozen=True, slots=True)
class IterationRecord:
    """One engine iteration, or a span of ``steps`` iterations at one batch, on one worker.

    ``batch``: sequences decoding (``n``); ``context_tokens``: the sum of their contexts at the
    span's first iteration (``n L``); ``new_tokens``: prompt tokens prefilled in it (0 for a pure
    decode span; a prefill chunk has ``steps = 1``); ``start_s`` / ``end_s``: the engine's clock.
    The context grows by ``n`` tokens per iteration, so the span's mean context per sequence is
    ``L = context_tokens / n + (steps - 1) / 2``."""

    worker_id: str
    role: str
    batch: int
    context_tokens: float
    new_tokens: int
    start_s: float
    end_s: float
    steps: int = 1
    cached_tokens: float = 0.0

    @property
    def wall_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def mean_context(self) -> float:
        """``L``: the mean context per sequence over the span."""
        return self.context_tokens / max(self.batch, 1) + (self.steps - 1) / 2.0

    def rejection(self) -> Rejection | None:
        """Why the record cannot be learned from (module docstring), or None; the order of a
        worker's records is checked by ``screen_iterations``."""
        nums = (self.context_tokens, self.start_s, self.end_s, self.cached_tokens)
        if any(not math.isfinite(v) for v in nums):
            return Rejection.NON_FINITE
        if self.batch < 0 or self.new_tokens < 0 or self.steps < 1 or self.context_tokens < 0 or self.cached_tokens < 0 \
                or (self.batch == 0 and self.new_tokens == 0):
            return Rejection.BAD_TOKENS
        if self.end_s < self.start_s:
            return Rejection.CLOCK_BACKWARDS
        if self.end_s == self.start_s:
            return Rejection.ZERO_DURATION
        return None


def screen_iterations(records: Iterable[IterationRecord]) -> tuple[list[IterationRecord], Counter[Rejection]]:
    """The records that can be learned from, and the count of the others by reason: each record's
    own ``rejection``, and ``clock_backwards`` for one that starts before its worker's previous
    accepted record ended (records in the order they were written)."""
    kept: list[IterationRecord] = []
    why: Counter[Rejection] = Counter()
    last_end: dict[str, float] = {}
    for r in records:
        bad = r.rejection()
        if bad is None and r.start_s < last_end.get(r.worker_id, -math.inf) - CLOCK_SLACK_S:
            bad = Rejection.CLOCK_BACKWARDS
        if bad is not None:
            why[bad] += 1
            continue
        last_end[r.worker_id] = r.end_s
        kept.append(r)
    return kept, why


#: ``DecodeSamples``: the newest samples a bucket keeps
BUCKET_SAMPLES = 32

#: one decode sample: ``(n, L, y)``, batch, mean context per sequence, seconds per iteration
DecodeSample = tuple[float, float, float]
#: a bucket's key: ``(role, floor(log2 n), floor(2 log2 L))``
BucketKey = tuple[str, int, int]


@dataclass(frozen=True, slots=True)
class DecodeSamples:
    """Decode-step samples from iteration records, per role in buckets of one octave of batch and
    half an octave of context, each keeping its ``BUCKET_SAMPLES`` newest (bucketed retirement: a
    long run at one operating point retires only that point's old samples, so the range measured
    stays covered). Read by ``iteration_fit.fit_decode_step``."""

    buckets: tuple[tuple[BucketKey, tuple[DecodeSample, ...]], ...] = ()

    def add(self, records: Iterable[IterationRecord]) -> tuple[DecodeSamples, Counter[Rejection]]:
        """The store with the decode spans of ``records`` (``new_tokens == 0``, ``batch >= 1``)
        added, and the screened-out records by reason (``screen_iterations``)."""
        kept, why = screen_iterations(records)
        store = {k: list(v) for k, v in self.buckets}
        for r in kept:
            if r.new_tokens or r.batch < 1:
                continue  # a prefill chunk: not a decode step
            ctx = r.mean_context
            key = (r.role, math.floor(math.log2(r.batch)), math.floor(2.0 * math.log2(max(ctx, 1.0))))
            bucket = store.setdefault(key, [])
            bucket.append((float(r.batch), ctx, r.wall_s / r.steps))
            del bucket[:-BUCKET_SAMPLES]
        return DecodeSamples(tuple(sorted((k, tuple(v)) for k, v in store.items()))), why

    def of_role(self, role: str) -> list[tuple[DecodeSample, float]]:
        """The role's samples, each with its weight ``1 / |bucket|`` (every bucket counts the same)."""
        return [(smp, 1.0 / len(b)) for (r, _n, _l), b in self.buckets if r == role for smp in b]

    def n_buckets(self, role: str) -> int:
        return sum(1 for (r, _n, _l), _b in self.buckets if r == role)


@runtime_checkable
class IterationLogging(Protocol):
    """An engine that logs its iterations as ``IterationRecord`` s into a list its owner sets
    (the emulator); vLLM and SGLang expose per-iteration figures only as aggregated metrics."""

    iteration_log: list[Any] | None
