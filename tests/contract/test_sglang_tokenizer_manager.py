"""Our unmodified ``SglangEngine`` against SGLang's own ``TokenizerManager`` and weight-update gate.

``tests/contract/sglang_tm_server.py`` serves SGLang's HTTP app over SGLang's real
``TokenizerManager``; only the scheduler and detokenizer processes behind its ZMQ sockets are
replaced (``FakeScheduler``), and the scheduler's weight-update and memory requests go to SGLang's
own ``SchedulerWeightUpdaterManager``. So abort echoes, coalesced chunks, 400 / 503 refusals, the
pause modes and the weight-update session reach the engine exactly as SGLang's tokenizer shapes
them. ``GET /pearl_test/state`` shows what reached the scheduler.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from pearl.core.state import Role
from pearl.engines import sglang
from pearl.engines.base import (
    EngineError,
    FinishReason,
    GenerateRequest,
    PauseMode,
    RequestRejectedError,
    SamplingParams,
    ServerSpec,
    WeightUpdateError,
)
from pearl.engines.resume import continuation_request, generated_tokens
from pearl.engines.sglang import NO_WEIGHTS, SglangEngine, SglangSettings
from tests.conftest import missing_setup

from .sglang_env import MISSING, ROOT, installed

pytestmark = [pytest.mark.sglang_contract, pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(600)]

MODEL = str(ROOT / ".models" / "smollm2-135m")
PROMPT = tuple(range(100, 116))
MAX_INPUT = 40  # --max-total-tokens 41: the scheduler refuses prompts of 40 tokens or more
CONTEXT = 1024


def settings(**kw: Any) -> SglangSettings:
    return SglangSettings(module="tests.contract.sglang_tm_server", start_timeout_s=300,
                          extra_env=(("PYTHONPATH", str(ROOT)),), **kw)


def req(rid: str, n: int, prompt: tuple[int, ...] = PROMPT, stops: tuple[int, ...] = ()) -> GenerateRequest:
    return GenerateRequest(rid, prompt, SamplingParams(max_new_tokens=n, temperature=0.0, stop_token_ids=stops))


def wire_id(name: str) -> str:
    """The wire id the engine sends for ``req(name, ...)`` (turn 0, first attempt)."""
    return GenerateRequest(name, (1,), SamplingParams(max_new_tokens=1)).rid


async def state(eng: SglangEngine, wid: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.get(f"{eng.server(wid).url}/pearl_test/state") as r:
        return dict(await r.json())


async def post(eng: SglangEngine, wid: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.post(f"{eng.server(wid).url}{path}", json=body) as r:
        return r.status, await r.json(content_type=None)


async def expected(eng: SglangEngine, wid: str, prompt: tuple[int, ...], n: int) -> tuple[list[int], list[float]]:
    """The uninterrupted output of the server's current weights (its own greedy run)."""
    res = await eng.generate(wid, req(f"ref-{len(prompt)}-{n}-{id(prompt)}", n, prompt))
    return list(res.output_ids), list(res.logprobs)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engines(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[SglangEngine, SglangEngine]]:
    """``tm``: PEARL's settings (incremental streaming, weights CPU backup) with a small KV pool
    and queue; ``nb``: the same without ``weights_cpu_backup``."""
    if not installed():
        missing_setup(MISSING)
    args = ("--context-length", str(CONTEXT), "--max-total-tokens", str(MAX_INPUT + 1),
            "--max-queued-requests", "2")
    tm = SglangEngine(tmp_path_factory.mktemp("tm"), settings(extra_args=args))
    nb = SglangEngine(tmp_path_factory.mktemp("nb"), settings(weights_cpu_backup=False))
    try:
        await asyncio.gather(tm.launch(ServerSpec("t", ("0",), Role.COLOCATED, MODEL, 1)),
                             nb.launch(ServerSpec("n", ("1",), Role.COLOCATED, MODEL, 1)))
        yield tm, nb
    finally:
        await asyncio.gather(tm.close(), nb.close())


async def test_update_runs_inside_a_weight_update_session(engines: tuple[SglangEngine, SglangEngine]) -> None:
    """SGLang's gate refuses an update outside ``begin_weight_update`` / ``end_weight_update``; the
    engine's update opens and closes the session around it and the version moves."""
    tm, _ = engines
    code, body = await post(tm, "t", "/update_weights_from_distributed",
                            {"names": ["w"], "dtypes": ["bfloat16"], "shapes": [[2]], "group_name": "g"})
    assert code == 400 and "must run between begin_weight_update() and end_weight_update()" in body["message"]
    await tm.init_weights_group("t", "127.0.0.1", 29512, 1, 2, group_name="g")
    await tm.update_weights_from_distributed("t", ["w"], ["bfloat16"], [[2]], 7, group_name="g")
    assert await tm.weight_version("t") == 7
    st = await state(tm, "t")
    kinds = [r["type"] for r in st["received"] if r["type"] != "AbortReq"]  # abort_all_requests
    begin = kinds.index("BeginWeightUpdateReqInput")
    assert kinds[begin:begin + 3] == ["BeginWeightUpdateReqInput", "UpdateWeightsFromDistributedReqInput",
                                      "EndWeightUpdateReqInput"]
    assert not st["session"]
    assert (await tm.generate("t", req("after-update", 4))).weight_version == 7


async def test_the_send_runs_once_every_session_is_open(engines: tuple[SglangEngine, SglangEngine]) -> None:
    tm, _ = engines
    seen: list[bool] = []

    async def send() -> str:
        seen.append((await state(tm, "t"))["session"])
        return "broadcast"
    assert await tm.update_weights_from_distributed("t", ["w"], ["bfloat16"], [[2]], 8, group_name="g",
                                                    send=send) == "broadcast"
    assert seen == [True] and await tm.weight_version("t") == 8


async def test_a_refused_update_cancels_the_send_and_ends_the_session(
        engines: tuple[SglangEngine, SglangEngine]) -> None:
    tm, _ = engines
    cancelled = asyncio.Event()

    async def hanging_send() -> None:
        try:
            await asyncio.Event().wait()  # a broadcast whose receivers never come
        finally:
            cancelled.set()
    with pytest.raises(WeightUpdateError, match="Group nope not in"):
        await asyncio.wait_for(tm.update_weights_from_distributed("t", ["w"], ["bfloat16"], [[2]], 9,
                                                                  group_name="nope", send=hanging_send), 60)
    assert cancelled.is_set() and not (await state(tm, "t"))["session"]
    assert len((await tm.generate("t", req("after-refusal", 4))).output_ids) == 4


async def test_an_aborted_running_request_decodes_one_more_token_and_resumes_exactly(
        engines: tuple[SglangEngine, SglangEngine]) -> None:
    tm, _ = engines
    toks, lps = await expected(tm, "t", PROMPT, 300)
    original = req("ab", 300)
    task = asyncio.create_task(tm.generate("t", original))
    streamed = await asyncio.wait_for(tm.wait_tokens(wire_id("ab"), 8), 60)
    await tm.abort("t", wire_id("ab"))
    part = await task
    n = len(part.output_ids)
    assert part.finish_reason is FinishReason.ABORT and n > streamed
    assert list(part.output_ids) == toks[:n] and list(part.logprobs) == pytest.approx(lps[:n])
    cont = continuation_request(original, [part], attempt=1)
    assert cont is not None
    assert generated_tokens([part, await tm.generate("t", cont)]) == toks


async def test_an_abort_whose_extra_token_is_a_stop_token_finishes_the_turn(
        engines: tuple[SglangEngine, SglangEngine]) -> None:
    """The abort lands while the 5th token is decoded (``abort-at-5-``); the 6th, decoded after
    it, is a stop token, and SGLang's abort-before-stop order reports the request as aborted."""
    tm, _ = engines
    toks, _ = await expected(tm, "t", PROMPT, 8)
    assert toks[5] not in toks[:5]
    original = req("abort-at-5-stop", 50, stops=(toks[5],))
    part = await tm.generate("t", original)
    assert list(part.output_ids) == toks[:6] and part.finish_reason is FinishReason.STOP
    assert continuation_request(original, [part], attempt=1) is None


async def test_a_chunk_coalesced_with_its_abort_echo_keeps_tokens_and_logprobs_aligned(
        engines: tuple[SglangEngine, SglangEngine]) -> None:
    tm, _ = engines
    toks, lps = await expected(tm, "t", PROMPT, 3)
    part = await tm.generate("t", req("coalesce-1", 50))
    assert wire_id("coalesce-1") in (await state(tm, "t"))["coalesced"]  # SGLang's tokenizer merged chunk + echo
    assert part.finish_reason is FinishReason.ABORT
    assert list(part.output_ids) == toks and list(part.logprobs) == pytest.approx(lps)


async def test_pause_modes(engines: tuple[SglangEngine, SglangEngine]) -> None:
    """in_place and retract hold running requests until continue; a retracted request's abort is
    echoed with every token once (no extra step); abort ends streams with their partial."""
    tm, _ = engines
    toks, _ = await expected(tm, "t", PROMPT, 200)
    for mode in (PauseMode.KEEP, PauseMode.RETRACT):  # SGLang's in_place and retract
        task = asyncio.create_task(tm.generate("t", req(f"p-{mode}", 200)))
        await asyncio.wait_for(tm.wait_tokens(wire_id(f"p-{mode}"), 4), 60)
        await tm.pause("t", mode=mode)
        await tm.resume("t")
        assert list((await task).output_ids) == toks
    task = asyncio.create_task(tm.generate("t", req("p-retract-abort", 200)))
    seen = await asyncio.wait_for(tm.wait_tokens(wire_id("p-retract-abort"), 4), 60)
    await tm.pause("t", mode=PauseMode.RETRACT)
    await tm.abort("t", wire_id("p-retract-abort"))
    part = await task
    await tm.resume("t")
    assert part.finish_reason is FinishReason.ABORT and list(part.output_ids) == toks[:len(part.output_ids)]
    assert len(part.output_ids) >= seen
    task = asyncio.create_task(tm.generate("t", req("p-abort", 200)))
    await asyncio.wait_for(tm.wait_tokens(wire_id("p-abort"), 4), 60)
    await tm.pause("t", mode=PauseMode.ABORT)
    part = await task
    await tm.resume("t")
    assert part.finish_reason is FinishReason.ABORT and list(part.output_ids) == toks[:len(part.output_ids)]


async def test_refusals_are_named_and_keep_no_token(engines: tuple[SglangEngine, SglangEngine],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    tm, _ = engines
    with pytest.raises(RequestRejectedError, match="longer than the model's context length") as ctx:
        await tm.generate("t", req("ctx", 4, tuple(range(CONTEXT + 10))))
    assert ctx.value.status_code == 400
    with pytest.raises(RequestRejectedError, match="exceeds the maximum allowed length") as big:
        await tm.generate("t", req("big", 4, tuple(range(MAX_INPUT + 5))))
    assert big.value.status_code == 400 and "1 output token(s) are dropped" in str(big.value)
    monkeypatch.setattr(sglang, "CAPACITY_BACKOFF_S", 0.01)
    long = [asyncio.create_task(tm.generate("t", req(f"q{i}", 900))) for i in range(2)]
    await asyncio.gather(*(asyncio.wait_for(tm.wait_tokens(wire_id(f"q{i}"), 2), 60) for i in range(2)))
    with pytest.raises(EngineError, match=r"no room on the server after 4 attempts \(503: The request queue is full"):
        await tm.generate("t", req("queued", 4))
    await tm.abort("t")
    await asyncio.gather(*long)
    assert len((await tm.generate("t", req("room", 4))).output_ids) == 4


async def test_release_does_not_pause(engines: tuple[SglangEngine, SglangEngine]) -> None:
    """SGLang's ``/release_memory_occupation`` alone leaves new requests free to reach the
    scheduler; ``release_memory`` pauses first, so nothing reaches a released scheduler."""
    tm, _ = engines
    code, _ = await post(tm, "t", "/release_memory_occupation", {})
    assert code == 200
    await tm.generate("t", req("while-released", 2))  # not held: it ran on the freed weights
    await post(tm, "t", "/resume_memory_occupation", {})
    await tm.release_memory("t")
    held = asyncio.create_task(tm.generate("t", req("held", 2)))
    done, _ = await asyncio.wait({held}, timeout=0.5)
    assert not done
    await tm.resume_memory("t")
    assert len((await held).output_ids) == 2


async def test_release_and_resume_keep_the_weights_only_with_cpu_backup(
        engines: tuple[SglangEngine, SglangEngine]) -> None:
    """``release_memory_occupation`` keeps the buffers (``_export_static_state``), not the
    parameters: with ``--enable-weights-cpu-backup`` the resumed server generates what it did;
    without, its weights are gone until a load, and the engine says so."""
    tm, nb = engines
    for eng, wid in ((tm, "t"), (nb, "n")):
        await eng.load_weights(wid, MODEL, 1)  # defined weights, whatever earlier tests left
        before = await eng.generate(wid, req(f"{wid}-before", 6))
        await eng.release_memory(wid)
        await eng.resume_memory(wid)
        after = await eng.generate(wid, req(f"{wid}-after", 6))
        assert "pause:weights" in (await state(eng, wid))["saver"]
        if eng is tm:
            assert after.output_ids == before.output_ids and after.logprobs == before.logprobs
            assert "--enable-weights-cpu-backup" in eng.server(wid).command()
        else:
            assert after.output_ids != before.output_ids  # generated from garbage
            assert await eng.weight_version(wid) == NO_WEIGHTS
            await eng.load_weights(wid, MODEL, 2)
            assert (await eng.generate(wid, req(f"{wid}-reloaded", 6))).output_ids == before.output_ids


async def test_unseeded_requests_reach_the_scheduler_with_distinct_seeds(tmp_path_factory: pytest.TempPathFactory
                                                                         ) -> None:
    """Under ``--enable-deterministic-inference`` SGLang seeds an unseeded request with 42: the
    members of one group must arrive with seeds of their own."""
    eng = SglangEngine(tmp_path_factory.mktemp("det"), settings(
        deterministic_inference=True, extra_args=("--attention-backend", "triton")))  # one SGLang allows for it
    try:
        await eng.launch(ServerSpec("s", ("0",), Role.COLOCATED, MODEL, 1))
        for i in range(2):
            await eng.generate("s", GenerateRequest("g", PROMPT, SamplingParams(max_new_tokens=2), turn=i))
        seeds = [r["sampling_seed"] for r in (await state(eng, "s"))["received"] if r["rid"] in ("g/0", "g/1")]
        assert len(seeds) == 2 and None not in seeds and len(set(seeds)) == 2
    finally:
        await eng.close()

