"""Tests whose premise is "interrupt a request mid-generation" on a real server: the server may win
the race (finish the request before the abort lands), and such a run says nothing, so it is tried
again. Shared by the vLLM (CPU) and SGLang (GPU) integration tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from pearl.engines.base import FinishReason, GenerateRequest, GenerateResult

RACE_ATTEMPTS = 3


async def abort_mid_generation(engine: Any, worker_id: str, make_req: Callable[[str], GenerateRequest],
                               ref: GenerateResult, after_tokens: int) -> tuple[GenerateRequest, GenerateResult]:
    """Start ``make_req(rid)`` on ``worker_id``, abort it once ``after_tokens`` have streamed, and
    return (request, partial result). A run the server finished first must equal ``ref`` (the
    uninterrupted output); it is tried again, up to ``RACE_ATTEMPTS`` times."""
    for attempt in range(RACE_ATTEMPTS):
        req = make_req(f"ab{attempt}")
        task = asyncio.create_task(engine.generate(worker_id, req))
        await asyncio.wait_for(engine.wait_tokens(req.rid, after_tokens), 120)  # or the stream ended
        await engine.abort(worker_id, req.rid)
        part: GenerateResult = await task
        if part.finish_reason is FinishReason.ABORT:
            return req, part
        assert part.output_ids == ref.output_ids
    pytest.fail(f"the abort never landed mid-generation in {RACE_ATTEMPTS} tries")
