"""The node agent over HTTP with the real emulated engine behind it, driven through ``RemoteEngine``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest

from pearl.config import EmulatorSpec, load_config
from pearl.core.state import Role
from pearl.engines.base import (
    EngineCapabilities,
    EngineDeadError,
    EngineStartError,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    KVTransferError,
    RequestTimings,
    SamplingParams,
    ServerSpec,
    StreamCutError,
)
from pearl.engines.emulated import EmulatedEngine
from pearl.runtime.clock import LoopClock
from pearl.runtime.node import agent as na

TOKEN = "agent-token-0123456789abcdef"
FAST = EmulatorSpec(launch_s=(0.01, 0.01), admission_s=(0.01, 0.01), activation_s=(0.01, 0.01),
                    deactivation_s=(0.01, 0.01), weight_update_s=0.0, role_switch_s=0.0)


@pytest.fixture
async def remote() -> AsyncIterator[tuple[na.RemoteEngine, dict[str, na.NodeAgent]]]:
    base = load_config("qwen3-8b-h200")
    clock = LoopClock()
    agents = {}
    for rank in range(2):
        eng = EmulatedEngine(base.model, base.hardware, clock, FAST)
        agents[f"node{rank}"] = na.NodeAgent(f"node{rank}", rank, eng, TOKEN)
        await agents[f"node{rank}"].start()
    async with aiohttp.ClientSession() as http:
        clients = {n: na.AgentClient(a.url, TOKEN, http) for n, a in agents.items()}
        yield na.RemoteEngine(clients, node_of=lambda dev: f"node{dev.split('-')[0][1:]}"), agents
    for a in agents.values():
        await a.close()


def req(turn: int, n: int = 8, attempt: int = 0) -> GenerateRequest:
    return GenerateRequest("t", tuple(range(1, 65)), SamplingParams(max_new_tokens=n, seed=1), turn=turn,
                           attempt=attempt)


async def test_launch_generate_pd_and_stop_across_two_agents(remote) -> None:
    eng, agents = remote
    await eng.launch(ServerSpec("w0", ("n0-g0",), Role.COLOCATED, weights="v0"))
    await eng.launch(ServerSpec("p1", ("n1-g0",), Role.PREFILL, weights="v0"))
    await eng.launch(ServerSpec("d1", ("n1-g1",), Role.DECODE, weights="v0"))
    assert agents["node0"].workers == {"w0"} and agents["node1"].workers == {"p1", "d1"}
    r = await eng.generate("w0", req(0))
    assert r.finish_reason is FinishReason.LENGTH and len(r.output_ids) == 8 and r.prompt_tokens == 64
    r = await eng.generate_pd("p1", "d1", req(1))
    assert len(r.output_ids) == 8 and r.decode_worker_id == "d1"
    with pytest.raises(KVTransferError, match="keep this pair on one node"):  # emulated: no split PD
        await eng.generate_pd("p1", "w0", req(2))
    assert await eng.healthy("w0") and await eng.weight_version("w0") == 0
    async with aiohttp.ClientSession() as http:
        health = await na.AgentClient(agents["node1"].url, TOKEN, http).health()
    assert health["workers"] == {"d1": True, "p1": True} and health["rank"] == 1
    await eng.stop("w0")
    assert agents["node0"].workers == set()


async def test_engine_errors_cross_the_wire_typed(remote) -> None:
    eng, agents = remote
    agents["node0"].engine.fail_next_launch("w9")
    with pytest.raises(EngineStartError):
        await eng.launch(ServerSpec("w9", ("n0-g3",), Role.COLOCATED, weights="v0"))
    with pytest.raises(EngineStartError, match="no node agent"):
        await eng.launch(ServerSpec("w8", ("n7-g0",), Role.COLOCATED, weights="v0"))


async def test_agent_needs_the_token_and_allowlists_children(remote) -> None:
    _, agents = remote
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{agents['node0'].url}/agent/v1/health") as resp:
            assert resp.status == 401
        c = na.AgentClient(agents["node0"].url, TOKEN, http)
        assert (await c.health())["node"] == "node0"
        with pytest.raises(RuntimeError, match="not allowed"):
            await c.post("/agent/v1/children/x/start", {"module": "os", "args": []})
        await c.shutdown()
    assert agents["node0"].shutdown_requested.is_set()


def test_wire_round_trips() -> None:
    spec = ServerSpec("w", ("g0", "g1"), Role.DECODE, "v3", 3, 0, "127.0.0.1", {"a": "b"})
    assert na.spec_from_dict(na.spec_to_dict(spec)) == spec
    r = req(1, attempt=2)
    assert na.request_from_dict(na.request_to_dict(r)) == r and r.rid == "t/1#2"
    res = GenerateResult("x", (1, 2), (-0.5, -0.25), FinishReason.ABORT, 2, 10, 4, RequestTimings(1.0, 2.0), "w", "d")
    assert na.result_from_dict(na.result_to_dict(res)) == res
    err = EngineDeadError("w", "gone", 137, "oom", res)
    back = na.error_from_dict(na.error_to_dict(err))
    assert type(back) is EngineDeadError and str(back) == str(err) and back.partial == res
    kv = KVTransferError("d", "lost", res)
    back = na.error_from_dict(na.error_to_dict(kv))
    assert type(back) is KVTransferError and back.partial == res and str(back) == str(kv)
    cut = StreamCutError("w", "stream closed before [DONE]", res)
    back = na.error_from_dict(na.error_to_dict(cut))
    assert type(back) is StreamCutError and back.partial == res and str(back) == str(cut)


@pytest.mark.slow
async def test_agent_runs_a_real_trainer_rank(remote, tmp_path) -> None:
    """The agent launches ``pearl.train.trainer`` (tiny Qwen3, one rank) and relays its line protocol."""
    from pearl.models import ensure_models
    from tests.conftest import MODELS_DIR

    model = ensure_models(MODELS_DIR, ("tiny-qwen3",))["tiny-qwen3"]  # ~3 s if `make test` has not built it
    _, agents = remote
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0",
           "OMP_NUM_THREADS": "1"}
    async with aiohttp.ClientSession() as http:
        c = na.AgentClient(agents["node1"].url, TOKEN, http)
        started = await c.post("/agent/v1/children/trainer-0/start", {
            "module": "pearl.train.trainer", "args": ["--model", str(model), "--work-dir", str(tmp_path)],
            "env": env, "first_line_timeout_s": 240})
        assert started["first"]["ok"] is True and started["first"]["step"] == 0
        health = await c.health()
        assert health["children"]["trainer-0"]["returncode"] is None
        digest = await c.post("/agent/v1/children/trainer-0/send", {"line": {"cmd": "digest"}})
        assert digest["reply"]["ok"] and len(digest["reply"]["digest"]) == 64
        bye = await c.post("/agent/v1/children/trainer-0/send", {"line": {"cmd": "shutdown"}})
        assert bye["reply"] == {"ok": True}
        assert (await c.post("/agent/v1/children/trainer-0/stop", {}))["returncode"] == 0


async def test_unreachable_agent_is_a_dead_engine(remote) -> None:
    eng, agents = remote
    await eng.launch(ServerSpec("w5", ("n1-g5",), Role.COLOCATED, weights="v0"))
    await agents["node1"].close()  # the node goes away
    with pytest.raises(EngineDeadError, match="unreachable"):
        await eng.generate("w5", req(5))


class SplitPdEngine:
    """A fake of an engine whose PD halves run on separate servers (vLLM + NIXL): ``pd_prefill`` puts
    the prompt's "KV" on a shared fabric and returns the handle, ``pd_decode`` pulls it from there
    (the server-to-server transfer). Outputs are a pure function of the prompt, as at temperature 0."""

    capabilities = EngineCapabilities(split_pd=True)

    def __init__(self, node: str, fabric: dict[str, tuple[int, ...]]) -> None:
        self.node = node
        self.fabric = fabric
        self.workers: dict[str, Role] = {}
        self.halves: list[tuple[str, str]] = []
        self.prefill_outcome = "ok"  # or "abort", "dead"

    async def launch(self, spec: ServerSpec) -> None:
        self.workers[spec.worker_id] = spec.role

    async def stop(self, worker_id: str) -> None:
        self.workers.pop(worker_id, None)

    async def healthy(self, worker_id: str) -> bool:
        return worker_id in self.workers

    async def abort(self, worker_id: str, rid: str | None = None) -> None:
        return None

    async def close(self) -> None:
        self.workers.clear()

    @staticmethod
    def _tokens(prompt: tuple[int, ...], n: int) -> tuple[int, ...]:
        return tuple((sum(prompt) * 31 + 7 * i) % 1000 for i in range(n))

    def _result(self, req: GenerateRequest, worker: str, decode: str = "") -> GenerateResult:
        out = self._tokens(req.input_ids, req.sampling.max_new_tokens)
        return GenerateResult(req.rid, out, tuple(-0.1 for _ in out), FinishReason.LENGTH, 0, len(req.input_ids), 0,
                              RequestTimings(prefill_s=0.5), worker, decode or worker)

    async def generate(self, worker_id: str, req: GenerateRequest) -> GenerateResult:
        return self._result(req, worker_id)

    async def pd_prefill(self, prefill_id: str, req: GenerateRequest) -> dict[str, object] | None:
        assert self.workers[prefill_id] is Role.PREFILL
        self.halves.append(("prefill", prefill_id))
        if self.prefill_outcome == "abort":
            return None
        if self.prefill_outcome == "dead":
            raise EngineDeadError(prefill_id, "server died", 137, "killed")
        key = f"{self.node}/{prefill_id}/{req.rid}"
        self.fabric[key] = req.input_ids
        return {"kv_transfer_params": {"remote_engine_id": self.node, "key": key}, "prefill_s": 0.5}

    async def pd_decode(self, decode_id: str, req: GenerateRequest, handle: dict[str, object],
                        prefill_id: str = "") -> GenerateResult:
        assert self.workers[decode_id] is Role.DECODE
        self.halves.append(("decode", decode_id))
        params = dict(handle["kv_transfer_params"])  # type: ignore[call-overload]
        kv = self.fabric.pop(str(params["key"]), None)
        if kv != req.input_ids:
            raise KVTransferError(decode_id, f"no KV under {params['key']}")
        return self._result(req, prefill_id, decode_id)


async def test_cross_node_pd_runs_each_half_on_its_node() -> None:
    fabric: dict[str, tuple[int, ...]] = {}
    engines = {f"node{r}": SplitPdEngine(f"node{r}", fabric) for r in range(2)}
    agents = {n: na.NodeAgent(n, int(n[-1]), e, TOKEN) for n, e in engines.items()}  # type: ignore[arg-type]
    for a in agents.values():
        await a.start()
    try:
        async with aiohttp.ClientSession() as http:
            clients = {n: na.AgentClient(a.url, TOKEN, http) for n, a in agents.items()}
            health = await clients["node0"].health()
            assert health["split_pd"] is True
            assert na.capabilities_from_dict(health["capabilities"]) == SplitPdEngine.capabilities
            eng = na.RemoteEngine(clients, node_of=lambda dev: f"node{dev.split('-')[0][1:]}")
            await eng.launch(ServerSpec("p0", ("n0-g0",), Role.PREFILL, weights="v0"))
            await eng.launch(ServerSpec("d1", ("n1-g0",), Role.DECODE, weights="v0"))
            pd = await eng.generate_pd("p0", "d1", req(0))
            assert engines["node0"].halves == [("prefill", "p0")] and engines["node1"].halves == [("decode", "d1")]
            assert fabric == {}  # the decode side pulled the KV the prefill side left
            assert pd.worker_id == "p0" and pd.decode_worker_id == "d1" and pd.finish_reason is FinishReason.LENGTH
            assert pd.output_ids == SplitPdEngine._tokens(req(0).input_ids, 8)
            # an aborted prefill (eviction, weight sync): nothing generated, the turn goes again
            engines["node0"].prefill_outcome = "abort"
            r = await eng.generate_pd("p0", "d1", req(1))
            assert r.finish_reason is FinishReason.ABORT and r.output_ids == () and r.decode_worker_id == "d1"
            assert engines["node1"].halves == [("decode", "d1")]  # no decode half was sent
            # a prefill server that dies: EngineDeadError of the prefill worker, an empty partial kept
            engines["node0"].prefill_outcome = "dead"
            with pytest.raises(EngineDeadError) as err:
                await eng.generate_pd("p0", "d1", req(2))
            assert err.value.worker_id == "p0" and err.value.partial is not None
            assert err.value.partial.output_ids == () and err.value.partial.finish_reason is FinishReason.ABORT
    finally:
        for a in agents.values():
            await a.close()


async def test_router_pairs_prefill_and_decode_on_one_node_for_engines_without_split_pd(
        remote, caplog: pytest.LogCaptureFixture) -> None:
    """Two nodes, each with a prefill and a decode worker of the emulated engine (no split PD). The
    router without ``pair_node`` picks a cross-node pair, which the engine refuses; with it, every
    pair it hands out - under load and affinity - shares a node and generates."""
    from pearl.runtime.router import Route, Router

    eng, _agents = remote
    for wid, dev, role in [("p0", "n0-g0", Role.PREFILL), ("d0", "n0-g1", Role.DECODE),
                           ("p1", "n1-g0", Role.PREFILL), ("d1", "n1-g1", Role.DECODE)]:
        await eng.launch(ServerSpec(wid, (dev,), role, weights="v0"))
    clock = LoopClock()
    plain = Router()
    for w, role in [("p0", Role.PREFILL), ("d0", Role.DECODE), ("p1", Role.PREFILL), ("d1", Role.DECODE)]:
        plain.admit(w, role)
    plain.load.update({"p0": 0, "d0": 5, "p1": 3, "d1": 0})  # least-loaded prefill and decode differ in node
    cross = plain.pick()
    assert cross == Route("p0", "d1")
    with pytest.raises(KVTransferError, match="keep this pair on one node"):
        await eng.generate_pd(cross.worker, cross.decode, req(99))

    router = Router()
    router.pair_node = eng.node_of_worker
    for w, role in [("p0", Role.PREFILL), ("d0", Role.DECODE), ("p1", Role.PREFILL), ("d1", Role.DECODE)]:
        router.admit(w, role)
    router.load.update({"p0": 0, "d0": 5, "p1": 3, "d1": 0})
    assert router.pick() == Route("p0", "d0")  # the decode on p0's node, though busier
    assert router.pick(prefer="p1") == Route("p1", "d1")  # affinity keeps p1 (within the slack)
    router.remove("d0")
    assert router.pick() == Route("p1", "d1")  # p0's node has no decode left: the next prefill by load
    router.admit("d0", Role.DECODE)
    routes = [await router.acquire(clock, prefer="p0" if i % 3 else "") for i in range(12)]
    assert {r.worker for r in routes} == {"p0", "p1"}  # load spreads over both nodes
    assert all(eng.node_of_worker(r.worker) == eng.node_of_worker(r.decode) for r in routes)
    results = [await eng.generate_pd(r.worker, r.decode, req(i)) for i, r in enumerate(routes)]
    assert all(len(x.output_ids) == 8 for x in results)
    for r in routes:
        router.release(r)
    assert router.load == {"p0": 0, "d0": 5, "p1": 3, "d1": 0}

    # nothing pairs on one node: no route (the turn waits for a topology change), never a cross pair
    router.remove("d0")
    router.remove("p1")
    with caplog.at_level("WARNING", logger="pearl.pipeline"):
        assert router.pick() is None and router.pick() is None
    warned = [r.getMessage() for r in caplog.records if "share a node" in r.getMessage()]
    assert len(warned) == 1 and "'p0': 'node0'" in warned[0] and "'d1': 'node1'" in warned[0]  # once per change


class GatedHealthEngine(SplitPdEngine):
    """Each ``healthy`` call waits until every worker's probe has started: a sequential health
    handler never gets past the first one."""

    def __init__(self, n: int) -> None:
        super().__init__("node0", {})
        self.n, self.started = n, 0
        self.all_started = asyncio.Event()

    async def healthy(self, worker_id: str) -> bool:
        self.started += 1
        if self.started == self.n:
            self.all_started.set()
        await self.all_started.wait()
        return worker_id != "w3"


async def test_health_probes_every_worker_at_once() -> None:
    eng = GatedHealthEngine(6)
    agent = na.NodeAgent("node0", 0, eng, TOKEN)  # type: ignore[arg-type]
    await agent.start()
    try:
        async with aiohttp.ClientSession() as http:
            client = na.AgentClient(agent.url, TOKEN, http)
            remote = na.RemoteEngine({"node0": client}, node_of=lambda dev: "node0")
            for i in range(6):
                await remote.launch(ServerSpec(f"w{i}", (f"n0-g{i}",), Role.DECODE, weights="v0"))
            health = await asyncio.wait_for(client.health(), 60)
        assert health["workers"] == {f"w{i}": i != 3 for i in range(6)}
    finally:
        await agent.close()
