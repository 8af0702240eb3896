"""``AgentWatcher``: rank 0's periodic health check of every node agent, and what a lost node means.

Every ``period_s`` (start to start) the watcher asks each agent ``GET /agent/v1/health`` (all nodes concurrently,
each bounded by ``timeout_s``). A node whose agent fails ``max_misses`` polls in a row is *lost*:
``on_dead(node, reason)`` runs once. A lost node that answers again is *back*: ``on_alive(node)``.
The per-node view (``NodeHealth``: alive, consecutive misses, the last health document, the last
error) is what ``GET /v1/nodes`` serves, so the admin API never polls agents on request.

    NodeHealth transition (``observe``, pure):   ok                      -> alive, misses = 0
                                                 failure, misses+1 <  M -> alive (a blip)
                                                 failure, misses+1 >= M -> lost (stays lost until ok)

Choice (the paper is silent): M = 3 misses at 5 s with a 5 s timeout, i.e. a node is declared
lost 10-20 s after it stops answering: longer than a GC pause or a busy event loop on the agent,
shorter than the 2-minute cloud reclaim notice, so a node that dies without notice costs at most
that much rollout time on its workers.

Cloud signals: a node agent with a cloud watch (``pearl.runtime.node.cloud_watch``) lists what it saw
in its health document (``"cloud": {"signals": [...]}``); the watcher hands each signal, once, to
``on_cloud(node, signal)`` (``cloud_relay``: the admin gate's ``cloud_signal``), retrying a failed
relay at the next poll. A signal reaches the controller within one ``period_s`` of the agent
seeing it.

``node_lost_handler(controller, remote)`` is the controller's reaction, the same as to a reclaim:
the node's in-flight calls fail at once (``RemoteEngine.mark_node_dead``: ``EngineDeadError``, the
turns resume elsewhere), its preemptible GPUs get a reclaim notice due now (urgent shrink: they
leave the table) and each of its workers is reported failed (removed, the decision re-planned).

Life cycle: ``watcher.start()`` spawns the one polling task; ``await watcher.serve(on_dead,
on_alive, on_cloud)`` replaces the start-up callbacks once the service runs; ``await
watcher.close()`` cancels and awaits it. ``poll_once()`` is one round (tests drive it alone or on the virtual clock).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from pearl.core.events import ReclaimNotice
from pearl.core.state import Zone
from pearl.runtime.clock import Clock
from pearl.tasks import cancel_and_wait

log = logging.getLogger("pearl.agent_watch")

HealthProbe = Callable[[], Awaitable[Mapping[str, Any]]]
NodeCallback = Callable[..., Any]


@dataclass(frozen=True, slots=True)
class NodeHealth:
    node: str
    alive: bool = True
    misses: int = 0
    polls: int = 0
    last_ok_at: float | None = None
    health: Mapping[str, Any] | None = None
    error: str = ""

    def observe(self, ok: bool, now: float, max_misses: int, health: Mapping[str, Any] | None = None,
                error: str = "") -> NodeHealth:
        """The view after one poll (module docstring: the transition)."""
        if ok:
            return replace(self, alive=True, misses=0, polls=self.polls + 1, last_ok_at=now, health=health, error="")
        misses = self.misses + 1
        return replace(self, alive=self.alive and misses < max_misses, misses=misses, polls=self.polls + 1,
                       error=error)

    def to_dict(self) -> dict[str, Any]:
        h = dict(self.health or {})
        workers = dict(h.get("workers", {}))
        return {**h, "node": self.node, "alive": self.alive, "misses": self.misses, "last_ok_at": self.last_ok_at,
                "healthy": self.alive and self.misses == 0 and all(workers.values()), "error": self.error or None}


class AgentWatcher:
    def __init__(self, probes: Mapping[str, HealthProbe], clock: Clock, on_dead: NodeCallback,
                 on_alive: NodeCallback | None = None, *, period_s: float = 5.0, timeout_s: float = 5.0,
                 max_misses: int = 3, on_cloud: NodeCallback | None = None) -> None:
        if period_s <= 0 or timeout_s <= 0 or max_misses < 1:
            raise ValueError(f"period_s={period_s} and timeout_s={timeout_s} must be > 0, max_misses={max_misses} >= 1")
        self._probes = dict(probes)
        self._clock = clock
        #: the start-up callbacks; ``serve`` hands them over to the running service once
        self.on_dead = on_dead
        self.on_alive = on_alive
        self.period_s = period_s
        self.timeout_s = timeout_s
        self.max_misses = max_misses
        self.nodes: dict[str, NodeHealth] = {n: NodeHealth(n) for n in self._probes}
        #: ``on_cloud(node, signal dict)`` for each cloud signal an agent reports (None: ignored)
        self.on_cloud: NodeCallback | None = on_cloud
        self.relayed: set[tuple[str, str, str, int]] = set()
        self._task: asyncio.Task[None] | None = None
        self._round = asyncio.Lock()  # one poll round at a time (the task's and an explicit one)

    async def serve(self, on_dead: NodeCallback, on_alive: NodeCallback | None = None,
                    on_cloud: NodeCallback | None = None) -> None:
        """Hand the node events from start-up to the running service (the controller exists only
        after the first launches, which a lost node must already fail): between two poll rounds,
        so no round calls one phase's ``on_dead`` and the other's ``on_alive``."""
        async with self._round:
            self.on_dead, self.on_alive, self.on_cloud = on_dead, on_alive, on_cloud

    def seed(self, node: str, health: Mapping[str, Any]) -> None:
        """Record an answer obtained outside the watcher (the start-up check of every agent)."""
        self.nodes[node] = self.nodes[node].observe(True, self._clock.now(), self.max_misses, health)

    def view(self) -> list[dict[str, Any]]:
        return [self.nodes[n].to_dict() for n in sorted(self.nodes)]

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="agent-watcher")

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def _run(self) -> None:
        """Polls start every ``period_s`` (a slow round is followed by the next at once)."""
        next_t = self._clock.now() + self.period_s
        while True:
            await self._clock.sleep_until(next_t)
            await self.poll_once()
            next_t = max(next_t + self.period_s, self._clock.now())

    async def _probe(self, node: str) -> tuple[str, Mapping[str, Any] | None, str]:
        try:
            return node, await asyncio.wait_for(self._probes[node](), self.timeout_s), ""
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            return node, None, f"no answer within {self.timeout_s:g} s"
        except Exception as e:  # any failure to answer is a miss; the reason is kept for /v1/nodes
            return node, None, f"{type(e).__name__}: {e}"[:300]

    async def poll_once(self) -> None:
        """Poll every agent once, update the views, run the callbacks of nodes lost or back."""
        async with self._round:
            await self._poll_round()

    async def _poll_round(self) -> None:
        results = await asyncio.gather(*(self._probe(n) for n in sorted(self._probes)))
        now = self._clock.now()
        for node, health, error in results:
            before = self.nodes[node]
            after = before.observe(health is not None, now, self.max_misses, health, error)
            self.nodes[node] = after
            if before.alive and not after.alive:
                reason = f"agent missed {after.misses} health checks ({after.error})"
                log.warning("node %s lost: %s", node, reason)
                await self._callback(self.on_dead, node, reason)
            elif not before.alive and after.alive and self.on_alive is not None:
                await self._callback(self.on_alive, node)
            elif health is None:
                log.info("node %s missed a health check (%d/%d): %s", node, after.misses, self.max_misses, error)
            if health is not None and self.on_cloud is not None:
                await self._relay(node, health)

    async def _relay(self, node: str, health: Mapping[str, Any]) -> None:
        cloud = health.get("cloud")
        signals = cloud.get("signals", []) if isinstance(cloud, Mapping) else []
        for sig in signals if isinstance(signals, list) else []:
            try:
                key = (node, str(sig["source"]), str(sig["instance_id"]), int(sig["deadline_wall"]))
            except (KeyError, TypeError, ValueError):
                log.warning("node %s reported a malformed cloud signal: %.200r", node, sig)
                continue
            if key in self.relayed:
                continue
            assert self.on_cloud is not None
            try:
                out = self.on_cloud(node, sig)
                if inspect.isawaitable(out):
                    await out
            except Exception as e:  # refused or failed: retried at the next poll
                log.warning("node %s: cloud signal %s for %s not relayed: %s", node, key[1], key[2], e)
                continue
            self.relayed.add(key)


    @staticmethod
    async def _callback(fn: NodeCallback, *args: Any) -> None:
        """A failing callback is logged; it must not stop the watching."""
        try:
            out = fn(*args)
            if inspect.isawaitable(out):
                await out
        except Exception:
            log.exception("agent watcher: callback %s%s failed", getattr(fn, "__name__", fn), args)


def cloud_relay(app: Any) -> Callable[[str, Mapping[str, Any]], Awaitable[None]]:
    """``on_cloud`` for the controller's admin app (``pearl.admin.app.AdminApp.cloud_signal``)."""

    async def relay(node: str, sig: Mapping[str, Any]) -> None:
        await app.cloud_signal(str(sig["instance_id"]), node, float(sig["deadline_wall"]), str(sig["source"]))

    return relay


def node_lost_handler(controller: Any, remote: Any) -> Callable[[str, str], Awaitable[None]]:
    """The controller's reaction to a lost node (module docstring): like a reclaim, due now."""
    count = 0

    async def on_dead(node: str, reason: str) -> None:
        nonlocal count
        count += 1
        workers = remote.mark_node_dead(node, reason)
        state = controller.executor.state
        spot = tuple(sorted(g.gpu_id for g in state.gpus.values() if g.node == node and g.zone is Zone.PREEMPTIBLE))
        if spot:
            try:
                res = await controller.submit(ReclaimNotice(spot, deadline=controller.clock.now(),
                                                            notice_id=f"node-lost-{node}-{count}",
                                                            event_id=f"node-lost-{node}-{count}"),
                                              source="node-loss")
                log.warning("node %s lost: reclaim of its preemptible GPUs %s (%s)", node, list(spot), res.detail)
            except (ValueError, LookupError) as e:  # e.g. already reclaimed by a cloud notice
                log.warning("node %s lost: reclaim of %s refused: %s", node, list(spot), e)
        for w in workers:
            controller.elastic.worker_failed(w, f"node {node} lost: {reason}")

    return on_dead
