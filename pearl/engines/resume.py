"""Resumable requests: an aborted request keeps its output and continues elsewhere.

When a request is aborted (reclaim, role change, weight update, dead server) the engine returns
(or the error carries) a partial ``GenerateResult``. The caller keeps those tokens and logprobs and
sends a *continuation*: the original prompt followed by every token generated so far, with the
remaining budget ``max_new_tokens - generated``. The new worker pays one extra prefill of
``len(prompt) + generated`` tokens (mostly a prefix-cache miss) and nothing is generated twice.

The trajectory records one seamless response made of parts; each part keeps the weight version
that produced it (``merge_parts``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from pearl.core.trajectory import MISSING_LOGPROB, Segment
from pearl.engines.base import FinishReason, GenerateRequest, GenerateResult


def generated_tokens(parts: Sequence[GenerateResult]) -> list[int]:
    return [t for p in parts for t in p.output_ids]


def ended_on_stop(original: GenerateRequest, parts: Sequence[GenerateResult]) -> bool:
    """The last part, though aborted, ends in one of the request's stop tokens: an engine may apply
    an abort before its stop check (SGLang's ``Req.update_finish_state``), so the token that ended
    the turn can arrive with ``finish_reason`` abort. Continuing it would generate past the stop."""
    return bool(parts) and bool(parts[-1].output_ids) and parts[-1].output_ids[-1] in original.sampling.stop_token_ids


def is_finished(original: GenerateRequest, parts: Sequence[GenerateResult]) -> bool:
    """True when the last part ended normally, ended in a stop token, or the token budget is used up."""
    if not parts:
        return False
    if parts[-1].finish_reason is not FinishReason.ABORT or ended_on_stop(original, parts):
        return True
    return len(generated_tokens(parts)) >= original.sampling.max_new_tokens


def continuation_request(
    original: GenerateRequest, parts: Sequence[GenerateResult], attempt: int
) -> GenerateRequest | None:
    """The request that resumes ``original`` after the partial ``parts``; None if nothing remains.

    ``input_ids' = input_ids + generated``, ``max_new_tokens' = max_new_tokens - len(generated)``;
    ``attempt`` is the request's new ``attempt`` field (its wire id differs, so the engine never
    confuses the two attempts).
    """
    if is_finished(original, parts):
        return None
    done = generated_tokens(parts)
    remaining = original.sampling.max_new_tokens - len(done)
    return replace(original, input_ids=original.input_ids + tuple(done), attempt=attempt,
                   sampling=replace(original.sampling, max_new_tokens=remaining))


def final_finish_reason(original: GenerateRequest, parts: Sequence[GenerateResult]) -> FinishReason:
    if not parts:
        return FinishReason.ABORT
    last = parts[-1].finish_reason
    if last is FinishReason.ABORT and ended_on_stop(original, parts):
        return FinishReason.STOP
    if last is FinishReason.ABORT and len(generated_tokens(parts)) >= original.sampling.max_new_tokens:
        return FinishReason.LENGTH
    return last


def merge_parts(parts: Sequence[GenerateResult], turn: int = 0) -> list[Segment]:
    """One trained ``Segment`` per non-empty part, each with its own weight version."""
    segs: list[Segment] = []
    for p in parts:
        if not p.output_ids:
            continue
        lps = p.logprobs if len(p.logprobs) == len(p.output_ids) else (MISSING_LOGPROB,) * len(p.output_ids)
        segs.append(
            Segment(token_ids=tuple(p.output_ids), trained=True, logprobs=tuple(lps), weight_version=p.weight_version,
                    turn=turn)
        )
    return segs
