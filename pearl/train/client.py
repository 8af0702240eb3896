"""``TrainerClient``: the asyncio controller's handle on the trainer ranks (child processes).

The controller never blocks on training: ``train_step`` filters and packs the records (pure,
``pearl.train.batch``), then awaits the rank processes' replies over pipes while the event loop
keeps serving rollouts.

Life cycle::

    client = TrainerClient(model_path, work_dir, spec, max_staleness, on_event=...)
    await client.start()              spawn WORLD_SIZE ranks (`python -m pearl.train.trainer`, torchrun
                                      environment: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT),
                                      await their "ready" (resume: from the latest checkpoint)
    result = await client.train_step(records)
        1. filter_records: staleness bound, counted drops        (nothing to train: no update)
        2. on_event(TrainingStarted(step))  -- awaited: the toggle manager returns borrowed
           GPUs before the update starts; the wait is timed as ``timings["gpu_return_wait_s"]``
        3. make_samples (group advantages) -> "reload" if the ranks were offloaded -> shard_samples
           -> one "step" command per rank
        4. with ``release_when_idle``: "offload" (the ranks free their device memory, so a GPU the
           toggle manager lends next has room for the inference worker), timed as ``offload_s``
        5. on_event(TrainingFinished(step, version, expected_idle_s))
        -> TrainResult(version, snapshot, metrics, timings, report)

Exactly once: ``filter_records`` drops (and counts) a second record of a ``traj_id`` in the batch
and every record whose ``traj_id`` an earlier update of this client consumed (``consumed``).

A non-finite loss or gradient norm (the ranks agree: both are global) makes the ranks refuse the
update: weights, optimizer state and version stay those of the last good step, no snapshot is
written, ``metrics["skipped_nonfinite"]`` is 1 and ``nonfinite_skipped`` counts such refusals; the
result is not ``updated`` (the batch is done with, as one whose groups were all filtered), and the
step number is tried again by the next call, with event ids ``train-start-<n>-retry<k>``.
    await client.close()              "shutdown" to every rank, then terminate / kill stragglers

A rank that dies or replies with an error makes the client *failed*: every rank is stopped (the
others would hang in a collective) and ``TrainerError`` names the rank, its error and the tail of
its log; restart with ``resume=True`` to continue from the last checkpoint. The records of the
failed step are still the caller's (nothing was consumed).

``expected_idle_s`` in ``TrainingFinished`` is an EMA (weight 0.5) of the observed gaps between
the end of one update and the next ``train_step`` call (None until one gap was seen): the idle
window in which training GPUs may be lent to rollout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pearl.config import TrainSpec
from pearl.core.events import TrainingFinished, TrainingStarted
from pearl.core.trajectory import TrajectoryRecord
from pearl.procutil import die_with_parent
from pearl.train.batch import FilterReport, filter_records, make_samples, shard_samples
from pearl.train.broadcast import Layout
from pearl.train.grpo import global_denominator
from pearl.train.snapshot import SnapshotRef

TrainingEvent = TrainingStarted | TrainingFinished
EventSink = Callable[[TrainingEvent], Awaitable[None]]

_READ_LIMIT = 1 << 26  # longest reply line (bytes)
log = logging.getLogger(__name__)


def _brief(reply: dict[str, Any]) -> str:
    """A reply's keys and scalar values, for a log line (never a layout or tensor list)."""
    return ", ".join(f"{k}={v}" if isinstance(v, int | float | str | bool) else k for k, v in reply.items())


class TrainerError(RuntimeError):
    """The trainer failed; the message names the rank, the error and the log tail."""


@dataclass(frozen=True)
class TrainResult:
    """One update: the new weight version, its snapshot (None if nothing was trained), metrics
    (GRPO terms and filter counts), timings (seconds) and the staleness filter report."""

    step: int
    version: int
    snapshot: SnapshotRef | None
    metrics: dict[str, float] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    report: FilterReport = field(default_factory=FilterReport)
    #: the trainer's state after this call (``step``) is in a checkpoint a restart resumes from:
    #: ``step % train.checkpoint_every == 0`` (step 0 is the base model; a skipped call leaves the
    #: state of ``step`` unchanged)
    checkpointed: bool = True

    @property
    def updated(self) -> bool:
        return self.snapshot is not None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class _Rank:
    rank: int
    proc: asyncio.subprocess.Process
    log: Path


class TrainerClient:
    """Async handle on ``spec.world_size`` trainer rank processes (see module docstring)."""

    def __init__(
        self,
        model_path: str | Path,
        work_dir: str | Path,
        spec: TrainSpec,
        max_staleness: int,
        on_event: EventSink | None = None,
        *,
        resume: bool = False,
        device: str = "cpu",
        threads_per_rank: int | None = None,
        release_when_idle: bool = False,
        now: Callable[[], float] = time.monotonic,
        python: str = sys.executable,
    ) -> None:
        self.model_path = str(model_path)
        self.work_dir = Path(work_dir)
        self.spec = spec
        self.max_staleness = max_staleness
        self._on_event = on_event
        self._resume = resume
        self._device = device
        cpus = os.cpu_count() or 1
        self._threads = threads_per_rank or max(1, cpus // spec.world_size)
        self.release_when_idle = release_when_idle
        self.offloaded = False
        self._now = now
        self._python = python
        self._ranks: list[_Rank] = []
        self._lock = asyncio.Lock()
        self._failed: str | None = None
        self.step = 0
        self.latest: SnapshotRef | None = None
        self.setup_info: dict[str, Any] = {}
        self._last_end: float | None = None
        self._idle_ema: float | None = None
        #: traj_ids of every record an update of this client trained on (exactly once: never again)
        self.consumed: set[str] = set()
        self._attempt = 0  # refused (non-finite) attempts at step self.step + 1
        #: the reply of a rank-0 command whose caller was cancelled after sending it (a weight
        #: broadcast the receivers refused): read and dropped before the next command
        self._stale_reply: asyncio.Task[dict[str, Any]] | None = None

    @property
    def version(self) -> int:
        return self.step

    # ------------------------------------------------------------------------ life cycle
    async def start(self) -> None:
        if self._ranks:
            raise TrainerError("TrainerClient.start() called twice")
        logs = self.work_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        port = free_port()
        for r in range(self.spec.world_size):
            env = dict(os.environ)
            env.update({
                "RANK": str(r), "WORLD_SIZE": str(self.spec.world_size), "LOCAL_RANK": str(r),
                "LOCAL_WORLD_SIZE": str(self.spec.world_size), "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port), "OMP_NUM_THREADS": str(self._threads),
                "TOKENIZERS_PARALLELISM": "false",
            })
            log = logs / f"rank-{r}.log"
            cmd = [self._python, "-m", "pearl.train.trainer", "--model", self.model_path,
                   "--work-dir", str(self.work_dir), "--spec", self.spec.model_dump_json(),
                   "--device", self._device]
            if self._resume:
                cmd.append("--resume")
            with log.open("ab") as errf:
                proc = await asyncio.create_subprocess_exec(
                    *cmd, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=errf,
                    env=env, limit=_READ_LIMIT, preexec_fn=die_with_parent,
                )
            self._ranks.append(_Rank(r, proc, log))
        await self._await_ready(asyncio.gather(*(self._read(rk) for rk in self._ranks)))

    async def _await_ready(self, replies: Awaitable[list[dict[str, Any]]]) -> None:
        """Await every rank's "ready" reply (any failure stops them all); the ranks must have
        resumed at the same step, which becomes this client's step."""
        try:
            ready = await replies
        except BaseException:
            await self._kill()
            raise
        steps = {int(r["step"]) for r in ready}
        if len(steps) != 1:
            await self._kill()
            raise TrainerError(f"ranks resumed at different steps {sorted(steps)}; check {self.work_dir}/checkpoints")
        self.step = steps.pop()
        self.setup_info = ready[0]

    async def close(self) -> None:
        """Ask every rank to shut down; terminate any that does not exit within 30 s."""
        if not self._ranks:
            return
        if self._failed is None:
            with contextlib.suppress(TrainerError, OSError, asyncio.TimeoutError):
                await asyncio.wait_for(self._all("shutdown", [{} for _ in self._ranks]), 30)
        await self._kill()

    async def __aenter__(self) -> TrainerClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _kill(self) -> None:
        if self._stale_reply is not None:
            self._stale_reply.cancel()
            with contextlib.suppress(asyncio.CancelledError, TrainerError, ValueError):
                await self._stale_reply
            self._stale_reply = None
        for rk in self._ranks:
            if rk.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    rk.proc.terminate()
        for rk in self._ranks:
            try:
                await asyncio.wait_for(rk.proc.wait(), 10)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    rk.proc.kill()
                await rk.proc.wait()
        self._ranks = []

    # -------------------------------------------------------------------------- protocol
    def _log_tail(self, rk: _Rank, n: int = 20) -> str:
        try:
            return "\n".join(rk.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    async def _read(self, rk: _Rank) -> dict[str, Any]:
        assert rk.proc.stdout is not None
        line = await rk.proc.stdout.readline()
        if not line:
            code = await rk.proc.wait()
            raise TrainerError(f"trainer rank {rk.rank} exited (code {code}) without replying; "
                               f"log {rk.log}:\n{self._log_tail(rk)}")
        reply = json.loads(line)
        if not reply.get("ok"):
            raise TrainerError(f"{reply.get('error')}\n{reply.get('traceback', '')}")
        return dict(reply)

    async def _send(self, rk: _Rank, msg: dict[str, Any]) -> None:
        assert rk.proc.stdin is not None
        rk.proc.stdin.write(json.dumps(msg).encode() + b"\n")
        await rk.proc.stdin.drain()

    async def _drain_stale(self) -> None:
        """Read and drop the reply of a rank-0 command whose caller was cancelled, so that every
        later reply stays paired with its own command. A rank still in that command (a broadcast
        whose receivers never joined) answers when it ends: at the latest at the weight group's
        timeout (``pearl.train.broadcast.open_group``)."""
        task, self._stale_reply = self._stale_reply, None
        if task is None:
            return
        try:
            reply = await task
            log.warning("trainer rank 0: dropped the reply of a cancelled command: %s", _brief(reply))
        except (TrainerError, ValueError) as e:
            log.warning("trainer rank 0: the cancelled command ended with an error: %s", str(e).splitlines()[0])

    async def _all(self, cmd: str, payloads: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Send ``cmd`` to every rank and await every reply; any failure fails the client."""
        if self._failed is not None:
            raise TrainerError(f"trainer failed earlier ({self._failed}); restart it with resume=True")
        if not self._ranks:
            raise TrainerError("trainer not started: await TrainerClient.start() first")
        await self._drain_stale()

        async def one(rk: _Rank, p: dict[str, Any]) -> dict[str, Any]:
            await self._send(rk, {"cmd": cmd, **p})
            return await self._read(rk)

        try:
            return list(await asyncio.gather(*(one(rk, p) for rk, p in zip(self._ranks, payloads, strict=True))))
        except asyncio.CancelledError:
            # The ranks are mid-command; their replies would be read as the next command's.
            self._failed = f"{cmd}: cancelled"
            await self._kill()
            raise
        except (TrainerError, OSError, ConnectionError) as e:
            self._failed = f"{cmd}: {str(e).splitlines()[0]}"
            await self._kill()
            if isinstance(e, TrainerError):
                raise
            raise TrainerError(f"lost contact with a trainer rank during {cmd!r}: {e}") from e

    # ---------------------------------------------------------------------------- public
    async def train_step(self, records: Sequence[TrajectoryRecord]) -> TrainResult:
        """One asynchronous GRPO update on ``records`` (see module docstring)."""
        async with self._lock:
            t_call = self._now()
            t0 = time.perf_counter()
            kept, report = filter_records(records, self.step, self.max_staleness, consumed=self.consumed,
                                          truncation=self.spec.truncation)  # may raise: nothing changed
            if self._last_end is not None:
                gap = t_call - self._last_end
                self._idle_ema = gap if self._idle_ema is None else 0.5 * gap + 0.5 * self._idle_ema
            samples = make_samples(kept, self.spec.advantage_scale, report.no_loss_ids)
            denom = global_denominator([s.n_loss_tokens for s in samples], self.spec.loss_agg,
                                       self.spec.loss_norm_tokens)
            t_pack = time.perf_counter()
            if denom <= 0:
                self._last_end = self._now()
                return TrainResult(self.step, self.step, None, {**report.to_dict(), "skipped": 1.0},
                                   {"pack_s": t_pack - t0}, report, self.step % self.spec.checkpoint_every == 0)
            step = self.step + 1
            # a retried step number (the last attempt was refused as non-finite) gets fresh event ids
            tag = f"{step}" if self._attempt == 0 else f"{step}-retry{self._attempt}"
            if self._on_event is not None:
                await self._on_event(TrainingStarted(step=step, event_id=f"train-start-{tag}"))
            t_gpus = time.perf_counter()
            reload_s = 0.0
            if self.offloaded:
                await self._all("reload", [{} for _ in self._ranks])
                self.offloaded = False
                reload_s = time.perf_counter() - t_gpus
            t_step = time.perf_counter()
            shards = shard_samples(samples, self.spec.world_size)
            payloads = [{"step": step, "denominator": denom, "samples": [s.to_wire() for s in sh]}
                        for sh in shards]
            replies = await self._all("step", payloads)
            t_done = time.perf_counter()
            r0 = replies[0]
            skipped = bool(r0.get("skipped", False))
            if skipped:  # a non-finite loss or gradient norm: the ranks kept the weights of self.step
                self._attempt += 1
            else:
                self._attempt = 0
                self.step = step
                self.latest = SnapshotRef.from_dict(r0["snapshot"])
                self.consumed.update(r.traj_id for r in kept)
            metrics = {k: float(v) for k, v in r0["metrics"].items() if k != "rank_samples"}
            metrics.update({k: float(v) for k, v in report.to_dict().items()})
            metrics["samples"] = float(len(samples))
            metrics["skipped_nonfinite"] = float(skipped)
            rewards = [r.reward for r in kept]
            metrics["reward_mean"] = sum(rewards) / len(rewards)
            timings = {
                "pack_s": t_pack - t0,
                "gpu_return_wait_s": t_gpus - t_pack,
                **{k: max(float(r["timings"][k]) for r in replies) for k in r0["timings"]},
                **{k: float(v) for k, v in r0["timings_publish"].items()},
                "reload_s": reload_s,
                "step_total_s": t_done - t_step,
            }
            if self.release_when_idle:
                t_off = time.perf_counter()
                await self._all("offload", [{} for _ in self._ranks])
                self.offloaded = True
                timings["offload_s"] = time.perf_counter() - t_off
            self._last_end = self._now()
            if self._on_event is not None:
                await self._on_event(TrainingFinished(step=step, weight_version=self.step,
                                                      expected_idle_s=self._idle_ema,
                                                      event_id=f"train-finish-{tag}"))
            if skipped:
                return TrainResult(self.step, self.step, None, metrics, timings, report,
                                   self.step % self.spec.checkpoint_every == 0)
            return TrainResult(step, step, self.latest, metrics, timings, report,
                               step % self.spec.checkpoint_every == 0)

    async def digests(self) -> list[str]:
        """Per-rank sha256 of the parameters (equal on every rank after each step)."""
        async with self._lock:
            return [r["digest"] for r in await self._all("digest", [{} for _ in self._ranks])]

    async def _rank0(self, msg: dict[str, Any]) -> dict[str, Any]:
        async with self._lock:
            if self._failed is not None or not self._ranks:
                raise TrainerError(f"trainer not running ({self._failed or 'not started'})")
            rk = self._ranks[0]
            await self._drain_stale()
            await self._send(rk, msg)
            read = asyncio.ensure_future(self._read(rk))
            try:
                return await asyncio.shield(read)
            except asyncio.CancelledError:
                # the command was sent: its reply will come; the next command reads it first
                self._stale_reply = read
                raise

    async def weight_layout(self, per_tensor: bool = False) -> Layout:
        """The broadcast layout (``pearl.train.broadcast``), to hand to the receivers."""
        return list((await self._rank0({"cmd": "bcast_layout", "per_tensor": per_tensor}))["layout"])

    async def init_broadcast(self, host: str, port: int, n_receivers: int, backend: str = "gloo",
                             group_name: str | None = None, load_format: str | None = None) -> float:
        """Trainer rank 0 hosts the weight group for ``n_receivers`` receiving ranks, which must join
        concurrently. Call ``weight_layout`` first. Returns the rendezvous seconds.

        For SGLang servers pass their ``group_name`` (``/init_weights_update_group``'s): the group
        then takes the form of SGLang's ``init_custom_process_group``, and ``n_receivers`` counts
        every server's TP ranks (``pearl.train.broadcast.sglang_ranks``). ``load_format`` is
        what the servers are told in ``/update_weights_from_distributed``: None with a per-tensor
        layout (``weight_layout(per_tensor=True)``), ``"flattened_bucket"`` with the dtype buckets."""
        reply = await self._rank0({"cmd": "bcast_init", "host": host, "port": port,
                                   "world_size": n_receivers + 1, "backend": backend, "group_name": group_name,
                                   "load_format": load_format})
        return float(reply["init_s"])

    async def broadcast(self) -> dict[str, Any]:
        """Broadcast the current weights in the layout's order (receivers receive meanwhile);
        returns ``{version, tensors, buckets, bytes, seconds}``."""
        return await self._rank0({"cmd": "bcast"})
