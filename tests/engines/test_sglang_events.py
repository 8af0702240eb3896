"""``SglangEngine``'s pure pieces: how stream events fold into an output (``_absorb``), the request
body's seed, the weight group's backend, and when a resumed turn is finished."""

from __future__ import annotations

import inspect
import math
from pathlib import Path
from typing import Any

import pytest

from pearl.engines.base import (
    EngineError,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    RequestRejectedError,
    ResponseShapeError,
    SamplingParams,
)
from pearl.engines.resume import continuation_request, final_finish_reason, is_finished
from pearl.engines.sglang import SglangEngine, SglangServer, SglangSettings
from pearl.engines.sglang_events import SglangStream, absorb, request_seed
from pearl.train.client import TrainerClient

TOKS = [11, 12, 13, 14, 15]
LPS = [-0.5, -0.25, -0.125, -1.0, -2.0]


def _event(ids: list[int], c: int, lps: list[tuple[float, int]] | None, finish: Any = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"completion_tokens": c, "finish_reason": finish}
    if lps is not None:
        meta["output_token_logprobs"] = [[lp, t, None] for lp, t in lps]
    return {"output_ids": ids, "meta_info": meta}


def _streamed(n: int, logprobs: bool = True) -> SglangStream:
    st = SglangStream()
    absorb("s", 1, _event(TOKS[:n], n, list(zip(LPS[:n], TOKS[:n], strict=True)) if logprobs else None), st)
    return st


ABORT = {"type": "abort", "message": "Aborted by AbortReq"}


def test_an_incremental_chunk_coalesced_with_an_abort_echo_keeps_tokens_and_logprobs_aligned() -> None:
    """``_coalesce_streaming_chunks`` of a queued chunk (tokens 3-4) and the abort echo (the last
    token again, every logprob): ids ``[t3, t4, t4]``, logprobs of the chunk then of the whole output."""
    st = _streamed(3)
    chunk = list(zip(LPS[3:], TOKS[3:], strict=True))
    whole = list(zip(LPS, TOKS, strict=True))
    absorb("s", 1, _event(TOKS[3:] + TOKS[-1:], 5, chunk + whole, ABORT), st)
    assert st.tokens == TOKS and st.logprobs == LPS and st.finish == "abort"


def test_a_coalesced_abort_without_logprobs_keeps_the_queued_tokens() -> None:
    st = _streamed(3, logprobs=False)
    absorb("s", 1, _event(TOKS[3:] + TOKS[-1:], 5, None, ABORT), st)
    assert st.tokens == TOKS


def test_a_plain_abort_echo_changes_nothing() -> None:
    st = _streamed(5)
    absorb("s", 1, _event(TOKS[-1:], 5, list(zip(LPS, TOKS, strict=True)), ABORT), st)
    assert st.tokens == TOKS and st.logprobs == LPS


def test_logprobs_that_cannot_be_aligned_are_a_shape_error_and_none_are_kept() -> None:
    st = _streamed(3)
    with pytest.raises(ResponseShapeError, match="cannot be aligned"):
        absorb("s", 1, _event(TOKS[3:], 5, [(LPS[3], TOKS[3])]), st)
    assert st.output_logprobs() == ()  # the tokens arrived, their logprobs did not: none is trained on


def test_an_error_event_marked_4xx_is_a_rejection() -> None:
    err = {"message": "The input (70 tokens) is longer than the model's context length (64 tokens).",
           "type": "invalid_request_error", "code": 400, "retryable": False}
    with pytest.raises(RequestRejectedError, match="context length") as exc:
        absorb("s", 1, {"error": err}, SglangStream())
    assert exc.value.status_code == 400
    with pytest.raises(EngineError) as other:
        absorb("s", 1, {"error": {"message": "boom", "code": 500}}, SglangStream())
    assert not isinstance(other.value, RequestRejectedError)


def test_unseeded_requests_get_their_own_seed_under_deterministic_inference(tmp_path: Path) -> None:
    """SGLang samples an unseeded request with seed 42 under ``--enable-deterministic-inference``:
    two members of one GRPO group must not get the same seed."""
    eng = SglangEngine(tmp_path, SglangSettings(deterministic_inference=True))
    a, b = (GenerateRequest(f"g0-t{i}", (1, 2), SamplingParams(max_new_tokens=4)) for i in range(2))
    sa, sb = (eng._body(r, stream=True)["sampling_params"]["sampling_seed"] for r in (a, b))
    assert sa == request_seed(a.rid) and sa != sb and sa != 42
    seeded = GenerateRequest("x", (1,), SamplingParams(max_new_tokens=1, seed=7))
    assert eng._body(seeded, stream=True)["sampling_params"]["sampling_seed"] == 7
    plain = SglangEngine(tmp_path, SglangSettings())
    assert "sampling_seed" not in plain._body(a, stream=True)["sampling_params"]


def test_the_weight_group_backend_defaults_to_the_trainers() -> None:
    engine_default = inspect.signature(SglangEngine.init_weights_group).parameters["backend"].default
    trainer_default = inspect.signature(TrainerClient.init_broadcast).parameters["backend"].default
    assert engine_default == trainer_default


def test_the_startup_poll_outlasts_sglangs_health_handler() -> None:
    assert SglangServer.health_timeout_s > 20  # SGLANG_HEALTH_CHECK_TIMEOUT's default


def _part(ids: tuple[int, ...], finish: FinishReason) -> GenerateResult:
    return GenerateResult("r", ids, (math.nan,) * len(ids), finish, 0, 3)


def test_an_aborted_part_ending_in_a_stop_token_is_not_continued() -> None:
    original = GenerateRequest("r", (1, 2, 3), SamplingParams(max_new_tokens=50, stop_token_ids=(99,)))
    ended = [_part((5, 6, 99), FinishReason.ABORT)]
    assert is_finished(original, ended) and continuation_request(original, ended, 1) is None
    assert final_finish_reason(original, ended) is FinishReason.STOP
    cut = [_part((5, 99, 6), FinishReason.ABORT)]
    assert not is_finished(original, cut) and final_finish_reason(original, cut) is FinishReason.ABORT
