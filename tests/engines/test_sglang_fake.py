"""``SglangEngine`` against the fake SGLang server, launched as real child processes.

The fake's "model" is ``sglang_fake.next_token`` (a pure function of the context and the loaded
weights), so expected outputs are computed here independently of the adapter.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import zlib
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from pearl.core.state import Role
from pearl.engines import sglang
from pearl.engines.base import (
    EngineDeadError,
    EngineError,
    EngineStartError,
    FinishReason,
    GenerateRequest,
    InferenceEngine,
    KVTransferError,
    PauseMode,
    RequestRejectedError,
    SamplingParams,
    ServerSpec,
    WeightUpdateError,
)
from pearl.engines.resume import continuation_request, generated_tokens
from pearl.engines.sglang import NO_WEIGHTS, SglangEngine, SglangSettings
from pearl.engines.sglang_fake import next_token

pytestmark = pytest.mark.asyncio(loop_scope="module")

PROMPT = tuple(range(500, 520))


def fake_settings(delay: float = 0.002, **kw: object) -> SglangSettings:
    return SglangSettings(module="pearl.engines.sglang_fake", start_timeout_s=60,
                          extra_args=("--token-delay-s", str(delay)), **kw)  # type: ignore[arg-type]


def expected(model_path: str, prompt: tuple[int, ...], n: int) -> tuple[list[int], list[float]]:
    seed = zlib.crc32(model_path.encode())
    ctx, toks, lps = list(prompt), [], []
    for _ in range(n):
        t, lp = next_token(seed, ctx)
        ctx.append(t)
        toks.append(t)
        lps.append(lp)
    return toks, lps


def req(rid: str, n: int, prompt: tuple[int, ...] = PROMPT) -> GenerateRequest:
    return GenerateRequest(rid, prompt, SamplingParams(max_new_tokens=n, temperature=0.0))


def wire_id(name: str) -> str:
    """The wire id the engine sends for ``req(name, ...)`` (turn 0, first attempt)."""
    return GenerateRequest(name, (1,), SamplingParams(max_new_tokens=1)).rid


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[SglangEngine]:
    eng = SglangEngine(tmp_path_factory.mktemp("sgl"), fake_settings(
        delay=0.01, enable_pd_role_switch=True, transfer_backend="mooncake", decode_cuda_graph_memory_gb=1.0))
    try:
        await asyncio.gather(
            eng.launch(ServerSpec("c", ("0",), Role.COLOCATED, "base-model")),
            eng.launch(ServerSpec("p", ("1",), Role.PREFILL, "base-model")),
            eng.launch(ServerSpec("d", ("2",), Role.DECODE, "base-model")))
        yield eng
    finally:
        await eng.close()


async def test_contract_and_colocated_generate(engine: SglangEngine) -> None:
    assert isinstance(engine, InferenceEngine)
    res = await engine.generate("c", req("g1", 12))
    toks, lps = expected("base-model", PROMPT, 12)
    assert list(res.output_ids) == toks and list(res.logprobs) == pytest.approx(lps)
    assert res.finish_reason is FinishReason.LENGTH and res.prompt_tokens == len(PROMPT)
    assert res.weight_version == 0 and await engine.weight_version("c") == 0
    assert await engine.healthy("c")
    assert "--tp-size" in engine.server("c").command()


async def test_stop_token_ends_request(engine: SglangEngine) -> None:
    toks, _ = expected("base-model", PROMPT, 6)
    r = GenerateRequest("st", PROMPT, SamplingParams(max_new_tokens=50, stop_token_ids=(toks[3],)))
    res = await engine.generate("c", r)
    assert res.finish_reason is FinishReason.STOP and list(res.output_ids) == toks[:4]


async def test_pd_equals_colocated(engine: SglangEngine) -> None:
    ref = await engine.generate("c", req("ref", 16))
    pd = await engine.generate_pd("p", "d", req("pd", 16))
    assert pd.output_ids == ref.output_ids and pd.logprobs == ref.logprobs
    assert pd.worker_id == "p" and pd.decode_worker_id == "d"
    assert pd.timings.prefill_s > 0 and pd.timings.decode_s > 0


async def test_pd_without_a_prefill_server_is_a_kv_error(engine: SglangEngine) -> None:
    with pytest.raises(KVTransferError, match="bootstrap"):
        await engine.generate_pd("c", "d", req("nokv", 4))  # "c" runs no bootstrap server


async def test_abort_keeps_partial_and_resume_is_seamless(engine: SglangEngine) -> None:
    toks, _ = expected("base-model", PROMPT, 200)
    original = req("ab", 200)
    task = asyncio.create_task(engine.generate("c", original))
    await asyncio.wait_for(engine.wait_tokens(wire_id("ab"), 5), 30)
    await engine.abort("c", wire_id("ab"))
    part = await task
    assert part.finish_reason is FinishReason.ABORT and 5 <= len(part.output_ids) < 200
    cont = continuation_request(original, [part], attempt=1)
    assert cont is not None
    rest = await engine.generate("c", cont)
    assert generated_tokens([part, rest]) == toks


async def test_pause_in_place_then_continue_and_pause_abort(engine: SglangEngine) -> None:
    task = asyncio.create_task(engine.generate("c", req("pz", 60)))
    await asyncio.wait_for(engine.wait_tokens(wire_id("pz"), 3), 30)
    await engine.pause("c")
    await engine.resume("c")
    res = await task
    assert res.finish_reason is FinishReason.LENGTH and len(res.output_ids) == 60
    task = asyncio.create_task(engine.generate("c", req("pa", 500)))
    await asyncio.wait_for(engine.wait_tokens(wire_id("pa"), 3), 30)
    await engine.pause("c", mode=PauseMode.ABORT)
    part = await task
    assert part.finish_reason is FinishReason.ABORT and len(part.output_ids) >= 3
    await engine.resume("c")


async def test_weight_updates_disk_and_distributed(engine: SglangEngine) -> None:
    await engine.load_weights("c", "/snapshots/v1", 1)
    assert await engine.weight_version("c") == 1
    res = await engine.generate("c", req("w1", 8))
    assert list(res.output_ids) == expected("/snapshots/v1", PROMPT, 8)[0] and res.weight_version == 1
    with pytest.raises(WeightUpdateError, match="Failed to receive weights: Group nope not in"):
        await engine.update_weights_from_distributed("c", ["w"], ["bfloat16"], [[2]], 2, group_name="nope")
    await engine.init_weights_group("c", "127.0.0.1", 29500, 1, 2)
    sent = await engine.update_weights_from_distributed("c", ["w"], ["bfloat16"], [[2]], 2,
                                                        send=lambda: asyncio.sleep(0, result="sent"))
    assert sent == "sent" and await engine.weight_version("c") == 2
    assert (await engine.generate("c", req("w2", 4))).weight_version == 2


async def test_a_refused_weight_update_cancels_the_send_and_closes_the_session(engine: SglangEngine) -> None:
    """The update is refused while the trainer's send waits for receivers that never come: the send
    is cancelled at once (not left to the group timeout), the session is closed and the server
    serves again; a refused begin sends nothing."""
    cancelled = asyncio.Event()
    started: list[str] = []
    before = await engine.weight_version("c")

    async def hanging_send() -> None:
        started.append("send")
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()
    with pytest.raises(WeightUpdateError, match="Group nope not in"):
        await asyncio.wait_for(engine.update_weights_from_distributed(
            "c", ["w"], ["bfloat16"], [[2]], 3, group_name="nope", send=hanging_send), 30)
    assert cancelled.is_set() and started == ["send"]
    assert await engine.weight_version("c") == before  # the refused update changed nothing
    srv = engine.server("c")
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{srv.url}/begin_weight_update", json={}) as r:  # the session was closed
            assert r.status == 200
        started.clear()
        with pytest.raises(WeightUpdateError, match="a weight-update session is already open"):
            await engine.update_weights_from_distributed("c", ["w"], ["bfloat16"], [[2]], 3, send=hanging_send)
        assert started == []  # refused at begin: nothing was sent
        async with http.post(f"{srv.url}/end_weight_update", json={}) as r:
            assert r.status == 200
    assert len((await engine.generate("c", req("after-refusal", 4))).output_ids) == 4


async def test_release_and_resume_memory_keep_the_weights(engine: SglangEngine) -> None:
    """With ``--enable-weights-cpu-backup`` (the default) a released and resumed server generates
    exactly what it did before; the liveness probe stays cheap while released."""
    before = await engine.generate("c", req("rel-0", 6))
    version = await engine.weight_version("c")
    await engine.release_memory("c")
    assert await engine.healthy("c")  # /ping: a flag check, while /health would time out
    await engine.resume_memory("c")
    assert await engine.weight_version("c") == version
    after = await engine.generate("c", req("rel-1", 6))
    assert after.output_ids == before.output_ids and after.logprobs == before.logprobs


async def test_role_switch_in_place_and_by_relaunch(engine: SglangEngine) -> None:
    pid = engine.server("d").proc.pid  # type: ignore[union-attr]
    await engine.set_role("d", Role.PREFILL)
    await engine.set_role("p", Role.DECODE)
    assert engine.server("d").proc.pid == pid  # type: ignore[union-attr]  # in place
    ref = await engine.generate("c", req("sw-ref", 8, PROMPT[:5]))
    pd = await engine.generate_pd("d", "p", req("sw", 8, PROMPT[:5]))
    assert list(pd.output_ids) == expected("base-model", PROMPT[:5], 8)[0]
    version = await engine.weight_version("c")
    assert ref.weight_version == version  # "c" may have other weights; the PD pair still runs the base model
    await engine.set_role("c", Role.DECODE)  # colocated -> decode needs a relaunch
    assert engine.server("c").mode == "decode" and engine.last_role_change_s > 0
    assert await engine.weight_version("c") == version  # the relaunch keeps the reported version


async def test_server_killed_mid_generation_raises_with_partial(tmp_path: Path) -> None:
    eng = SglangEngine(tmp_path, fake_settings(delay=0.01))
    try:
        await eng.launch(ServerSpec("k", ("0",), Role.COLOCATED, "base-model"))
        task = asyncio.create_task(eng.generate("k", req("kill", 1000)))
        await asyncio.wait_for(eng.wait_tokens(wire_id("kill"), 4), 30)
        os.kill(eng.server("k").proc.pid, signal.SIGKILL)  # type: ignore[union-attr]
        with pytest.raises(EngineDeadError) as err:
            await asyncio.wait_for(task, 30)
        assert err.value.exit_code == -signal.SIGKILL
        assert err.value.partial is not None and len(err.value.partial.output_ids) >= 4
        assert err.value.partial.finish_reason is FinishReason.ABORT
        assert not await eng.healthy("k")
        with pytest.raises(EngineDeadError, match="not running"):
            await eng.generate("k", req("after", 2))
    finally:
        await eng.close()


async def test_launch_failure_names_exit_code_and_log(tmp_path: Path) -> None:
    eng = SglangEngine(tmp_path, SglangSettings(python=sys.executable, module="pearl.no_such_module",
                                                start_timeout_s=60))
    with pytest.raises(EngineStartError) as err:
        await eng.launch(ServerSpec("bad", (), Role.COLOCATED, "m"))
    assert err.value.exit_code == 1 and "No module named" in err.value.log_tail
    await eng.close()


ORPHAN_SCRIPT = """
import asyncio, os, sys
from pearl.core.state import Role
from pearl.engines.base import ServerSpec
from pearl.engines import sglang
from pearl.engines.sglang import NO_WEIGHTS, SglangEngine, SglangSettings

async def main():
    eng = SglangEngine(sys.argv[1], SglangSettings(module="pearl.engines.sglang_fake", start_timeout_s=60))
    await eng.launch(ServerSpec("x", (), Role.COLOCATED, "m"))
    print(eng.server("x").proc.pid, flush=True)
    os._exit(0)  # the owner dies without close()

asyncio.run(main())
"""


async def test_servers_die_with_their_owner(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", ORPHAN_SCRIPT, str(tmp_path),
                                                stdout=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    server_pid = int(out.decode().split()[-1])
    try:
        pidfd = os.pidfd_open(server_pid)
    except ProcessLookupError:
        return  # already gone
    gone = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_reader(pidfd, gone.set)  # readable when the process exits
    try:
        await asyncio.wait_for(gone.wait(), 30)
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)


async def test_cross_node_pd_runs_each_half_through_its_nodes_agent(tmp_path: Path) -> None:
    """Two node agents, each with its own ``SglangEngine`` (one node's prefill server, the other's
    decode server): ``pd_prefill`` on the prefill node's agent returns the bootstrap coordinates at
    once, ``pd_decode`` on the decode node's agent pulls the KV server to server; the output equals
    a colocated request's. A handle whose room no prefill server holds is a ``KVTransferError``."""
    import aiohttp

    from pearl.runtime.node import agent as na

    token = "agent-token-0123456789abcdef"
    engines = {f"node{r}": SglangEngine(tmp_path / f"n{r}", fake_settings()) for r in range(2)}
    agents = {n: na.NodeAgent(n, int(n[-1]), e, token) for n, e in engines.items()}
    for a in agents.values():
        await a.start()
    try:
        async with aiohttp.ClientSession() as http:
            clients = {n: na.AgentClient(a.url, token, http) for n, a in agents.items()}
            assert all([(await c.health())["split_pd"] for c in clients.values()])
            eng = na.RemoteEngine(clients, node_of=lambda dev: f"node{dev[1]}")
            await asyncio.gather(eng.launch(ServerSpec("p0", ("n0",), Role.PREFILL, "base-model")),
                                 eng.launch(ServerSpec("d1", ("n1",), Role.DECODE, "base-model")))
            pd = await eng.generate_pd("p0", "d1", req("x0", 10))
            toks, lps = expected("base-model", PROMPT, 10)
            assert list(pd.output_ids) == toks and list(pd.logprobs) == pytest.approx(lps)
            assert pd.worker_id == "p0" and pd.decode_worker_id == "d1" and pd.finish_reason is FinishReason.LENGTH
            assert "p0" in engines["node0"]._servers and "d1" in engines["node1"]._servers  # each half on its node
            # the halves by hand: a handle the prefill server never registered fails on the decode side
            handle = await engines["node0"].pd_prefill("p0", req("x1", 4))
            assert handle is not None and set(handle) == {"bootstrap_host", "bootstrap_port", "bootstrap_room"}
            bad = {**handle, "bootstrap_room": handle["bootstrap_room"] ^ 1}
            with pytest.raises(KVTransferError, match="no KV for bootstrap room"):
                await engines["node1"].pd_decode("d1", req("x1", 4), bad, "p0")
            with pytest.raises(KVTransferError, match="lacks 'bootstrap_room'"):
                await engines["node1"].pd_decode("d1", req("x2", 4), {"bootstrap_host": "h", "bootstrap_port": 1})
    finally:
        for a in agents.values():
            await a.close()
        for e in engines.values():
            await e.close()


async def test_refused_role_switch_falls_back_to_a_relaunch(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A server that refuses ``/pd_role_switch`` (``RoleSwitchError``) is relaunched in the new role;
    a nixl server, whose KV manager cannot switch, is relaunched without asking."""
    mc = fake_settings(enable_pd_role_switch=True, transfer_backend="mooncake", decode_cuda_graph_memory_gb=1.0)
    eng = SglangEngine(tmp_path / "mc", replace(mc, extra_args=(*mc.extra_args, "--role-switch-unhealthy")))
    nixl = SglangEngine(tmp_path / "nixl", fake_settings(enable_pd_role_switch=True, transfer_backend="nixl",
                                                         decode_cuda_graph_memory_gb=1.0))
    try:
        await asyncio.gather(eng.launch(ServerSpec("d", ("0",), Role.DECODE, "base-model")),
                             nixl.launch(ServerSpec("n", ("1",), Role.DECODE, "base-model")))
        pids = eng.server("d").proc.pid, nixl.server("n").proc.pid  # type: ignore[union-attr]
        assert "--enable-pd-role-switch" not in nixl.server("n").command()
        with caplog.at_level("WARNING", logger="pearl.engines.sglang"):
            await eng.set_role("d", Role.PREFILL)
        await nixl.set_role("n", Role.PREFILL)
        assert "in-place role switch of d refused, relaunching" in caplog.text and "restart required" in caplog.text
        assert "role switch of n" not in caplog.text  # nixl: never asked
        assert (eng.server("d").mode, nixl.server("n").mode) == ("prefill", "prefill")
        assert eng.server("d").proc.pid != pids[0] and nixl.server("n").proc.pid != pids[1]  # type: ignore[union-attr]
    finally:
        await asyncio.gather(eng.close(), nixl.close())


async def test_release_without_cpu_backup_reports_no_weights_until_a_load(tmp_path: Path) -> None:
    """Without ``--enable-weights-cpu-backup`` SGLang's release keeps only buffers: the resumed
    server reports ``NO_WEIGHTS`` (so the executor reloads even at the same version) and a load
    brings the outputs back."""
    eng = SglangEngine(tmp_path, fake_settings(weights_cpu_backup=False))
    try:
        await eng.launch(ServerSpec("nb", ("0",), Role.COLOCATED, "base-model"))
        assert "--enable-weights-cpu-backup" not in eng.server("nb").command()
        before = await eng.generate("nb", req("nb-0", 6))
        await eng.release_memory("nb")
        await eng.resume_memory("nb")
        assert await eng.weight_version("nb") == NO_WEIGHTS
        assert (await eng.generate("nb", req("nb-1", 6))).output_ids != before.output_ids  # garbage weights
        await eng.load_weights("nb", "base-model", 0)
        assert await eng.weight_version("nb") == 0
        assert (await eng.generate("nb", req("nb-2", 6))).output_ids == before.output_ids
    finally:
        await eng.close()


async def test_refusals_fail_the_request_and_a_full_queue_is_asked_again(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A 4xx refusal (the tokenizer's context check as an error event; the scheduler's input check
    as an abort that still carries one sampled token) is a ``RequestRejectedError`` with no token
    kept; a 503 without output (a full queue) is asked again a bounded number of times."""
    monkeypatch.setattr(sglang, "CAPACITY_BACKOFF_S", 0.01)
    eng = SglangEngine(tmp_path, SglangSettings(module="pearl.engines.sglang_fake", start_timeout_s=60, extra_args=(
        "--token-delay-s", "0.01", "--context-length", "64", "--max-total-tokens", "40",
        "--max-queued-requests", "1")))
    try:
        await eng.launch(ServerSpec("r", ("0",), Role.COLOCATED, "base-model"))
        with pytest.raises(RequestRejectedError, match="longer than the model's context length") as err:
            await eng.generate("r", req("too-long", 4, tuple(range(70))))
        assert err.value.status_code == 400
        with pytest.raises(RequestRejectedError, match="exceeds the maximum allowed length") as err:
            await eng.generate("r", req("too-big", 4, tuple(range(45))))
        assert err.value.status_code == 400 and "1 output token(s) are dropped" in str(err.value)
        long = asyncio.create_task(eng.generate("r", req("long", 5000)))
        await asyncio.wait_for(eng.wait_tokens(wire_id("long"), 2), 30)
        with pytest.raises(EngineError, match=r"no room on the server after 4 attempts \(503: The request queue"):
            await eng.generate("r", req("queued", 4))
        await eng.abort("r", wire_id("long"))
        assert (await long).finish_reason is FinishReason.ABORT
        assert len((await eng.generate("r", req("room", 4))).output_ids) == 4
    finally:
        await eng.close()


async def test_an_abort_whose_extra_token_is_eos_ends_the_turn(tmp_path: Path) -> None:
    """An aborted running request still decodes one token, and SGLang applies the abort before its
    EOS check: a last token among the model's EOS ids (``config.json`` / ``generation_config.json``)
    is a finished turn (``STOP``), and ``continuation_request`` does not continue it."""
    model = tmp_path / "model"
    model.mkdir()
    toks, _ = expected(str(model), PROMPT, 400)
    eos = sorted(set(toks[4:]) - set(toks[:4]))
    (model / "config.json").write_text(f'{{"eos_token_id": {eos[0]}}}')
    (model / "generation_config.json").write_text(f'{{"eos_token_id": {eos[1:]}}}')
    eng = SglangEngine(tmp_path, fake_settings(delay=0.01))
    try:
        await eng.launch(ServerSpec("e", ("0",), Role.COLOCATED, str(model)))
        assert eng.server("e").eos_ids == frozenset(eos)
        original = req("eos", 400)
        task = asyncio.create_task(eng.generate("e", original))
        await asyncio.wait_for(eng.wait_tokens(wire_id("eos"), 4), 30)
        await eng.abort("e", wire_id("eos"))
        part = await task
        assert part.output_ids[-1] in eos and list(part.output_ids) == toks[:len(part.output_ids)]
        assert part.finish_reason is FinishReason.STOP
        assert continuation_request(original, [part], attempt=1) is None
    finally:
        await eng.close()


async def test_startup_waits_out_sglangs_health_handler(tmp_path: Path) -> None:
    """SGLang's ``/health`` may take up to 20 s (``HEALTH_CHECK_TIMEOUT``): a readiness poll that
    gives up after 5 s would never see a slow server ready."""
    eng = SglangEngine(tmp_path, SglangSettings(module="pearl.engines.sglang_fake", start_timeout_s=40,
                                                extra_args=("--health-delay-s", "6")))
    try:
        await eng.launch(ServerSpec("slow", ("0",), Role.COLOCATED, "base-model"))
        assert eng.server("slow").alive
    finally:
        await eng.close()


class _Router:
    """The pipeline as the executor sees it: who is admitted, at which version."""

    def __init__(self) -> None:
        self.admitted: dict[str, int] = {}
        self.worker_versions: dict[str, int] = {}

    async def evict(self, worker_id: str) -> int:
        self.admitted.pop(worker_id, None)
        return 0

    def admit(self, worker_id: str, role: Role, version: int) -> None:
        self.admitted[worker_id] = version


async def test_a_lent_worker_reactivated_at_the_same_version_serves_its_weights(tmp_path: Path) -> None:
    """DEACTIVATE then ACTIVATE at an unchanged version: with the CPU backup the weights come back;
    without it the engine reports ``NO_WEIGHTS``, so the executor reloads the latest snapshot.
    Either way the re-activated worker generates what it did before."""
    from pearl.core.state import ClusterState, Gpu, Worker, WorkerStatus, Zone
    from pearl.runtime.clock import LoopClock
    from pearl.runtime.executor import ExecutionReport, PlanExecutor

    for backup in (True, False):
        eng = SglangEngine(tmp_path / str(backup), fake_settings(weights_cpu_backup=backup))
        state = ClusterState.build([Gpu("t0", Zone.OVERLAP, lent=True)], [Worker("o", ("t0",), Role.COLOCATED,
                                                                      WorkerStatus.ACTIVE)])
        router = _Router()
        ex = PlanExecutor(state, eng, router, LoopClock(), latest_weights=lambda: (0, "base-model"))  # type: ignore[arg-type]
        try:
            await eng.launch(ServerSpec("o", ("0",), Role.COLOCATED, "base-model"))
            before = await eng.generate("o", req(f"lent-{backup}-0", 6))
            rep = ExecutionReport()
            await ex.deactivate("o", rep)
            await ex.activate("o", Role.COLOCATED, rep)
            assert rep.errors == [] and router.admitted == {"o": 0}
            after = await eng.generate("o", req(f"lent-{backup}-1", 6))
            assert after.output_ids == before.output_ids, f"weights_cpu_backup={backup}"
        finally:
            await eng.close()


async def test_a_refusal_on_the_decode_server_is_a_rejection_not_a_kv_failure(tmp_path: Path) -> None:
    eng = SglangEngine(tmp_path, SglangSettings(module="pearl.engines.sglang_fake", start_timeout_s=60,
                                                transfer_backend="mooncake", extra_args=("--context-length", "8")))
    try:
        await asyncio.gather(eng.launch(ServerSpec("p", ("0",), Role.PREFILL, "base-model")),
                             eng.launch(ServerSpec("d", ("1",), Role.DECODE, "base-model")))
        with pytest.raises(RequestRejectedError, match="context length"):
            await eng.generate_pd("p", "d", req("pd-too-long", 4))
    finally:
        await eng.close()
