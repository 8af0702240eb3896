"""SGLang's scheduler rules that the emulated engine runs, ported from SGLang 0.5.23.

Each rule is SGLang's own (file and function named), not an approximation of it; the emulator
counts tokens where SGLang moves KV indices. Symbols: ``n`` requests in the decode batch, ``o_i``
tokens request ``i`` has generated, ``M_i`` its ``max_new_tokens`` (the client's cap, not where the
model stops: the scheduler cannot know that), ``CLIP`` = 4096.

* **Admission estimate** (``managers/schedule_policy.py``: ``PrefillAdder``): a request is admitted
  while ``extend + min(M - o, CLIP) <= available + evictable - sum_running ratio min(M_i - o_i,
  CLIP) - sum_admitted (extend_j + min(M_j - o_j, CLIP))``, FCFS (``schedule_policy`` ``fcfs``),
  stopping at the first that does not fit; ``available`` is the free KV pool, ``evictable`` the
  radix cache's unlocked tokens (the candidate's own matched prefix is pinned during the check).
  A PD prefill server sets ``M = 1`` (``disaggregation/prefill.py``: "so PrefillAdder memory
  estimation is accurate").
* **new_token_ratio** (``scheduler_components/new_token_ratio_tracker.py``): starts at ``init =
  0.7`` (``SGLANG_INIT_NEW_TOKEN_RATIO`` x ``schedule_conservativeness`` 1.0), falls by ``(init -
  min) / 600`` per decode step (``SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS``) to ``min = 0.14 init``
  (``SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR``); after a retraction it is set to ``min(1, (sum o_i + 20 n)
  / (sum M_i + 1))`` over the requests kept (``estimate_new_token_ratio_after_retract``); reset to
  ``init`` when the server is idle (``self_check_during_idle``).
* **Retraction** (``managers/schedule_batch.py``: ``check_decode_mem``, ``retract_decode``,
  ``release_req``; ``managers/scheduler.py``: ``update_running_batch``): before a decode step the
  batch needs ``n`` free tokens (page size 1), evicting the radix cache as needed; if it cannot
  get them, requests are retracted - kept in the order of ``(o_i, -prompt_i)`` descending, the last
  retracted first (the fewest generated tokens, then the longest prompt), at least one kept -
  until the rest fit. A retracted request's KV is freed without entering the radix cache (its
  matched prefix is unlocked), ``20 x`` (requests kept) tokens are evicted at once
  (``SGLANG_RETRACT_DECODE_STEPS``), and it returns to the waiting queue keeping its output: its
  re-prefill computes prompt + output less what the cache still holds.
* **PD decode server** (``disaggregation/decode.py``: ``DecodePreallocQueue``): no radix cache
  (``disaggregation_decode_enable_radix_cache`` False); a transferred request is admitted while
  ``prompt + 512 <= available - 512 x active`` (``num_reserved_decode_tokens`` 512 per running,
  transferring or queued request, ``_allocatable_token_budgets``); a retraction offloads the
  request's KV to host memory (``disaggregation_decode_retraction_backup``: a CPU tensor) and it
  resumes, KV copied back, when that rule admits it again (``resume_retracted_reqs``).

Public names: ``CLIP_MAX_NEW_TOKENS``, ``RETRACT_DECODE_STEPS``, ``NUM_RESERVED_DECODE_TOKENS``,
``NewTokenRatio``, ``retraction_order``, ``ratio_after_retract``, ``admission_estimate``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

#: SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION (environ.py)
CLIP_MAX_NEW_TOKENS = 4096
#: SGLANG_RETRACT_DECODE_STEPS (environ.py)
RETRACT_DECODE_STEPS = 20
#: num_reserved_decode_tokens (arg_groups/fields/disagg.py)
NUM_RESERVED_DECODE_TOKENS = 512
#: SGLANG_INIT_NEW_TOKEN_RATIO, SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR, SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600


class Decoding(Protocol):
    """What the rules read of a request: its prompt, its output so far and its cap."""

    @property
    def input_len(self) -> int: ...
    generated: int
    max_new: int


class NewTokenRatio:
    """SGLang's ``NewTokenRatioTracker`` (module docstring)."""

    __slots__ = ("current", "decay", "init", "min")

    def __init__(self, init: float = INIT_NEW_TOKEN_RATIO) -> None:
        self.init = min(init, 1.0)
        self.min = min(self.init * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
        self.decay = (self.init - self.min) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.current = self.init

    def decay_steps(self, k: int) -> None:
        """``k`` decode steps without a retraction."""
        if k > 0:
            self.current = max(self.current - k * self.decay, self.min)

    def reset(self) -> None:
        self.current = self.init

    def retracted(self, ratio: float) -> None:
        """A retraction sets the ratio (``ratio_after_retract`` of the requests kept)."""
        self.current = ratio


def admission_estimate(r: Decoding) -> int:
    """``min(M - o, CLIP)``: the tokens a request may still decode, as the admission counts them."""
    return min(max(r.max_new - r.generated, 0), CLIP_MAX_NEW_TOKENS)


def retraction_order(reqs: Sequence[Decoding]) -> list[int]:
    """Indices of ``reqs`` from most to least preferred to keep (``_get_decode_retraction_order``,
    ``retraction_policy`` ``length``): the retraction pops from the end."""
    return sorted(range(len(reqs)), key=lambda i: (reqs[i].generated, -reqs[i].input_len), reverse=True)


def ratio_after_retract(kept: Sequence[Decoding]) -> float:
    """``estimate_new_token_ratio_after_retract`` over the requests kept."""
    decoded = sum(r.generated for r in kept)
    cap = sum(r.max_new for r in kept)
    return min(1.0, (decoded + RETRACT_DECODE_STEPS * len(kept)) / (cap + 1))
