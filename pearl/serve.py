"""``python -m pearl serve --config C [--host H --port N]``: PEARL as a service on one node.

``Service`` is the controller process: the ``Controller`` (schedulers, tracker, decision engine)
over an engine, the admin API in front of it, and the ``RunObserver`` (TensorBoard, live progress,
run report). ``serve`` runs it alone on this machine with the engine of the config; ``pearl/main.py`` runs the
same ``Service`` on rank 0 of a torchrun job with a ``RemoteEngine`` over the node agents.

Two kinds of run, chosen by ``engine.kind``:

* ``emulated``: synthetic SWE-like sessions and the emulated trainer, in real time on the CPU, so
  the API can be tried at once (``configs/emulated-demo.yaml``);
* ``vllm`` / ``sglang``: the real thing, as ``pearl run`` does it on one node: environments from
  the config's ``env`` section (``envs.factory``), the real GRPO trainer (``TrainerClient`` with
  local ranks; under ``pearl/main.py`` an ``AgentTrainerClient`` whose ranks are node-agent
  children), and the training loop shared with ``pearl run`` (``pearl.runtime.train_loop``):
  each update is published and the serving workers reload it. ``steps`` (``--steps``) ends the
  run after that many updates; without it the service trains until stopped.

Token: ``admin.token`` or ``PEARL_ADMIN_TOKEN``; without one the API listens on loopback only.

Life cycle::

    service = Service(cfg, clock)
    await service.start()        engine -> controller.start() (rollout begins; real engines: the
                                 trainer ranks start meanwhile, then the training loop) -> admin API
                                 -> observer
    await service.run(stop)      until ``stop`` is set (SIGTERM / SIGINT), the controller finishes or
                                 the training loop has done ``steps`` updates; 1 if training failed
    await service.stop()         admin API closed first (no event lands mid-shutdown), the training
                                 loop cancelled and the trainer stopped, dispatch stopped (every worker evicted: in-flight requests
                                 aborted, each partial output written to the journal by the
                                 controller's JournaledEngine), controller.stop() (tasks cancelled,
                                 engine servers stopped), the observer writes the run report last

One service per folder: ``start`` takes an exclusive lock on ``output_dir/.pearl.lock`` (a second
``pearl serve`` on the same folder stops at once with a one-line message naming the pid that holds
it). Every start-up failure of the folder or the journal is a ``StartupError``: one line naming the
file and what to do.

Journal: ``output_dir/journal.sqlite`` (``--no-journal`` to keep none). Starting again with the same
``output_dir`` resumes: completed trajectories are not generated again and partial outputs are
replayed (``pearl.runtime.journal``); with real engines training continues from the trainer's latest
checkpoint under ``output_dir/trainer`` and the workers start on its snapshot
(``pearl.runtime.train_loop.resume_point``; ``Service.resumed_from``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pearl.access import AdminSecurityError
from pearl.admin.app import AdminServer, EventPolicy, NodesProvider
from pearl.config import RunConfig, load_config
from pearl.core.state import ClusterState
from pearl.core.trajectory import TrajectoryRecord
from pearl.engines.base import InferenceEngine
from pearl.obs.logs import setup_logging
from pearl.obs.observer import RunObserver
from pearl.runtime.clock import Clock, LoopClock, clock_epoch
from pearl.runtime.controller import Controller
from pearl.runtime.journal import Journal, JournalError
from pearl.runtime.train_loop import ResumeError, StepRecord, lends_training_gpus, resume_point, train_loop
from pearl.sim.emulated_trainer import EmulatedTrainer
from pearl.sim.sessions import SyntheticSessionFactory
from pearl.tasks import cancel_and_wait
from pearl.train.snapshot import SnapshotRef, WeightRegistry

log = logging.getLogger("pearl.serve")

EngineFactory = Callable[[Callable[[str], str]], InferenceEngine]
#: (model folder, the controller, the event sink for TrainingStarted/Finished, resume) -> a trainer
#: with ``start``, ``close``, ``version`` and ``train_step`` (``pearl.train.client.TrainerClient``'s
#: API); ``resume``: its ranks continue from the latest checkpoint of ``output_dir/trainer``
TrainerFactory = Callable[[Path, Controller, Callable[[Any], Awaitable[None]], bool], Any]


class StartupError(RuntimeError):
    """The service cannot start on its folder or journal; the message is one line naming the file
    and what to do."""


def lock_output_dir(run_dir: Path) -> int:
    """An exclusive lock on ``run_dir/.pearl.lock`` for as long as the returned descriptor is open
    (``release_output_dir``); raises ``StartupError`` when another service holds it, or the folder
    cannot be used."""
    path = run_dir / ".pearl.lock"
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise StartupError(f"output_dir {run_dir} is not a usable folder ({e.strerror or e}): "
                           "point output_dir at a writable folder") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise StartupError(f"output_dir {run_dir} is in use by another pearl serve (pid {holder}, lock {path}): "
                           "stop that service, or give this one another output_dir") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def release_output_dir(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)  # closing the descriptor releases the lock


def build_controller(cfg: RunConfig, clock: Clock, engine: InferenceEngine,
                     initial_state: ClusterState | None = None,
                     on_batch: Callable[[list[TrajectoryRecord], int], None] | None = None,
                     journal: Journal | None = None,
                     pd_pair_node: Callable[[str], str] | None = None) -> tuple[Controller, EmulatedTrainer]:
    """The real controller over ``engine`` with its agent sessions and trainer.

    Emulated engine: synthetic SWE-like sessions (``pearl.sim.sessions``) and the emulated trainer
    (``pearl.sim.emulated_trainer``: ``train.step_time_s`` per step, it tells the controller when training
    starts and finishes). Real engines need real environments and the real trainer: ``pearl run``.
    With a ``journal`` (``pearl.runtime.journal``) completed trajectories, partial outputs of aborted
    requests and the GPU table are durable, and a restart on the same journal resumes from them.
    ``pd_pair_node``: worker -> node when prefill and decode of a pair must share a node (``Router``).
    """
    if cfg.engine.kind != "emulated":
        raise ValueError(f"build_controller builds emulated runs (engine.kind={cfg.engine.kind!r}); "
                         "real engines go through Service")
    sessions = SyntheticSessionFactory(cfg.workload, clock)
    # a restart resumes the trainer's policy version: one update per consumed batch (the emulated
    # trainer keeps no other state), so the pipeline's first batch finds the version it waits for
    version = journal.trained_batches(cfg.workload.batch_size) if journal is not None else 0
    controller = Controller(cfg, engine, sessions, clock=clock, initial_state=initial_state, journal=journal,
                            initial_weights=(version, f"emulated://v{version}") if version else None,
                            clock_epoch=clock_epoch(asyncio.get_running_loop()), train_steps=version,
                            pd_pair_node=pd_pair_node)

    async def take_batch() -> list[TrajectoryRecord]:
        records = await controller.take_batch()
        if on_batch is not None:
            on_batch(records, controller.latest_weights()[0])
        return records

    trainer = EmulatedTrainer(clock, cfg.train.step_time_s, take_batch, controller.notify, controller.publish,
                              start_version=version)
    return controller, trainer


def make_local_engine(cfg: RunConfig, clock: Clock, run_dir: Path, controlled: bool = False) -> InferenceEngine:
    """The engine whose servers this node runs: emulated, or the real engine of ``engine.kind``
    (vLLM on CPU or GPU hosts, SGLang on GPU hosts; ``pearl.run.make_engine``) behind the config's
    ``engine.device_map`` (logical GPU id -> this node's device). ``controlled``: the controller of
    this process drives it (the emulator then logs its iterations for the controller's refits)."""
    if cfg.engine.kind == "emulated":
        from pearl.engines.emulated import EmulatedEngine

        return EmulatedEngine.from_config(cfg, clock, iteration_log=[] if controlled else None)
    from pearl.engines.devicemap import DeviceMappedEngine
    from pearl.run import make_engine

    return DeviceMappedEngine(make_engine(cfg, run_dir / "servers"), cfg.engine.device_map)


def local_trainer(cfg: RunConfig, run_dir: Path) -> TrainerFactory:
    """Trainer ranks as child processes of this process (``pearl serve``, ``pearl run``)."""
    from pearl.train.client import TrainerClient

    def make(model_path: Path, controller: Controller, on_event: Callable[[Any], Awaitable[None]],
             resume: bool) -> Any:
        return TrainerClient(model_path, run_dir / "trainer", cfg.train, cfg.policy.max_staleness, on_event,
                             resume=resume, device="cuda" if cfg.train.backend == "nccl" else "cpu",
                             release_when_idle=lends_training_gpus(cfg))

    return make


@dataclass(frozen=True, slots=True)
class RealRuntime:
    """What ``build_real_runtime`` wires: the ``controller``, the ``trainer`` (a ``TrainerClient``
    unless a factory was given), the weight ``registry`` and the checkpoint ``resumed_from`` (None:
    the base model)."""

    controller: Controller
    trainer: Any
    registry: WeightRegistry
    resumed_from: SnapshotRef | None


async def build_real_runtime(cfg: RunConfig, engine: InferenceEngine, model_path: Path, run_dir: Path, *,
                             clock: Clock | None = None, journal: Journal | None = None,
                             initial_state: ClusterState | None = None, resume: bool = False,
                             trainer_factory: TrainerFactory | None = None, expected_lifetime_s: float = 1800.0,
                             pd_pair_node: Callable[[str], str] | None = None) -> RealRuntime:
    """The real-engine runtime of ``pearl run`` and ``pearl serve``: the environment suite and its
    agent sessions, the controller over ``engine`` and the trainer ranks (``trainer_factory``,
    default ``local_trainer``), every collaborator handed to its constructor.

    ``resume``: continue from the trainer's last checkpoint under ``run_dir/trainer`` when there is
    one (the workers start on its snapshot, the registry holds it and the step count continues);
    ``cfg.model.path`` is ``model_path`` (resolved by the caller)."""
    from envs.factory import build_suite, load_tokenizer, make_session_factory

    suite = await build_suite(cfg.env)
    factory = make_session_factory(suite, load_tokenizer(model_path), cfg)
    resumed = resume_point(run_dir / "trainer") if resume else None
    registry = WeightRegistry((resumed,) if resumed is not None else ())
    initial = (resumed.version, resumed.path) if resumed is not None else (0, str(model_path))
    controller = Controller(cfg, engine, factory, None, clock=clock, initial_state=initial_state,
                            initial_weights=initial, registry=registry, journal=journal,
                            expected_lifetime_s=expected_lifetime_s,
                            clock_epoch=clock_epoch(asyncio.get_running_loop()),
                            train_steps=initial[0], pd_pair_node=pd_pair_node)

    async def on_event(ev: Any) -> None:  # TrainingStarted / Finished -> toggle manager (awaited)
        await controller.notify(ev)

    make = trainer_factory or local_trainer(cfg, run_dir)
    return RealRuntime(controller, make(model_path, controller, on_event, resumed is not None), registry, resumed)


class Service:
    def __init__(self, cfg: RunConfig, clock: Clock, engine_factory: EngineFactory | None = None,
                 host: str | None = None, port: int | None = None, nodes: NodesProvider | None = None,
                 live: bool = False, env: dict[str, str] | None = None,
                 initial_state: ClusterState | None = None, journal: bool = True,
                 trainer_factory: TrainerFactory | None = None, steps: int | None = None,
                 pd_pair_node: Callable[[str], str] | None = None) -> None:
        self.cfg = cfg
        self.clock = clock
        self.run_dir = Path(cfg.output_dir)
        self._engine_factory = engine_factory
        self._host = host
        self._port = port
        self._nodes = nodes
        self._live = live
        self._env = env
        self.initial_state = initial_state
        self.journal_path = self.run_dir / "journal.sqlite" if journal else None
        self.journal: Journal | None = None
        self.engine: InferenceEngine | None = None
        self.controller: Controller | None = None
        self.trainer: Any = None  # EmulatedTrainer (emulated) or a TrainerClient (real engines)
        self.real = cfg.engine.kind != "emulated"
        self._trainer_factory = trainer_factory
        self.steps = steps
        #: worker -> node, when the engine cannot split a PD pair across nodes: the router then pairs
        #: prefill and decode workers on one node (``pearl.runtime.pipeline.Router.pair_node``)
        self._pd_pair_node = pd_pair_node
        self.steps_done: list[StepRecord] = []
        self._train_task: asyncio.Task[list[StepRecord]] | None = None
        #: real engines: the checkpointed snapshot a restarted run continues from (None: base model)
        self.resumed_from: SnapshotRef | None = None
        self.aborted_at_stop = 0
        self.admin: AdminServer | None = None
        self.observer: RunObserver | None = None
        #: one node (no node agents): the cloud watch of this machine (``cfg.cloud_watch``, opt-in);
        #: under ``pearl/main.py`` each node agent runs its own and rank 0 relays what they see
        self.cloud_watch: Any = None
        self._lock: int | None = None

    async def start(self) -> None:
        self._lock = lock_output_dir(self.run_dir)
        if self._engine_factory is not None:
            self.engine = self._engine_factory(self._node_of)
        else:
            self.engine = make_local_engine(self.cfg, self.clock, self.run_dir, controlled=True)
        assert self.engine is not None
        if self.journal_path is not None:
            resumed = self.journal_path.exists()
            try:
                self.journal = Journal(self.journal_path)
            except JournalError as e:
                raise StartupError(str(e)) from None
            if resumed:
                log.info("resuming from journal %s: %s", self.journal_path, self.journal.counts())
        if self.real:
            registry = await self._build_real()
        else:
            self.controller, self.trainer = build_controller(self.cfg, self.clock, self.engine, self.initial_state,
                                                             self._on_batch, self.journal, self._pd_pair_node)
        assert self.controller is not None
        # the admin server is built first: a bad listen address must fail before any work starts
        owner = "the GRPO trainer (pearl.train)" if self.real else "the emulated trainer (pearl.sim.emulated_trainer)"
        policy = EventPolicy(training_owner=owner, max_preemptible_gpus=self.cfg.cluster.max_preemptible_gpus)
        self.admin = AdminServer(self.controller, self.cfg.admin, self.clock.now, self._host, self._port, self._env,
                                 nodes=self._nodes, policy=policy)
        if self.real:
            log.info("starting the trainer ranks and the initial inference workers ...")
            await asyncio.gather(self.trainer.start(), self.controller.start())
            self._check_resumed()
            self._train_task = asyncio.get_running_loop().create_task(
                train_loop(self.controller, self.trainer, registry, self.steps, records=self.steps_done,
                           note_batch=self._on_batch, on_step=self._log_step, now=self.clock.now),
                name="train-loop")
        else:
            await self.controller.start()
            self.trainer.start()
        replay = await self.admin.replay()  # journaled grants / notices the controller had not finished
        if any(replay.values()):
            log.info("journaled events: %s", replay)
        await self.admin.start()
        if self.cfg.cloud_watch.enabled and self._nodes is None:
            self.cloud_watch = self._start_cloud_watch("node0")
        self.observer = RunObserver(self.controller, self.clock.now, self.clock.sleep, self.run_dir,
                                    tensorboard=self.cfg.admin.tensorboard, live=self._live, title=self.cfg.name)
        self.observer.start()

    async def _build_real(self) -> Any:
        """Controller and trainer of a real-engine run (``build_real_runtime``); returns the weight registry."""
        from pearl.run import _resolve_model_path  # builds the local demo models when missing

        assert self.engine is not None
        model_path = _resolve_model_path(self.cfg)
        self.cfg = self.cfg.model_copy(update={"model": self.cfg.model.model_copy(update={"path": str(model_path)})})
        rt = await build_real_runtime(self.cfg, self.engine, model_path, self.run_dir, clock=self.clock,
                                      journal=self.journal, initial_state=self.initial_state,
                                      resume=self.journal_path is not None, trainer_factory=self._trainer_factory,
                                      pd_pair_node=self._pd_pair_node)
        self.controller, self.trainer, self.resumed_from = rt.controller, rt.trainer, rt.resumed_from
        log.info("real-engine run: model %s (%s), env %s, batch %d, %s training steps%s", self.cfg.model.name,
                 model_path, self.cfg.env.kind, self.cfg.workload.batch_size, self.steps or "unlimited",
                 f", resuming at policy v{rt.resumed_from.version} ({rt.resumed_from.path})"
                 if rt.resumed_from is not None else "")
        return rt.registry

    def _start_cloud_watch(self, node: str) -> Any:
        from pearl.runtime.node.cloud_watch import CloudSignal, CloudWatch, build_sources

        assert self.admin is not None
        app = self.admin.admin

        async def sink(sig: CloudSignal) -> None:
            await app.cloud_signal(sig.instance_id, sig.node, sig.deadline_wall, sig.source)

        watch = CloudWatch(build_sources(self.cfg.cloud_watch, node), sink)
        watch.start()
        log.info("cloud watch on %s: %s", node, ", ".join(s.name for s in watch.sources))
        return watch

    def _check_resumed(self) -> None:
        """The trainer ranks must stand at the version the workers were started with."""
        want = self.resumed_from.version if self.resumed_from is not None else 0
        if self.trainer.version != want:
            raise ResumeError(f"the trainer ranks started at version {self.trainer.version}, the serving workers "
                              f"at v{want}: a checkpoint under {self.run_dir / 'trainer'} changed during start-up")

    def _log_step(self, rec: StepRecord) -> None:
        log.info("train step %d: %d trajectories, mean reward %.3f, train %.1f s, weight sync %.1f s, policy v%d",
                 rec.step, rec.trajectories, rec.mean_reward, rec.train_s, rec.sync_s, rec.version)

    def _on_batch(self, records: list[TrajectoryRecord], trainer_version: int) -> None:
        if self.observer is not None:
            self.observer.note_batch(records, trainer_version)

    def _node_of(self, gpu_id: str) -> str:
        assert self.controller is not None
        return self.controller.executor.state.gpu(gpu_id).node

    async def run(self, stop: asyncio.Event) -> int:
        """Until ``stop`` is set, the controller's run ends by itself or the training loop ends
        (``steps`` done: 0; failed: 1, the error logged)."""
        assert self.controller is not None
        waiters = [asyncio.ensure_future(stop.wait()),
                   asyncio.ensure_future(self.controller.wait_batches(sys.maxsize))]
        try:
            await asyncio.wait([*waiters, *([self._train_task] if self._train_task else [])],
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                await cancel_and_wait(w)
        t = self._train_task
        if t is not None and t.done() and not t.cancelled():
            if t.exception() is not None:
                log.error("training failed: %s", t.exception(), exc_info=t.exception())
                return 1
            log.info("training finished: %d step(s)", len(self.steps_done))
        return 0

    async def _journal_counts(self) -> dict[str, int] | str:
        """The journal's row counts, read on its writer thread (a failing disk never stalls the loop)."""
        assert self.journal is not None
        try:
            return await asyncio.wait_for(self.journal.commit(self.journal.counts, "counts"), 5.0)
        except (TimeoutError, JournalError) as e:
            return f"counts not read: {type(e).__name__} {e}".rstrip()

    async def stop(self) -> Path | None:
        """Shut down in order, each phase bounded (``SHUTDOWN_BOUND_S``) and logged with its time: a
        phase that overruns is cancelled with a WARNING naming it, and the next one runs. A request
        whose abort did not return in time keeps no partial output: its turn runs again from the
        journal's last record on a restart (nothing is lost)."""
        report = None
        if self.cloud_watch is not None:
            await _bounded("cloud watch closed", self.cloud_watch.close())
            self.cloud_watch = None
        if self.admin is not None:
            await _bounded("admin API stopped", self.admin.stop())
        if self._train_task is not None:
            self._train_task.cancel()
            await _bounded("training loop cancelled", asyncio.gather(self._train_task, return_exceptions=True))
        if self.trainer is not None:
            await _bounded("trainer stopped", self.trainer.close() if self.real else self.trainer.stop(),
                           TRAINER_STOP_BOUND_S)
        if self.controller is not None:
            # stop dispatch: evict every worker (aborts in-flight requests; each turn keeps its
            # partial output), then cancel the pipeline and the schedulers, then stop the servers
            pipe = self.controller.pipeline
            workers = sorted(self.controller.executor.state.workers)

            drained: set[str] = set()

            async def evict(wid: str) -> None:
                with contextlib.suppress(Exception):
                    self.aborted_at_stop += await pipe.evict(wid)
                drained.add(wid)

            if not await _bounded(f"dispatch stopped on {len(workers)} worker(s)",
                                  asyncio.gather(*(evict(w) for w in workers))):
                log.warning("shutdown: %s did not drain; their in-flight turns run again from the journal on a "
                            "restart", ", ".join(w for w in workers if w not in drained))
            kept = "" if self.journal is None else f" (journal {self.journal_path}: {await self._journal_counts()})"
            log.info("shutdown: dispatch stopped, %d in-flight request(s) aborted with partial output kept%s",
                     self.aborted_at_stop, kept)
            await _bounded("controller and engine servers stopped", self.controller.stop(close_engine=True))
        elif self.engine is not None:
            await _bounded("engine servers stopped", self.engine.close())
        if self.observer is not None:
            report = await self.observer.stop()
            log.info("run report: %s", report)
        if self.journal is not None:
            self.journal.close()
            self.journal = None
        if self._lock is not None:
            release_output_dir(self._lock)
            self._lock = None
        return report


SHUTDOWN_BOUND_S = 45.0
"""The most one shutdown phase may take: a dispatch stop waits for aborted requests to return, the
servers' stop is SIGTERM then SIGKILL after their grace."""
TRAINER_STOP_BOUND_S = 75.0
"""The trainer's stop: at most 30 s asking every rank to shut down, then SIGTERM / SIGKILL graces."""


async def _bounded(phase: str, aw: Awaitable[Any], bound_s: float | None = None) -> bool:
    """Await one shutdown phase for at most ``bound_s`` (default ``SHUTDOWN_BOUND_S``); log how long
    it took (INFO), or that it overran and was cancelled (WARNING), or how it failed (WARNING). True
    when it finished in time."""
    bound_s = SHUTDOWN_BOUND_S if bound_s is None else bound_s
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    try:
        await asyncio.wait_for(aw, bound_s)
    except TimeoutError:
        log.warning("shutdown: %s: not done after %.0f s; cancelled, going on", phase, bound_s)
        return False
    except Exception as e:  # a failed phase must not keep the next ones from running
        log.warning("shutdown: %s failed after %.1f s (%s: %s); going on", phase, loop.time() - t0,
                    type(e).__name__, e)
        return False
    log.info("shutdown: %s in %.1f s", phase, loop.time() - t0)
    return True


async def serve(cfg: RunConfig, host: str | None, port: int | None, live: bool, journal: bool = True,
                steps: int | None = None) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    service = Service(cfg, LoopClock(), host=host, port=port, live=live, journal=journal, steps=steps)
    try:
        await service.start()
        assert service.admin is not None
        log.info("PEARL serving: admin API %s (OpenAPI: %s/v1/openapi.json)", service.admin.url, service.admin.url)
        rc = await service.run(stop)
    finally:
        await service.stop()
    return rc


def _serve_cmd(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    secrets = [s for s in (cfg.admin.token, os.environ.get("PEARL_ADMIN_TOKEN")) if s]
    setup_logging(args.log_level, json_lines=args.log_json or cfg.admin.log_json, secrets=secrets)
    import uvloop

    from pearl.run import RunError

    try:
        return int(uvloop.run(serve(cfg, args.host, args.port, args.live, journal=not args.no_journal,
                                    steps=args.steps)))
    except AdminSecurityError as e:
        print(f"pearl serve: {e}", file=sys.stderr)
        return 2
    except (RunError, ResumeError, StartupError) as e:  # cannot be set up (no weights, folder in use, ...)
        print(f"pearl serve: error: {e}", file=sys.stderr)
        return 2


def add_serve_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("serve", help="run PEARL on this node as a service with the admin API")
    p.add_argument("--config", required=True, help="run config (e.g. configs/emulated-demo.yaml)")
    p.add_argument("--host", default=None, help="admin API host (default: admin.host)")
    p.add_argument("--port", type=int, default=None, help="admin API port (default: admin.port; 0 = any free)")
    p.add_argument("--live", action="store_true", help="live progress panel (rich) on stderr")
    p.add_argument("--no-journal", action="store_true",
                   help="keep no durable journal (default: output_dir/journal.sqlite; a restart resumes from it)")
    p.add_argument("--steps", type=int, default=None,
                   help="real engines: stop after this many training steps (default: train until stopped)")
    p.add_argument("--log-json", action="store_true", help="logs as JSON lines")
    p.add_argument("--log-level", default="INFO")
    p.set_defaults(func=_serve_cmd)
