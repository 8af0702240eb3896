"""The agent watcher on the virtual clock, a lost node in ``RemoteEngine`` (in-flight calls fail
over at once), the controller's reaction to a lost node, and trainer rank placement."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from pearl.core.events import ReclaimNotice
from pearl.core.state import ClusterState, Gpu, Role, Zone
from pearl.engines.base import EngineDeadError, EngineStartError, GenerateRequest, SamplingParams, ServerSpec
from pearl.runtime.clock import LoopClock, run_virtual
from pearl.runtime.control import SubmitResult
from pearl.runtime.node.agent import RemoteEngine
from pearl.runtime.node.trainer_client import RankPlacement, trainer_placement
from pearl.runtime.node.watch import AgentWatcher, NodeHealth, node_lost_handler


class Node:
    """A fake agent's health route: answers, raises, or hangs (as a partitioned node does)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.mode = "ok"
        self.calls = 0

    async def health(self) -> Mapping[str, Any]:
        self.calls += 1
        if self.mode == "down":
            raise ConnectionRefusedError(f"{self.name}: connection refused")
        if self.mode == "hang":
            await asyncio.Event().wait()
        return {"node": self.name, "rank": int(self.name[-1]), "workers": {"w": True}, "children": {}}


def test_node_health_transitions() -> None:
    h = NodeHealth("node0")
    h = h.observe(False, 1.0, 3, error="e1")
    assert h.alive and h.misses == 1 and h.error == "e1"
    h = h.observe(False, 2.0, 3, error="e2").observe(False, 3.0, 3, error="e3")
    assert not h.alive and h.misses == 3
    assert not h.observe(False, 4.0, 3).alive  # stays lost
    back = h.observe(True, 5.0, 3, health={"workers": {"w": False}})
    assert back.alive and back.misses == 0 and back.last_ok_at == 5.0
    assert back.to_dict()["healthy"] is False  # alive, but a server is down


def test_watcher_declares_a_silent_node_lost_after_m_misses_then_back() -> None:
    async def main() -> None:
        nodes = {n: Node(n) for n in ("node0", "node1")}
        clock = LoopClock()
        events: list[tuple[str, str, float]] = []
        w = AgentWatcher({n: x.health for n, x in nodes.items()}, clock,
                         on_dead=lambda n, r: events.append(("dead", n, clock.now())),
                         on_alive=lambda n: events.append(("alive", n, clock.now())),
                         period_s=5.0, timeout_s=2.0, max_misses=3)
        w.start()
        await clock.sleep(12.0)  # polls at 5, 10
        assert events == [] and all(x.calls == 2 for x in nodes.values())
        nodes["node1"].mode = "hang"  # partitioned: answers nothing
        await clock.sleep(11.0)  # t=23: polls at 15 and 20 timed out at 17 and 22 (2 misses: a blip so far)
        assert events == [] and w.nodes["node1"].misses == 2 and w.nodes["node1"].alive
        await clock.sleep(5.0)  # t=28: the poll at 25 timed out at 27, the third miss
        assert events == [("dead", "node1", 27.0)]
        view = {v["node"]: v for v in w.view()}
        assert not view["node1"]["alive"] and "no answer within 2 s" in view["node1"]["error"]
        assert view["node0"]["alive"] and view["node0"]["healthy"]
        nodes["node1"].mode = "down"
        await clock.sleep(20.0)
        assert events == [("dead", "node1", 27.0)]  # once
        nodes["node1"].mode = "ok"
        await clock.sleep(5.0)
        assert events[-1][:2] == ("alive", "node1")
        await w.close()
        assert w._task is None

    run_virtual(main())


def test_a_failing_callback_does_not_stop_the_watcher() -> None:
    async def main() -> None:
        node = Node("node0")
        node.mode = "down"
        calls = []

        def boom(n: str, r: str) -> None:
            calls.append(n)
            raise RuntimeError("callback broke")

        w = AgentWatcher({"node0": node.health}, LoopClock(), on_dead=boom, period_s=1.0, timeout_s=1.0, max_misses=1)
        await w.poll_once()
        node.mode = "ok"
        await w.poll_once()
        assert calls == ["node0"] and w.nodes["node0"].alive

    run_virtual(main())


def test_serve_hands_the_node_events_from_start_up_to_the_service() -> None:
    """A node lost during start-up reaches the start-up callback; after ``serve`` a loss and a
    return reach the service's callbacks only, never both phases' in one round."""
    async def main() -> None:
        node = Node("node0")
        seen: list[tuple[str, str]] = []
        w = AgentWatcher({"node0": node.health}, LoopClock(), on_dead=lambda n, r: seen.append(("early-dead", n)),
                         on_alive=lambda n: seen.append(("early-alive", n)), period_s=1.0, timeout_s=1.0,
                         max_misses=1)
        node.mode = "down"
        await w.poll_once()
        node.mode = "ok"
        await w.poll_once()
        assert seen == [("early-dead", "node0"), ("early-alive", "node0")]

        async def dead(n: str, r: str) -> None:
            seen.append(("dead", n))

        await w.serve(dead, lambda n: seen.append(("alive", n)))
        node.mode = "down"
        await w.poll_once()
        node.mode = "ok"
        await w.poll_once()
        assert seen[2:] == [("dead", "node0"), ("alive", "node0")]

    run_virtual(main())


def test_watcher_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="max_misses=0"):
        AgentWatcher({}, LoopClock(), on_dead=print, max_misses=0)


class HangingAgent:
    """An ``AgentClient`` stand-in whose generate never returns (the node went silent)."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.calls: list[str] = []

    async def call(self, method: str, **args: Any) -> Any:
        self.calls.append(method)
        if method == "generate":
            self.entered.set()
            await asyncio.Event().wait()
        return None


def req(turn: int) -> GenerateRequest:
    return GenerateRequest("t", (1, 2, 3), SamplingParams(max_new_tokens=4), turn=turn)


async def test_a_lost_node_fails_its_in_flight_calls_at_once_and_refuses_new_ones() -> None:
    agents = {"node0": HangingAgent(), "node1": HangingAgent()}
    eng = RemoteEngine(agents, node_of=lambda g: {"g0": "node0", "g1": "node1"}[g])  # type: ignore[arg-type]
    await eng.launch(ServerSpec("w0", ("g0",), Role.COLOCATED, weights="v0"))
    await eng.launch(ServerSpec("w1", ("g1",), Role.COLOCATED, weights="v0"))
    task = asyncio.ensure_future(eng.generate("w1", req(0)))
    await agents["node1"].entered.wait()
    assert eng.mark_node_dead("node1", "missed 3 health checks") == ["w1"]
    with pytest.raises(EngineDeadError, match="node node1 is lost") as err:
        await task
    assert err.value.worker_id == "w1"
    with pytest.raises(EngineDeadError, match="missed 3 health checks"):
        await eng.abort("w1")
    assert not await eng.healthy("w1")
    with pytest.raises(EngineStartError, match="is lost"):
        await eng.launch(ServerSpec("w2", ("g1",), Role.COLOCATED, weights="v0"))
    await eng.stop("w1")  # its server went with the node: nothing is sent there
    assert agents["node1"].calls == ["launch", "generate"]
    await eng.stop("w0")  # the other node is untouched
    assert agents["node0"].calls == ["launch", "stop"]
    eng.mark_node_alive("node1")
    await eng.launch(ServerSpec("w3", ("g1",), Role.COLOCATED, weights="v0"))
    assert eng.workers_on("node1") == ["w3"]


class FakeController:
    """What ``node_lost_handler`` touches: the GPU table, ``submit`` and ``elastic.worker_failed``."""

    def __init__(self, state: ClusterState) -> None:
        self.executor = type("X", (), {"state": state})()
        self.clock = type("C", (), {"now": staticmethod(lambda: 100.0)})()
        self.submitted: list[Any] = []
        self.failed: list[tuple[str, str]] = []
        self.elastic = type("E", (), {"worker_failed": lambda _s, w, r: self.failed.append((w, r))})()

    async def submit(self, ev: Any, source: str = "trace") -> SubmitResult:
        """The controller's door for events built in the process (``Controller.submit``)."""
        self.submitted.append((ev, source))
        return SubmitResult(True, detail="queued")


async def test_lost_node_is_handled_like_a_reclaim_due_now() -> None:
    state = ClusterState.build([Gpu("r0", Zone.RESERVED, "node0"), Gpu("r1", Zone.RESERVED, "node1"),
                                Gpu("spot-1", Zone.PREEMPTIBLE, "node1"), Gpu("spot-0", Zone.PREEMPTIBLE, "node0")])
    ctrl = FakeController(state)
    eng = RemoteEngine({"node0": HangingAgent(), "node1": HangingAgent()},  # type: ignore[dict-item]
                       node_of=lambda g: state.gpu(g).node)
    for wid, gpu in (("w0", "r0"), ("w1", "r1"), ("w2", "spot-1")):
        await eng.launch(ServerSpec(wid, (gpu,), Role.COLOCATED, weights="v0"))
    await node_lost_handler(ctrl, eng)("node1", "agent missed 3 health checks")
    assert eng.dead_nodes() == {"node1": "agent missed 3 health checks"}
    [(ev, source)] = ctrl.submitted
    assert isinstance(ev, ReclaimNotice) and ev.gpu_ids == ("spot-1",) and ev.deadline == 100.0
    assert source == "node-loss"
    assert [w for w, _ in ctrl.failed] == ["w1", "w2"]
    assert all("node node1 lost" in r for _, r in ctrl.failed)


def test_trainer_placement() -> None:
    gpus = [Gpu(f"r{i}", Zone.RESERVED, f"node{i // 4}") for i in range(4)]
    gpus += [Gpu(f"t{i}", Zone.OVERLAP, f"node{(i + 4) // 8}") for i in range(12)]
    state = ClusterState.build(gpus)
    nodes = ["node0", "node1", "node2"]
    got = trainer_placement(state, 12, nodes, 8)
    assert got[0] == RankPlacement(0, "node0", "4") and got[3] == RankPlacement(3, "node0", "7")
    assert got[4] == RankPlacement(4, "node1", "0") and got[11] == RankPlacement(11, "node1", "7")
    assert trainer_placement(state, 2, nodes, 8, {"t1": "6"})[1] == RankPlacement(1, "node0", "6")
    # no training GPUs (a CPU demo): every rank on the last node, no device pinned
    cpu = ClusterState.build([Gpu("r0", Zone.RESERVED, "node0")])
    assert trainer_placement(cpu, 2, ["node0", "node1"], 1) == [RankPlacement(0, "node1"), RankPlacement(1, "node1")]


async def test_agent_trainer_client_resumes_every_rank_from_the_checkpoint(tmp_path) -> None:
    """``AgentTrainerClient(resume=True)`` starts each rank with ``--resume`` and takes the step the
    ranks report (a fake agent answers as ``pearl.train.trainer`` does after loading checkpoint 3)."""
    from pearl.config import TrainSpec
    from pearl.runtime.node.trainer_client import AgentTrainerClient

    class Agent:
        def __init__(self) -> None:
            self.posts: list[tuple[str, dict[str, Any]]] = []

        async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
            self.posts.append((path, body))
            if path.endswith("/free-port"):
                return {"port": 29999}
            if path.endswith("/start"):
                return {"first": {"ok": True, "ready": True, "step": 3, "version": 3,
                                  "resumed_from": str(tmp_path / "checkpoints" / "step-000003")}}
            return {"returncode": 0}

    spec = TrainSpec(world_size=2)
    for resume in (True, False):
        agents = {"node0": Agent(), "node1": Agent()}
        client = AgentTrainerClient([RankPlacement(0, "node0"), RankPlacement(1, "node1")], agents,  # type: ignore[arg-type]
                                    {"node0": "10.0.0.1", "node1": "10.0.0.2"}, "/m", tmp_path, spec, 1,
                                    resume=resume)
        await client.start()
        starts = [b for a in agents.values() for p, b in a.posts if p.endswith("/start")]
        assert len(starts) == 2 and all(("--resume" in b["args"]) is resume for b in starts)
        assert client.version == 3 and str(client.setup_info["resumed_from"]).endswith("step-000003")
        await client.close()
