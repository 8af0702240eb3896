"""Routing of the rollout pipeline's turns (``pearl.runtime.pipeline``) to workers.

``Router``: only *dispatchable* workers (admitted by the controller) receive requests.
Colocated when a colocated worker exists; otherwise a (prefill, decode) pair. Least-loaded
(in-flight requests routed by this pipeline) with conversation affinity: the worker that served
the trajectory's previous turn holds its prefix cache, so it is kept while its load is within
``affinity_slack`` of the least-loaded worker (as SGLang's cache-aware router does with its
balance threshold). With ``cost_aware`` (config ``policy.affinity: cost``, the default) a
colocated turn also leaves earlier, when its predicted latency on the least-loaded worker,
re-prefill of the cached prefix included, beats staying (``pearl.core.affinity``: formula and
choices there; ``_move_rule`` builds it from the tracker's current profiles). Why: a pool that
grows mid-batch (a grant, returned training GPUs) otherwise stays nearly idle until the next
batch. ``Router.moves`` counts the turns moved by each rule. When nothing is dispatchable a turn
waits for the next topology change.
Same-node pairs: engines that cannot split a PD pair across nodes (the emulated engine, SGLang in
this build: they answer ``KVTransferError``) give the router ``pair_node`` (worker -> node); a pair is
then the least-loaded prefill (with affinity) and the least-loaded decode *on its node*, else the
next prefill by load whose node has a decode; with no same-node pair a PD turn waits for a topology
change (logged once per change), as when nothing is dispatchable.

Public names: ``Router``, ``Route``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from pearl.core.affinity import effective_slack, typical_turn
from pearl.core.profile import HardwareProfile, WorkloadProfile
from pearl.core.state import Role
from pearl.runtime.clock import Clock

log = logging.getLogger("pearl.pipeline")


@dataclass(frozen=True, slots=True)
class Route:
    worker: str  # colocated worker, or the prefill worker
    decode: str = ""  # decode worker ("" = colocated)

    @property
    def disaggregated(self) -> bool:
        return bool(self.decode)


class Router:
    """Dispatchable workers and their loads; least-loaded choice with conversation affinity."""

    def __init__(self, affinity_slack: int = 4, cost_aware: bool = False,
                 pair_node: Callable[[str], str] | None = None) -> None:
        self.affinity_slack = affinity_slack
        #: colocated turns may leave their cache-holding worker when the turn's own latency gains
        #: (``pearl.core.affinity``; the pipeline passes the rule to ``acquire``)
        self.cost_aware = cost_aware
        #: turns that left their previous worker for a less loaded one, by reason
        self.moves: dict[str, int] = {"slack": 0, "cost": 0}
        #: why the last ``pick`` left ``prefer``: "", "slack" or "cost" (``acquire`` counts it in ``moves``)
        self.last_move = ""
        self._roles: dict[str, Role] = {}
        self.load: dict[str, int] = {}
        self._changed = asyncio.Event()
        self.paused = False
        #: worker -> node; given when prefill and decode of a pair must share a node (module docstring)
        self.pair_node = pair_node
        self._warned_unpaired = False

    @property
    def workers(self) -> Mapping[str, Role]:
        return MappingProxyType(self._roles)

    def admit(self, worker_id: str, role: Role) -> None:
        self._roles[worker_id] = role
        self.load.setdefault(worker_id, 0)
        self._notify()

    def remove(self, worker_id: str) -> bool:
        """Stop dispatch to ``worker_id``; True if it was dispatchable."""
        found = self._roles.pop(worker_id, None) is not None
        if found:
            self._notify()
        return found

    def set_paused(self, paused: bool) -> None:
        self.paused = paused
        if not paused:
            self._notify()

    def _notify(self) -> None:
        self._warned_unpaired = False
        self._changed.set()
        self._changed = asyncio.Event()

    def placement_slack(self, hw: HardwareProfile, wl: WorkloadProfile) -> int:
        """The load gap an in-flight batch settles within after a pool grows: ``affinity_slack``,
        or with cost-aware affinity the gap the rule tolerates for the profiles' typical turn
        (``pearl.core.affinity.effective_slack``; ``makespan.sticky_pool``'s ``s``)."""
        if not self.cost_aware:
            return self.affinity_slack
        return effective_slack(hw, typical_turn(wl), self.affinity_slack)

    def _least(self, role: Role, prefer: str, node: str | None = None,
               move: Callable[[int, int], bool] | None = None) -> str | None:
        return self._choose(role, prefer, node, move)[0]

    def _choose(self, role: Role, prefer: str, node: str | None = None,
                move: Callable[[int, int], bool] | None = None) -> tuple[str | None, str]:
        """Least-loaded worker of ``role`` (on ``node``) and why it is not ``prefer`` ("" when it
        is, or when there was nothing to prefer): the ``prefer`` worker is kept unless its load
        exceeds the least by more than ``affinity_slack`` ("slack") or ``move(n_prefer, n_best)``
        says leaving pays ("cost": cost-aware affinity)."""
        best, best_load = None, 0
        for w, r in self._roles.items():
            if r is not role or (node is not None and self._node(w) != node):
                continue
            ld = self.load.get(w, 0)
            if best is None or ld < best_load or (ld == best_load and w < best):
                best, best_load = w, ld
        if best is not None and prefer in self._roles and self._roles[prefer] is role and \
                (node is None or self._node(prefer) == node):
            n_p = self.load.get(prefer, 0)
            if n_p <= best_load:
                return prefer, ""
            if n_p > best_load + self.affinity_slack:
                return best, "slack"
            if move is not None and move(n_p, best_load):
                return best, "cost"
            return prefer, ""
        return best, ""

    def _node(self, worker_id: str) -> str:
        """The worker's node; a worker whose node cannot be told pairs with nothing."""
        assert self.pair_node is not None
        try:
            return self.pair_node(worker_id)
        except Exception:  # e.g. a worker the engine no longer knows: never paired
            return f"?{worker_id}"

    def _pair(self, prefer: str) -> Route | None:
        p = self._least(Role.PREFILL, prefer)
        if p is None:
            return None
        if self.pair_node is None:
            d = self._least(Role.DECODE, "")
            return Route(p, d) if d is not None else None
        prefills = sorted((w for w, r in self._roles.items() if r is Role.PREFILL and w != p),
                          key=lambda w: (self.load.get(w, 0), w))
        for q in (p, *prefills):
            d = self._least(Role.DECODE, "", node=self._node(q))
            if d is not None:
                return Route(q, d)
        return None

    def _warn_unpaired(self) -> None:
        roles = set(self._roles.values())
        if self._warned_unpaired or Role.PREFILL not in roles or Role.DECODE not in roles:
            return
        self._warned_unpaired = True
        log.warning("no prefill and decode worker share a node and this engine cannot pair them across "
                    "nodes: PD turns wait for a topology change (prefills %s, decodes %s)",
                    {w: self._node(w) for w, r in self._roles.items() if r is Role.PREFILL},
                    {w: self._node(w) for w, r in self._roles.items() if r is Role.DECODE})

    def pick(self, prefer: str = "", move: Callable[[int, int], bool] | None = None) -> Route | None:
        """A route for one turn; ``move`` is the cost-aware affinity rule for a colocated turn."""
        self.last_move = ""
        if self.paused:
            return None
        c, why = self._choose(Role.COLOCATED, prefer, move=move)
        pd = self._pair(prefer)
        if c is None and pd is None and self.pair_node is not None:
            self._warn_unpaired()
        if c is not None and (pd is None or self.load[c] <= max(self.load[pd.worker], self.load[pd.decode])):
            self.last_move = why
            return Route(c)
        if pd is not None and pd.worker != prefer and self._roles.get(prefer) is Role.PREFILL:
            self.last_move = "slack"  # a PD turn's prefill worker keeps affinity by the slack rule only
        return pd

    async def acquire(self, clock: Clock, prefer: str = "",
                      move: Callable[[int, int], bool] | None = None) -> Route:
        """Wait for a route, then count the request on its worker(s)."""
        while True:
            route = self.pick(prefer, move)
            if route is not None:
                if self.last_move:
                    self.moves[self.last_move] += 1
                self.load[route.worker] = self.load.get(route.worker, 0) + 1
                if route.decode:
                    self.load[route.decode] = self.load.get(route.decode, 0) + 1
                return route
            await self._changed.wait()

    def release(self, route: Route) -> None:
        for w in (route.worker, route.decode):
            if w and w in self.load:
                self.load[w] -= 1
                if self.load[w] <= 0 and w not in self._roles:
                    del self.load[w]

    async def wait_change(self, clock: Clock, timeout_s: float) -> None:
        await clock.wait(self._changed, clock.now() + timeout_s)
