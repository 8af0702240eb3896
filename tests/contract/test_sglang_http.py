"""Our unmodified ``SglangEngine`` over real HTTP against SGLang's own FastAPI app.

``tests/contract/sglang_app_server.py`` serves SGLang's ``http_server.app`` (routes, request
dataclasses, the ``/generate`` contract gate, SSE framing, error events, ``/health``,
``/model_info``) with only the engine side behind its tokenizer-manager seam replaced. The engine
launches it as it launches ``sglang.launch_server`` (``SglangSettings.module``), so the argv is
parsed by SGLang's own ``prepare_server_args`` too. Every request body the engine sends is parsed
by SGLang's own types on the way in (``GET /pearl_test/state`` shows what arrived).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from pearl.core.state import Role
from pearl.engines.base import (
    EngineError,
    FinishReason,
    GenerateRequest,
    KVTransferError,
    PauseMode,
    ResponseShapeError,
    ResponseTooLargeError,
    SamplingParams,
    ServerSpec,
    StreamCutError,
    WeightVersionError,
)
from pearl.engines.resume import continuation_request, generated_tokens
from pearl.engines.sglang import SglangEngine, SglangSettings
from pearl.engines.sglang_fake import next_token
from tests.conftest import missing_setup

from .sglang_env import MISSING, ROOT, installed

pytestmark = [pytest.mark.sglang_contract, pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(600)]

MODEL = str(ROOT / ".models" / "smollm2-135m")
PROMPT = tuple(range(100, 116))
LONG = 16384  # tokens: one cumulative event with logprobs is ~560 KiB, past aiohttp's 512 KiB line limit


def settings(**kw: Any) -> SglangSettings:
    return SglangSettings(module="tests.contract.sglang_app_server", start_timeout_s=300,
                          extra_env=(("PYTHONPATH", str(ROOT)),), **kw)


def expected(prompt: tuple[int, ...], n: int) -> tuple[list[int], list[float]]:
    ctx, toks, lps = list(prompt), [], []
    for _ in range(n):
        t, lp = next_token(0, ctx)
        ctx.append(t)
        toks.append(t)
        lps.append(lp)
    return toks, lps


def req(rid: str, n: int, prompt: tuple[int, ...] = PROMPT) -> GenerateRequest:
    return GenerateRequest(rid, prompt, SamplingParams(max_new_tokens=n, temperature=0.0, seed=3))


def wire_id(name: str) -> str:
    """The wire id the engine sends for ``req(name, ...)`` (turn 0, first attempt)."""
    return GenerateRequest(name, (1,), SamplingParams(max_new_tokens=1)).rid


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engines(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[SglangEngine, SglangEngine]]:
    """``inc``: a colocated server with incremental streaming (PEARL's default); ``cum``: a decode
    server (mooncake, role switch on) streaming cumulatively (SGLang's default)."""
    if not installed():
        missing_setup(MISSING)
    inc = SglangEngine(tmp_path_factory.mktemp("inc"), settings())
    cum = SglangEngine(tmp_path_factory.mktemp("cum"), settings(
        incremental_streaming=False, transfer_backend="mooncake", enable_pd_role_switch=True,
        decode_cuda_graph_memory_gb=2.5))
    try:
        await asyncio.gather(inc.launch(ServerSpec("c", ("0",), Role.COLOCATED, MODEL, 4)),
                             cum.launch(ServerSpec("d", ("1",), Role.DECODE, MODEL, 4)))
        yield inc, cum
    finally:
        await asyncio.gather(inc.close(), cum.close())


async def state(eng: SglangEngine, wid: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.get(f"{eng.server(wid).url}/pearl_test/state") as r:
        return dict(await r.json())


async def test_generate_stream_incremental(engines: tuple[SglangEngine, SglangEngine]) -> None:
    inc, _ = engines
    toks, lps = expected(PROMPT, 200)
    a = await inc.generate("c", req("g-inc", 200))
    assert list(a.output_ids) == toks and list(a.logprobs) == pytest.approx(lps)
    assert a.finish_reason is FinishReason.LENGTH and a.weight_version == 4
    assert await inc.weight_version("c") == 4 and await inc.healthy("c")
    body = next(b for b in (await state(inc, "c"))["bodies"] if b["route"] == "/generate")
    assert body["type"] == "GenerateReqInput"  # parsed by SGLang's own dataclass, through its contract gate
    assert body["body"]["sampling_params"] == {"max_new_tokens": 200, "temperature": 0.0, "top_p": 1.0,
                                               "sampling_seed": 3}
    assert body["body"]["stream"] is True and body["body"]["return_logprob"] is True


async def test_largest_incremental_response_and_cumulative_line_too_long(
        engines: tuple[SglangEngine, SglangEngine]) -> None:
    """A 16K-token response streams whole incrementally; SGLang's cumulative events outgrow the
    client's line limit: ``ResponseTooLargeError``, the remote request aborted, the partial kept."""
    inc, cum = engines
    toks, _ = expected(PROMPT, LONG)
    big = await inc.generate("c", req("big", LONG))
    assert list(big.output_ids) == toks and len(big.logprobs) == LONG
    d = cum.server("d")
    handle = {"bootstrap_host": d.spec.host, "bootstrap_port": d.port, "bootstrap_room": 1}  # a reachable "prefill"
    with pytest.raises(ResponseTooLargeError, match="line limit") as info:
        await cum.pd_decode("d", req("big-cum", LONG), handle)
    assert info.value.partial is not None and info.value.partial.finish_reason is FinishReason.ABORT
    assert list(info.value.partial.output_ids) == toks[:len(info.value.partial.output_ids)]
    assert wire_id("big-cum") in (await state(cum, "d"))["abort_calls"]


async def test_decode_side_kv_failure_is_a_kv_transfer_error(engines: tuple[SglangEngine, SglangEngine]) -> None:
    _, cum = engines
    handle = {"bootstrap_host": "127.0.0.1", "bootstrap_port": 1, "bootstrap_room": 12345}
    with pytest.raises(KVTransferError, match="status 500") as info:
        await cum.pd_decode("d", req("kv", 8), handle, prefill_id="p-gone")
    assert info.value.partial is not None and info.value.partial.output_ids == ()


async def test_abort_keeps_partial_and_resume_continues(engines: tuple[SglangEngine, SglangEngine]) -> None:
    """An incremental stream's abort event repeats the last token: the partial output has each
    token once, and prompt + partial resumes to the uninterrupted output."""
    inc, _ = engines
    toks, lps = expected(PROMPT, 4000)
    original = req("ab", 4000)
    task = asyncio.create_task(inc.generate("c", original))
    await asyncio.wait_for(inc.wait_tokens(wire_id("ab"), 64), 120)
    await inc.abort("c", wire_id("ab"))
    part = await task
    n = len(part.output_ids)
    assert part.finish_reason is FinishReason.ABORT and 64 <= n < 4000
    assert list(part.output_ids) == toks[:n] and list(part.logprobs) == pytest.approx(lps[:n])
    cont = continuation_request(original, [part], attempt=1)
    assert cont is not None
    rest = await inc.generate("c", cont)
    assert generated_tokens([part, rest]) == toks


async def test_paused_server_holds_generate_and_pause_abort_ends_streams(
        engines: tuple[SglangEngine, SglangEngine]) -> None:
    inc, _ = engines
    await inc.pause("c")
    assert await inc.healthy("c")  # /ping stays 200 while paused
    held = asyncio.create_task(inc.generate("c", req("held", 8)))
    done, _ = await asyncio.wait({held}, timeout=0.5)
    assert not done  # SGLang's tokenizer waits on its pause condition
    await inc.resume("c")
    assert len((await held).output_ids) == 8
    running = asyncio.create_task(inc.generate("c", req("pz", 4000)))
    await asyncio.wait_for(inc.wait_tokens(wire_id("pz"), 64), 120)
    await inc.pause("c", mode=PauseMode.ABORT)
    part = await running
    assert part.finish_reason is FinishReason.ABORT and len(part.output_ids) >= 64
    await inc.resume("c")


async def test_weight_updates_and_a_version_that_never_arrives(engines: tuple[SglangEngine, SglangEngine]) -> None:
    inc, _ = engines
    await inc.load_weights("c", "/snapshots/v5", 5)
    assert await inc.weight_version("c") == 5 and (await inc.generate("c", req("w5", 4))).weight_version == 5
    with pytest.raises(WeightVersionError, match="weight_version 5, not 6"):
        await inc.load_weights("c", "/snapshots/v6-stale", 6)
    with pytest.raises(EngineError, match="not in"):
        await inc.update_weights_from_distributed("c", ["w"], ["bfloat16"], [[2]], 6, group_name="nope")
    await inc.init_weights_group("c", "127.0.0.1", 29511, 1, 2)
    await inc.update_weights_from_distributed("c", ["a", "b"], ["bfloat16", "bfloat16"], [[2, 3], [4]], 6,
                                              bucketed=True)
    assert await inc.weight_version("c") == 6
    bodies = {b["route"]: b for b in (await state(inc, "c"))["bodies"]}
    up = bodies["/update_weights_from_distributed"]
    assert up["type"] == "UpdateWeightsFromDistributedReqInput"
    assert (up["body"]["load_format"], up["body"]["abort_all_requests"], up["body"]["weight_version"]) == \
        ("flattened_bucket", True, "6")
    assert bodies["/init_weights_update_group"]["body"]["world_size"] == 2
    assert bodies["/update_weights_from_disk"]["type"] == "UpdateWeightFromDiskReqInput"
    assert bodies["/pause_generation"]["body"]["mode"] == "abort"


async def test_release_and_resume_memory(engines: tuple[SglangEngine, SglangEngine]) -> None:
    inc, _ = engines
    await inc.release_memory("c")
    await inc.resume_memory("c")
    assert len((await inc.generate("c", req("rel", 4))).output_ids) == 4
    routes = [b["route"] for b in (await state(inc, "c"))["bodies"]]
    assert "/release_memory_occupation" in routes and "/resume_memory_occupation" in routes


async def test_bad_streams_are_named_errors_with_the_request_aborted(
        engines: tuple[SglangEngine, SglangEngine]) -> None:
    inc, _ = engines
    with pytest.raises(StreamCutError, match="before \\[DONE\\]") as cut:
        await inc.generate("c", req("cut-1", 200))
    assert cut.value.partial is not None
    assert len(cut.value.partial.output_ids) % 64 == 0  # what had arrived is kept
    with pytest.raises(ResponseShapeError, match="lacks output_ids") as shape:
        await inc.generate("c", req("shape-1", 4000))
    assert shape.value.partial is not None
    assert wire_id("shape-1") in (await state(inc, "c"))["abort_calls"]
    with pytest.raises(EngineError, match="out of range"):  # SGLang's error event, then [DONE]
        await inc.generate("c", req("valueerror-1", 4))


async def test_role_switch_in_place_with_what_sglang_needs(engines: tuple[SglangEngine, SglangEngine]) -> None:
    _, cum = engines
    pid = cum.server("d").proc.pid  # type: ignore[union-attr]
    await cum.set_role("d", Role.PREFILL)
    await cum.set_role("d", Role.DECODE)
    assert cum.server("d").proc.pid == pid  # type: ignore[union-attr]  # in place, both ways
    st = await state(cum, "d")
    switches = [b["body"] for b in st["bodies"] if b["route"] == "/pd_role_switch"]
    assert [s["new_role"] for s in switches] == ["prefill", "decode"]
    assert switches[1]["decode_cuda_graph_memory_gb"] == 2.5 and st["mode"] == "decode"
    assert json.dumps(switches[0]).count("decode_cuda_graph_memory_gb\": null") == 1
