"""``torchrun --nnodes N --nproc-per-node 1 ... pearl/main.py --config C``: one PEARL process per node.

Every rank (one asyncio process on uvloop) hosts a **node agent** (``pearl.runtime.node.agent``)
that launches and stops this node's engine servers and trainer ranks on the controller's command
and reports their health. **Rank 0** also hosts the controller, the admin API and the observer
(``pearl.serve.Service``) with a ``RemoteEngine`` over all agents, and the ``AgentWatcher``
(``pearl.runtime.node.watch``) that polls every agent's health and treats a lost node like a
reclaim.

Engines (``engine.kind``): ``emulated`` runs synthetic sessions and the emulated trainer; ``vllm``
(CPU or GPU hosts) and ``sglang`` (GPU hosts) run the real thing as ``pearl run`` does on one node:
every agent serves its node's workers with the local engine (``VllmEngine`` / ``SglangEngine``
behind ``engine.device_map``), the trainer ranks are agent children (``AgentTrainerClient``:
``pearl.train.trainer`` over the agent's children protocol, placed on the training GPUs' nodes),
environments come from the config's ``env`` section and the training loop is ``pearl run``'s
(``pearl.runtime.train_loop``). ``--steps N`` ends the run after N updates (exit 0).
``--preflight`` checks this host for what the config needs (GPUs, SGLang, Docker, weights) and
exits 2 naming what is missing (``make swebench-*`` runs it before torchrun). A start-up failure
of the service (``output_dir`` in use or unusable, a corrupt journal, no weights) prints one line,
``pearl/main.py: rank <r>: error: <what failed and what to do>``, and exits 2.

Start-up (the torchrun environment: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``; two plain processes with these variables work the same)::

    1. init the torch.distributed process group (gloo on CPU; it carries tensors only) and check it
       with one all_reduce (sum of ones == WORLD_SIZE);
    2. rendezvous through the group's TCP store (key prefix ``pearl/``): rank 0 publishes a fresh
       internal token for the agents, every rank publishes its agent's URL;
    3. rank 0 builds the ``RemoteEngine`` (GPU -> node from the cluster table: node ``node<r>`` is
       rank ``r``) and starts the service; the other ranks serve their agent. If any agent's engine
       cannot split a PD pair across nodes (``split_pd: false``: the emulated engine), the router
       pairs prefill and decode workers on one node only (``Service(pd_pair_node=...)``). A restart
       on the same ``output_dir`` resumes the journal and the trainer's last checkpoint
       (``Service``; the agents' trainer ranks start with ``--resume``).

Shutdown (SIGTERM / SIGINT on any rank, or the run finishing on rank 0)::

    rank 0:  service.stop()  (stop dispatch, abort in-flight requests keeping partial outputs,
                              journal them, stop the trainer, write the report)
             -> POST /agent/v1/shutdown to every other agent -> close its own agent
    rank r:  on /shutdown or a signal -> close the agent (stop engine servers and children)
    all:     gloo barrier (bounded) -> destroy the process group -> exit 0

Controller <-> agents talk HTTP (aiohttp); torch.distributed is never used for control messages.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

if __package__ in (None, ""):  # run as a script by torchrun: make `pearl` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp

from pearl.access import is_loopback
from pearl.config import RunConfig, load_config
from pearl.core.state import ClusterState, Gpu, Zone
from pearl.obs.logs import setup_logging
from pearl.runtime.clock import Clock
from pearl.runtime.node.agent import AgentClient, NodeAgent, RemoteEngine
from pearl.runtime.node.wire import capabilities_from_dict, common_capabilities
from pearl.tasks import cancel_and_wait

log = logging.getLogger("pearl.main")

STORE_PREFIX = "pearl/"
_BARRIER_TIMEOUT_S = 60.0
_AGENT_SHUTDOWN_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int

    @staticmethod
    def from_environ(env: dict[str, str] | None = None) -> DistEnv:
        e = dict(os.environ if env is None else env)
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in e]
        if missing:
            raise SystemExit(
                f"pearl/main.py: missing {', '.join(missing)}; start it with torchrun "
                "(`torchrun --nproc-per-node 1 pearl/main.py --config C`) or use `python -m pearl serve`"
            )
        return DistEnv(int(e["RANK"]), int(e["WORLD_SIZE"]), int(e.get("LOCAL_RANK", "0")),
                       e["MASTER_ADDR"], int(e["MASTER_PORT"]))

    @property
    def node(self) -> str:
        return f"node{self.rank}"


def init_group(env: DistEnv) -> object:
    """Init gloo, check it with one all_reduce, and return a store client for the rendezvous."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="env://", rank=env.rank, world_size=env.world_size,
                            timeout=timedelta(seconds=300))
    t = torch.ones(1)
    dist.all_reduce(t)
    if int(t.item()) != env.world_size:
        raise RuntimeError(f"gloo all_reduce gave {t.item()}, expected world size {env.world_size}")
    store = dist.TCPStore(env.master_addr, env.master_port, env.world_size, is_master=False,  # type: ignore[attr-defined]
                          timeout=timedelta(seconds=300))
    return dist.PrefixStore(STORE_PREFIX, store)  # type: ignore[attr-defined]


def placed_state(cfg: RunConfig, world_size: int) -> ClusterState:
    """The initial table with GPUs placed on the ranks' nodes: reserved GPUs ``r0..`` then training
    GPUs ``t0..``, ``cluster.gpus_per_node`` per node, node ``node<k>`` = rank ``k``. Preemptible GPUs
    arrive by grants that name their node (one of ``node0..node<WORLD_SIZE-1>``)."""
    per = cfg.cluster.gpus_per_node
    ids = [(f"r{i}", Zone.RESERVED) for i in range(cfg.cluster.reserved_gpus)]
    ids += [(f"t{i}", Zone.OVERLAP) for i in range(cfg.cluster.training_gpus)]
    nodes_needed = -(-len(ids) // per)
    if nodes_needed > world_size:
        raise SystemExit(
            f"{len(ids)} reserved + training GPUs at cluster.gpus_per_node={per} need {nodes_needed} nodes, "
            f"but WORLD_SIZE={world_size}; start more ranks or raise gpus_per_node"
        )
    return ClusterState.build(Gpu(g, zone, f"node{k // per}") for k, (g, zone) in enumerate(ids))


def _agent_host(env: DistEnv) -> tuple[str, str]:
    """(bind address, advertised host) of this rank's agent."""
    host = os.environ.get("PEARL_AGENT_HOST")
    if host:
        return host, host
    if is_loopback(env.master_addr):
        return "127.0.0.1", "127.0.0.1"
    return "0.0.0.0", socket.getfqdn()


def preflight(cfg: RunConfig, nnodes: int) -> list[str]:
    """What this host lacks for ``cfg`` on ``nnodes`` nodes (empty: nothing found missing)."""
    import importlib.util
    import shutil
    import subprocess

    problems: list[str] = []
    try:
        placed_state(cfg, nnodes)
    except SystemExit as e:
        problems.append(str(e))
    kind = cfg.engine.kind
    if kind == "sglang" and importlib.util.find_spec("sglang") is None:
        problems.append("engine.kind=sglang but SGLang is not installed here (pip install -e '.[sglang]' on a GPU host)")
    if kind == "sglang" or cfg.train.backend == "nccl":
        import torch

        found = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if found < cfg.cluster.gpus_per_node:
            problems.append(f"cluster.gpus_per_node={cfg.cluster.gpus_per_node} GPUs needed on every node, this host "
                            f"has {found} CUDA device(s) (torch {torch.__version__})")
    if kind != "emulated" and cfg.model.path is not None:
        path = Path(cfg.model.path)
        if not path.is_absolute():
            path = Path(__file__).resolve().parent.parent / path
        if not (path / "config.json").is_file() and path.name not in ("smollm2-135m", "tiny-qwen3"):
            problems.append(f"model.path {path} has no config.json: put the {cfg.model.name} weights there "
                            "(Hugging Face layout) or set model.path")
    if kind != "emulated" and cfg.env.kind == "swebench":
        docker = shutil.which(cfg.env.docker_binary)
        if docker is None:
            problems.append(f"env.kind=swebench needs a Docker engine on rank 0's host: {cfg.env.docker_binary!r} "
                            "is not on PATH")
        else:
            try:
                ok = subprocess.run([docker, "info"], capture_output=True, timeout=30).returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                ok = False
            if not ok:
                problems.append(f"`{docker} info` failed: start the Docker engine (and pull the SWE-bench images)")
    return problems


async def run_rank(cfg: RunConfig, env: DistEnv, store: object, args: argparse.Namespace) -> int:
    from pearl.runtime.clock import LoopClock

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    clock = LoopClock()
    run_dir = Path(cfg.output_dir)
    if env.rank == 0:
        token = secrets.token_urlsafe(32)
        await asyncio.to_thread(store.set, "agent_token", token)  # type: ignore[attr-defined]
    else:
        token = (await asyncio.to_thread(store.get, "agent_token")).decode()  # type: ignore[attr-defined]
    bind, advertised = _agent_host(env)
    from pearl.serve import make_local_engine

    engine = make_local_engine(cfg, clock, (run_dir / env.node).resolve())
    agent = NodeAgent(env.node, env.rank, engine, token, host=bind, port=cfg.admin.agent_port,
                      log_dir=str(run_dir / env.node / "logs"),
                      server_host=None if is_loopback(advertised) else advertised,
                      cloud_watch=_cloud_watch(cfg, env.node))
    await agent.start()
    url = f"http://{advertised}:{agent.port}"
    await asyncio.to_thread(store.set, f"agent/{env.rank}", url)  # type: ignore[attr-defined]
    rc = 0
    try:
        if env.rank == 0:
            rc = await _run_controller(cfg, env, store, token, clock, stop, args)
        else:
            waiter = asyncio.ensure_future(agent.shutdown_requested.wait())
            stopper = asyncio.ensure_future(stop.wait())
            try:
                await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for f in (waiter, stopper):
                    await cancel_and_wait(f)
            log.info("rank %d: shutting down (%s)", env.rank,
                     "controller asked" if agent.shutdown_requested.is_set() else "signal")
    finally:
        await agent.close()
    return rc


def _cloud_watch(cfg: RunConfig, node: str) -> object:
    """This node's cloud watch (``cfg.cloud_watch``, opt-in); rank 0's agent watcher relays its signals."""
    if not cfg.cloud_watch.enabled:
        return None
    from pearl.runtime.node.cloud_watch import CloudWatch, build_sources

    async def keep(_sig: object) -> None:  # kept in the watch's view, which the agent's /health serves
        return None

    return CloudWatch(build_sources(cfg.cloud_watch, node), keep)


async def _run_controller(cfg: RunConfig, env: DistEnv, store: object, token: str, clock: Clock,
                          stop: asyncio.Event, args: argparse.Namespace) -> int:
    from pearl.runtime.node.watch import AgentWatcher, cloud_relay, node_lost_handler
    from pearl.serve import Service

    urls = {}
    for r in range(env.world_size):
        urls[f"node{r}"] = (await asyncio.to_thread(store.get, f"agent/{r}")).decode()  # type: ignore[attr-defined]
    state = placed_state(cfg, env.world_size)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=30)) as http:
        clients = {n: AgentClient(u, token, http) for n, u in urls.items()}
        first: dict[str, dict[str, object]] = {}
        for n, c in clients.items():
            first[n] = h = await c.health()
            log.info("agent %s at %s: healthy (rank %s, cross-node PD: %s)", n, c.url, h["rank"], h.get("split_pd"))
        caps = common_capabilities(capabilities_from_dict(h["capabilities"]) for h in first.values())  # type: ignore[arg-type]
        remote: list[RemoteEngine] = []

        def make_remote(node_of: Callable[[str], str]) -> RemoteEngine:
            remote.append(RemoteEngine(clients, node_of, caps))
            return remote[0]

        def lost_early(node: str, reason: str) -> None:  # during start-up: fail that node's launches at once
            if remote:
                remote[0].mark_node_dead(node, reason)

        def back_early(node: str) -> None:  # ... and a node that answers again may be launched on again
            if remote:
                remote[0].mark_node_alive(node)

        a = cfg.admin
        watcher = AgentWatcher({n: c.health for n, c in clients.items()}, clock, on_dead=lost_early,
                               on_alive=back_early,
                               period_s=a.agent_health_period_s, timeout_s=a.agent_health_timeout_s,
                               max_misses=a.agent_health_misses)
        for n, h in first.items():
            watcher.seed(n, h)

        async def nodes() -> list[dict[str, object]]:
            return watcher.view()  # the watcher's last poll: the admin API never polls agents itself

        service = Service(cfg, clock, engine_factory=make_remote,
                          host=args.host, port=args.port, nodes=nodes, live=args.live, journal=not args.no_journal,
                          initial_state=state, steps=args.steps,
                          trainer_factory=_agent_trainer(cfg, state, clients, urls, env.world_size),
                          pd_pair_node=None if caps.split_pd
                          else lambda w: remote[0].node_of_worker(w))
        rc = 0
        try:
            watcher.start()  # from the first launch on: a node lost during start-up fails over too
            await service.start()
            assert service.admin is not None and service.controller is not None
            await watcher.serve(node_lost_handler(service.controller, remote[0]), remote[0].mark_node_alive,
                                cloud_relay(service.admin.admin))
            await watcher.poll_once()  # /v1/nodes shows the launched workers from the first request on
            log.info("PEARL serving on %d node(s): admin API %s", env.world_size, service.admin.url)
            rc = await service.run(stop)
        finally:
            await watcher.close()
            await service.stop()
            for n, c in clients.items():
                if n != env.node:  # a node that does not answer stops on its own signal or the barrier's end
                    with contextlib.suppress(aiohttp.ClientError, RuntimeError, OSError, TimeoutError):
                        await asyncio.wait_for(c.shutdown(), _AGENT_SHUTDOWN_TIMEOUT_S)
    return rc


def _agent_trainer(cfg: RunConfig, state: ClusterState, clients: dict[str, AgentClient], urls: dict[str, str],
                   world_size: int) -> Callable[..., object] | None:
    """Trainer ranks as node-agent children (real engines), placed by ``trainer_placement``."""
    if cfg.engine.kind == "emulated":
        return None
    from urllib.parse import urlparse

    from pearl.runtime.node.trainer_client import AgentTrainerClient, trainer_placement
    from pearl.runtime.train_loop import lends_training_gpus

    nodes = [f"node{r}" for r in range(world_size)]
    placements = trainer_placement(state, cfg.train.world_size, nodes, cfg.cluster.gpus_per_node,
                                   cfg.engine.device_map)
    hosts = {n: urlparse(u).hostname or "127.0.0.1" for n, u in urls.items()}
    busiest = max(sum(1 for p in placements if p.node == n) for n in nodes)
    threads = max(1, (os.cpu_count() or 1) // busiest)  # nodes are alike: this host's cores stand for theirs
    work_dir = (Path(cfg.output_dir) / "trainer").resolve()  # on a shared filesystem on a cluster

    def make(model_path: Path, controller: object, on_event: Callable[..., object],
             resume: bool) -> AgentTrainerClient:
        log.info("trainer: %d rank(s) on %s%s", len(placements), ", ".join(f"{p.rank}@{p.node}" for p in placements),
                 " (resuming from the latest checkpoint)" if resume else "")
        return AgentTrainerClient(placements, clients, hosts, model_path, work_dir, cfg.train,
                                  cfg.policy.max_staleness, on_event,  # type: ignore[arg-type]
                                  device="cuda" if cfg.train.backend == "nccl" else "cpu", threads_per_rank=threads,
                                  release_when_idle=lends_training_gpus(cfg), resume=resume)

    return make


def _finish_group(env: DistEnv) -> None:
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    with contextlib.suppress(RuntimeError):
        work = dist.barrier(async_op=True)
        if work is not None:
            work.wait(timeout=timedelta(seconds=_BARRIER_TIMEOUT_S))
    with contextlib.suppress(RuntimeError):
        dist.destroy_process_group()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="pearl/main.py", description="PEARL, one process per node (torchrun)")
    ap.add_argument("--config", required=True, help="run config YAML (or a name in configs/)")
    ap.add_argument("--host", default=None, help="admin API host on rank 0 (default: admin.host)")
    ap.add_argument("--port", type=int, default=None, help="admin API port on rank 0 (default: admin.port)")
    ap.add_argument("--log-level", default="INFO")
    ap.add_argument("--log-json", action="store_true", help="logs as JSON lines (also admin.log_json)")
    ap.add_argument("--live", action="store_true", help="live progress panel on rank 0's stderr")
    ap.add_argument("--no-journal", action="store_true", help="no durable journal on rank 0")
    ap.add_argument("--steps", type=int, default=None,
                    help="real engines: finish after this many training steps (default: train until stopped)")
    ap.add_argument("--preflight", action="store_true",
                    help="only check this host for what the config needs (GPUs, SGLang, Docker, weights); exit 2 if "
                         "anything is missing")
    ap.add_argument("--nnodes", type=int, default=None, help="with --preflight: the number of nodes (WORLD_SIZE)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = load_config(args.config)
    if args.preflight:
        nnodes = args.nnodes or int(os.environ.get("WORLD_SIZE", "1"))
        problems = preflight(cfg, nnodes)
        if problems:
            print(f"pearl/main.py: {args.config} cannot run on this host ({socket.gethostname()}):", file=sys.stderr)
            for p in problems:
                print(f"  - {p}", file=sys.stderr)
            return 2
        print(f"pearl/main.py: preflight ok for {args.config} on {nnodes} node(s)", file=sys.stderr)
        return 0
    env = DistEnv.from_environ()
    secrets_ = [s for s in (cfg.admin.token, os.environ.get("PEARL_ADMIN_TOKEN")) if s]
    setup_logging(args.log_level, json_lines=args.log_json or cfg.admin.log_json, secrets=secrets_)
    store = init_group(env)
    from pearl.run import RunError
    from pearl.runtime.train_loop import ResumeError
    from pearl.serve import StartupError

    try:
        import uvloop

        rc = uvloop.run(run_rank(cfg, env, store, args))
    except (StartupError, RunError, ResumeError) as e:  # cannot be set up: folder in use, corrupt journal, ...
        print(f"pearl/main.py: rank {env.rank}: error: {e}", file=sys.stderr)
        rc = 2
    finally:
        _finish_group(env)
    log.info("rank %d: exit %d", env.rank, rc)
    return rc


if __name__ == "__main__":
    sys.exit(main())
