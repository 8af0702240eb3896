"""``AgentTrainerClient``: the trainer ranks as node-agent children (``torchrun pearl/main.py``).

``pearl.train.client.TrainerClient`` spawns its ranks as local child processes and speaks their
JSON-line protocol over pipes. In a multi-node run the ranks live on the nodes that hold the
training GPUs, so this subclass keeps every decision of ``TrainerClient`` (staleness filter,
``TrainingStarted`` / ``TrainingFinished`` to the toggle manager, sharding, failure handling) and
replaces only the transport: each rank is started by its node's agent
(``POST /agent/v1/children/trainer-<r>/start``, module ``pearl.train.trainer``) and every protocol
line goes through ``POST /agent/v1/children/trainer-<r>/send`` (one line out, one reply line back).

Life cycle::

    client = AgentTrainerClient(placements, model_path, work_dir, spec, max_staleness, on_event)
    await client.start()      (``resume=True``: every rank continues from the latest checkpoint under
                              ``work_dir``, as ``TrainerClient``'s) rank 0's agent picks a free port for the trainer group's rendezvous
                              (``POST /agent/v1/free-port``); every rank is started concurrently with
                              RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR (rank 0's agent host) /
                              MASTER_PORT and awaited until its "ready" line
    await client.train_step(records)   as TrainerClient
    await client.close()      "shutdown" to every rank, then ``/children/<name>/stop`` (EOF, SIGTERM,
                              SIGKILL) on every agent

``model_path`` and ``work_dir`` must name the same folders on every node (a shared filesystem on a
cluster; the same machine on loopback): the ranks write their snapshots there and the serving
workers on other nodes load them from there.

Placement (``trainer_placement``): rank ``i`` runs on the node of training GPU ``t<i>`` (on a GPU
host it sees only that GPU: ``CUDA_VISIBLE_DEVICES``); with fewer training GPUs than ranks (a CPU
demo has none) every rank runs on the last node. Choice: the paper keeps trainers on the training
cluster; the last rank is the node least likely to hold reserved rollout GPUs (they fill from node 0).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from pearl.config import TrainSpec
from pearl.core.state import ClusterState, Zone
from pearl.runtime.node.agent import AgentClient
from pearl.train.client import EventSink, TrainerClient, TrainerError

_START_TIMEOUT_S = 600.0
_LINE_TIMEOUT_S = 3600.0


@dataclass(frozen=True, slots=True)
class RankPlacement:
    """Where trainer rank ``rank`` runs: ``node`` (its agent) and, on a GPU host, ``gpu`` (the
    physical device index it sees; None on CPU)."""

    rank: int
    node: str
    gpu: str | None = None


def _natural(gpu_id: str) -> tuple[str, int]:
    m = re.match(r"^(\D*)(\d+)$", gpu_id)
    return (m.group(1), int(m.group(2))) if m else (gpu_id, -1)


def trainer_placement(state: ClusterState, world_size: int, nodes: Sequence[str], gpus_per_node: int,
                      device_map: Mapping[str, str] | None = None) -> list[RankPlacement]:
    """Rank ``i`` -> the node of training GPU ``t<i>`` (physical index: ``device_map`` or its position
    on that node); with fewer training GPUs than ranks, every rank on ``nodes[-1]`` (see module docstring)."""
    if not nodes:
        raise ValueError("no nodes to place trainer ranks on")
    overlap = sorted((g for g in state.gpus.values() if g.zone is Zone.OVERLAP), key=lambda g: _natural(g.gpu_id))
    if len(overlap) < world_size:
        return [RankPlacement(r, nodes[-1]) for r in range(world_size)]
    dm = dict(device_map or {})
    ordered = sorted(state.gpus.values(), key=lambda g: (g.zone is not Zone.RESERVED, _natural(g.gpu_id)))
    position = {g.gpu_id: i % gpus_per_node for i, g in enumerate(ordered)}
    return [RankPlacement(r, g.node, dm.get(g.gpu_id, str(position[g.gpu_id]))) for r, g in enumerate(overlap[:world_size])]


@dataclass
class _AgentRank:
    rank: int
    node: str
    name: str
    agent: AgentClient
    pending: dict[str, Any] | None = None


class AgentTrainerClient(TrainerClient):
    """``TrainerClient`` whose ranks are node-agent children (see the module docstring)."""

    def __init__(self, placements: Sequence[RankPlacement], agents: Mapping[str, AgentClient],
                 agent_hosts: Mapping[str, str], model_path: str | Path, work_dir: str | Path, spec: TrainSpec,
                 max_staleness: int, on_event: EventSink | None = None, *, device: str = "cpu",
                 threads_per_rank: int = 1, start_timeout_s: float = _START_TIMEOUT_S,
                 release_when_idle: bool = False, resume: bool = False) -> None:
        super().__init__(model_path, work_dir, spec, max_staleness, on_event, resume=resume, device=device,
                         threads_per_rank=threads_per_rank, release_when_idle=release_when_idle)
        if len(placements) != spec.world_size:
            raise ValueError(f"{len(placements)} placements for train.world_size={spec.world_size}")
        missing = sorted({p.node for p in placements} - set(agents))
        if missing:
            raise ValueError(f"trainer ranks placed on nodes without an agent: {missing} (agents: {sorted(agents)})")
        self.placements = list(placements)
        self._agents = dict(agents)
        self._hosts = dict(agent_hosts)
        self._start_timeout_s = start_timeout_s

    async def start(self) -> None:
        if self._ranks:
            raise TrainerError("AgentTrainerClient.start() called twice")
        first = self.placements[0]
        port = int((await self._agents[first.node].post("/agent/v1/free-port", {}))["port"])
        master = self._hosts[first.node]
        per_node: dict[str, int] = {}
        for p in self.placements:
            per_node[p.node] = per_node.get(p.node, 0) + 1
        seen: dict[str, int] = {}
        ranks: list[_AgentRank] = []
        bodies: list[dict[str, Any]] = []
        for p in self.placements:
            local = seen.get(p.node, 0)
            seen[p.node] = local + 1
            env = {"RANK": str(p.rank), "WORLD_SIZE": str(self.spec.world_size), "LOCAL_RANK": str(local),
                   "LOCAL_WORLD_SIZE": str(per_node[p.node]), "MASTER_ADDR": master, "MASTER_PORT": str(port),
                   "OMP_NUM_THREADS": str(self._threads), "TOKENIZERS_PARALLELISM": "false"}
            if p.gpu is not None:
                env["CUDA_VISIBLE_DEVICES"] = p.gpu
            args = ["--model", self.model_path, "--work-dir", str(self.work_dir), "--spec", self.spec.model_dump_json(),
                    "--device", self._device, *(["--resume"] if self._resume else [])]
            ranks.append(_AgentRank(p.rank, p.node, f"trainer-{p.rank}", self._agents[p.node]))
            bodies.append({"module": "pearl.train.trainer", "args": args, "env": env,
                           "first_line_timeout_s": self._start_timeout_s})
        # every rank is a child from here on: a failed start still stops the others
        self._ranks = ranks  # type: ignore[assignment]

        async def one(rk: _AgentRank, body: dict[str, Any]) -> dict[str, Any]:
            try:
                out = await rk.agent.post(f"/agent/v1/children/{rk.name}/start", body)
            except (RuntimeError, aiohttp.ClientError, OSError) as e:
                raise TrainerError(f"trainer rank {rk.rank} on {rk.node} did not start: {e} "
                                   f"(its log: <output_dir>/{rk.node}/logs/{rk.name}.log on that node)") from None
            reply = out.get("first") or {}
            if not reply.get("ok"):
                raise TrainerError(f"trainer rank {rk.rank} on {rk.node}: {reply.get('error')}\n"
                                   f"{reply.get('traceback', '')}")
            return dict(reply)

        await self._await_ready(asyncio.gather(*(one(rk, b) for rk, b in zip(ranks, bodies, strict=True))))

    async def _send(self, rk: Any, msg: dict[str, Any]) -> None:
        rk.pending = msg

    async def _read(self, rk: Any) -> dict[str, Any]:
        msg, rk.pending = rk.pending, None
        if msg is None:
            raise TrainerError(f"trainer rank {rk.rank}: a reply was awaited with no command sent")
        try:
            out = await rk.agent.post(f"/agent/v1/children/{rk.name}/send", {"line": msg, "timeout_s": _LINE_TIMEOUT_S})
        except (RuntimeError, aiohttp.ClientError, OSError) as e:
            raise TrainerError(f"trainer rank {rk.rank} on {rk.node} failed during {msg.get('cmd')!r}: {e} "
                               f"(its log: <output_dir>/{rk.node}/logs/{rk.name}.log on that node)") from None
        reply = out.get("reply") or {}
        if not reply.get("ok"):
            raise TrainerError(f"trainer rank {rk.rank} on {rk.node}: {reply.get('error')}\n{reply.get('traceback', '')}")
        return dict(reply)

    async def _kill(self) -> None:
        ranks: list[Any] = list(self._ranks)
        self._ranks = []

        async def stop(rk: _AgentRank) -> None:
            with contextlib.suppress(RuntimeError, aiohttp.ClientError, OSError):
                await rk.agent.post(f"/agent/v1/children/{rk.name}/stop", {})

        await asyncio.gather(*(stop(rk) for rk in ranks))
