"""Kill -9 of the real service (vLLM engines, the CPU GRPO trainer) mid-run, then a restart.

``python -m pearl.reliability.vllm_restart --out DIR`` runs ``pearl serve`` on the tiny Qwen3 with one
real vLLM server (reserved GPU ``r0`` = CPU core 0), the tiny environment and the real GRPO trainer
(a child process, gloo), in its own process group. Once the trainer made ``--steps-before`` updates
it grants one preemptible GPU (``p0``) through the admin API with an ``Idempotency-Key``, and on the
202 sends SIGKILL to the service's whole process group. The vLLM server (its own session) dies with
its reaper. Then it starts ``pearl serve`` again on the same ``output_dir``, waits for one more
update, stops it with SIGTERM and prints / writes (``DIR/vllm_restart.json``):

* ``checkpoint_version`` (the trainer's latest complete checkpoint at the kill) and
  ``resumed_version`` (``resuming at policy v<s>`` of the restart): equal when the restart resumes;
* ``journal_trained_batches_at_kill``: the batches the journal holds as consumed at the kill
  (``Journal.trained_batches``); equal to the checkpoint version when no batch is trained twice
  into the surviving weights and none is skipped;
* ``trajectories_lost``: trajectories of the batches behind the final checkpoint ``S`` (batches
  ``0..S-1``, ``batch_size`` each, ids ``b<r>-...``) that the final journal does not hold as
  consumed; ``trajectories_duplicated``: trajectories the restarted trainer trained on (the sum of
  its ``train step`` lines) minus those newly journaled as consumed by it, plus consumed ids outside
  ``0..S-1`` (a trajectory trained again counts once here, never consumed anew);
* ``events_accepted`` / ``events_journaled`` / ``events_applied``: the grant answered 202, found in
  the journal after the kill, and in effect after the restart (``p0`` in ``/v1/state``, the
  journaled event ``done``); ``duplicate_status_after_restart``: the same grant and key sent again
  after the restart (200, ``duplicate``: the idempotency survived the kill);
* ``processes_left_after_kill``: descendants of the killed service still alive 120 s after the kill
  (the reaper stops the servers' groups; 0 when nothing leaks);
* ``restart_to_ready_s`` (start to ``PEARL serving``), ``restart_to_trained_s`` (start to the first
  update of the restarted run), ``kill_to_quiet_s`` (kill until no descendant is left), ``wall_s``.

Exit status 0 when every invariant holds, 1 otherwise (the problems are listed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
GRANT = {"gpus": [{"gpu_id": "p0", "node": "node0", "instance_id": "i-restart-0"}]}
GRANT_KEY = "restart-grant-p0"


def restart_config(out: Path, models: Path) -> Path:
    """The smallest real run that trains: one vLLM server of the tiny Qwen3, 4 trajectories (2 groups
    of 2) of one short turn per batch, one trainer rank, a checkpoint after every update."""
    cfg = yaml.safe_load((ROOT / "configs/cpu-demo.yaml").read_text())
    cfg["model"] = {"from": "tiny-qwen3", "path": str(models / "tiny-qwen3")}
    cfg["cluster"].update(reserved_gpus=1, max_preemptible_gpus=1, training_gpus=0, gpus_per_node=1)
    cfg["workload"].update(batch_size=4, group_size=2, max_trajectory_tokens=1024,
                           turns={"mean": 1, "cv": 0.0, "min": 1, "max": 1})
    cfg["engine"].update(max_model_len=1024, start_timeout_s=900, device_map={"r0": "0", "p0": "1"})
    cfg["env"] = {"kind": "tiny", "num_tasks": 4, "max_new_tokens": 8, "max_turns": 1, "min_turn_tokens": 4}
    cfg["train"].update(micro_batch_tokens=1024, checkpoint_every=1)
    cfg["policy"] = {"max_staleness": 1, "allocation_overrides": {1: "coloc", 2: "coloc"}}
    cfg["admin"] = {"tensorboard": False}
    cfg["trace"] = None
    cfg["output_dir"] = str(out / "run")
    path = out / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (by parent pid, read from /proc)."""
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            parent[int(d.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    out: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier and p not in out}
        out |= frontier
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


class Service:
    """One ``pearl serve`` in its own process group; stderr lines kept in ``lines`` (and in ``log``)."""

    def __init__(self, cfg: Path, port: int, token: str, log: Path) -> None:
        env = dict(os.environ, PEARL_ADMIN_TOKEN=token, PYTHONPATH=str(ROOT))
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen([sys.executable, "-m", "pearl", "serve", "--config", str(cfg), "--port", str(port)],
                                     cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True, start_new_session=True)
        self.lines: list[tuple[float, str]] = []
        self._cv = threading.Condition()
        self._log = log.open("w")
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._log.write(line)
            self._log.flush()
            with self._cv:
                self.lines.append((time.monotonic(), line.rstrip()))
                self._cv.notify_all()
        with self._cv:
            self._cv.notify_all()

    def wait_line(self, pattern: str, timeout_s: float, count: int = 1) -> tuple[float, re.Match[str]]:
        """The ``count``-th line matching ``pattern``: (its time, the match)."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while True:
                hits = [(t, m) for t, ln in self.lines if (m := rx.search(ln))]
                if len(hits) >= count:
                    return hits[count - 1]
                if not self._reader.is_alive():
                    raise RuntimeError(f"pearl serve exited before {pattern!r}:\n" + self.tail())
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"no {pattern!r} within {timeout_s:.0f} s:\n" + self.tail())
                self._cv.wait(left)

    def matches(self, pattern: str) -> list[re.Match[str]]:
        rx = re.compile(pattern)
        with self._cv:
            return [m for _, ln in self.lines if (m := rx.search(ln))]

    def tail(self, n: int = 40) -> str:
        return "\n".join(ln for _, ln in self.lines[-n:])

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._reader.join(timeout=10)
        self._log.close()


def call(url: str, token: str, method: str = "GET", body: Any = None,
         headers: dict[str, str] | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(url, method=method, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json",
                                          **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def checkpoint_step(run_dir: Path) -> int:
    from pearl.train.trainer import latest_checkpoint

    ck = latest_checkpoint(run_dir / "trainer" / "checkpoints")
    return 0 if ck is None else int(ck.name.removeprefix("step-"))


def batch_of(traj_id: str) -> int | None:
    head = traj_id.split("-", 1)[0]
    return int(head[1:]) if head.startswith("b") and head[1:].isdigit() else None


def run(out: Path, steps_before: int = 1, timeout_s: float = 1500.0) -> dict[str, Any]:
    """The kill -9 / restart check (module docstring); returns the figures with ``problems``."""
    from pearl.models import ensure_models
    from pearl.runtime.journal import Journal

    t_start = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    models = ROOT / ".models"
    ensure_models(models, ("tiny-qwen3",))
    cfg = restart_config(out, models)
    batch_size = 4
    run_dir = out / "run"
    token = secrets.token_urlsafe(24)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    fig: dict[str, Any] = {"command": f"python -m pearl.reliability.vllm_restart --out {out}"}
    problems: list[str] = []

    # life 1: train, grant, kill -9 the whole process group on the 202
    svc = Service(cfg, port, token, out / "serve-1.log")
    try:
        svc.wait_line(r"PEARL serving", timeout_s)
        svc.wait_line(r"train step \d+:", timeout_s, count=steps_before)
        status, body = call(f"{url}/v1/events/gpus-granted", token, "POST", GRANT, {"Idempotency-Key": GRANT_KEY})
        fig["grant_status"] = status
        fig["events_accepted"] = int(status == 202)
        below = descendants(svc.proc.pid)
        os.killpg(svc.proc.pid, signal.SIGKILL)
        t_kill = time.monotonic()
        svc.proc.wait()
        fig["steps_logged_before_kill"] = len(svc.matches(r"train step \d+:"))
        left = set(below)
        while left and time.monotonic() - t_kill < 120.0:
            left = {p for p in left if alive(p)}
            time.sleep(0.2)
        fig["kill_to_quiet_s"] = round(time.monotonic() - t_kill, 2)
        fig["processes_below_service_at_kill"] = len(below)
        fig["processes_left_after_kill"] = len(left)
        for p in left:  # report, then clean up what leaked
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
    finally:
        svc.close()
    ck = checkpoint_step(run_dir)
    with Journal(run_dir / "journal.sqlite") as j:
        consumed_at_kill = j.consumed_ids()
        fig["journal_trained_batches_at_kill"] = j.trained_batches(batch_size)
        events = {e.event_id: e for e in j.events()}
        fig["completed_at_kill"] = len(j.completed_ids())
        fig["partials_at_kill"] = j.counts()["partials"]
    fig["checkpoint_version"] = ck
    fig["consumed_at_kill"] = len(consumed_at_kill)
    fig["events_journaled"] = int(GRANT_KEY in events)
    fig["event_status_at_kill"] = events[GRANT_KEY].status if GRANT_KEY in events else None

    # life 2: the same output_dir
    svc = Service(cfg, port, token, out / "serve-2.log")
    try:
        _, m = svc.wait_line(r"resuming at policy v(\d+)", timeout_s)
        fig["resumed_version"] = int(m.group(1))
        t_ready, _ = svc.wait_line(r"PEARL serving", timeout_s)
        fig["restart_to_ready_s"] = round(t_ready - svc.t0, 2)
        t_trained, m = svc.wait_line(r"train step \d+: (\d+) trajectories", timeout_s)
        fig["restart_to_trained_s"] = round(t_trained - svc.t0, 2)
        _, state = call(f"{url}/v1/state", token)
        fig["p0_in_table_after_restart"] = any(g["gpu_id"] == "p0" for g in state["gpus"])
        status, body = call(f"{url}/v1/events/gpus-granted", token, "POST", GRANT, {"Idempotency-Key": GRANT_KEY})
        fig["duplicate_status_after_restart"] = status
        fig["duplicate_after_restart"] = bool(isinstance(body, dict) and body.get("duplicate"))
        svc.proc.send_signal(signal.SIGTERM)
        fig["exit_code_after_sigterm"] = svc.proc.wait(timeout=600)
        trained_after = [int(m.group(1)) for m in svc.matches(r"train step \d+: (\d+) trajectories")]
    finally:
        svc.close()
    final_ck = checkpoint_step(run_dir)
    with Journal(run_dir / "journal.sqlite") as j:
        consumed = j.consumed_ids()
        completed = j.completed_ids()
        events = {e.event_id: e for e in j.events()}
    fig["final_checkpoint_version"] = final_ck
    fig["steps_after_restart"] = len(trained_after)
    fig["trajectories_trained_after_restart"] = sum(trained_after)
    fig["event_status_final"] = events[GRANT_KEY].status if GRANT_KEY in events else None
    fig["events_applied"] = int(bool(fig["p0_in_table_after_restart"]) and fig["event_status_final"] == "done")
    per_batch: dict[int, int] = {}
    outside = 0
    for t in consumed:
        b = batch_of(t)
        if b is None or b >= final_ck:
            outside += 1
        else:
            per_batch[b] = per_batch.get(b, 0) + 1
    fig["trajectories_consumed"] = len(consumed)
    fig["trajectories_lost"] = sum(batch_size - per_batch.get(b, 0) for b in range(final_ck)) + len(consumed - completed)
    fig["trajectories_duplicated"] = max(0, sum(trained_after) - len(consumed - consumed_at_kill)) + outside
    fig["wall_s"] = round(time.monotonic() - t_start, 1)

    if fig["grant_status"] != 202:
        problems.append(f"the grant was answered {fig['grant_status']}, not 202")
    if fig["events_journaled"] != fig["events_accepted"]:
        problems.append("the grant answered 202 is not in the journal after the kill")
    if fig["events_applied"] != fig["events_accepted"]:
        problems.append(f"the grant is not applied after the restart (p0 in the table: {fig['p0_in_table_after_restart']}, "
                        f"journaled status {fig['event_status_final']})")
    if not (fig["duplicate_status_after_restart"] == 200 and fig["duplicate_after_restart"]):
        problems.append(f"the same grant and key after the restart answered {fig['duplicate_status_after_restart']}")
    if ck < steps_before:
        problems.append(f"the kill came at checkpoint v{ck}, before {steps_before} update(s)")
    if fig["resumed_version"] != ck:
        problems.append(f"resumed at v{fig['resumed_version']}, the trainer's checkpoint is v{ck}")
    if fig["journal_trained_batches_at_kill"] != ck:
        problems.append(f"the journal holds {fig['journal_trained_batches_at_kill']} consumed batches, "
                        f"the checkpoint is v{ck}")
    if final_ck < ck + 1 or not trained_after:
        problems.append(f"no update after the restart (final checkpoint v{final_ck})")
    if fig["trajectories_lost"] or fig["trajectories_duplicated"]:
        problems.append(f"{fig['trajectories_lost']} trajectories lost, {fig['trajectories_duplicated']} duplicated")
    if fig["processes_left_after_kill"]:
        problems.append(f"{fig['processes_left_after_kill']} processes of the killed service still alive after 120 s")
    if fig["exit_code_after_sigterm"] != 0:
        problems.append(f"the restarted service exited {fig['exit_code_after_sigterm']} on SIGTERM")
    fig["problems"] = problems
    fig["ok"] = not problems
    return fig


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="kill -9 the real-vLLM service mid-run, restart it, check the resume")
    ap.add_argument("--out", required=True, type=Path, help="folder for the run, its logs and vllm_restart.json")
    ap.add_argument("--steps-before", type=int, default=1, help="updates before the kill (default 1)")
    ap.add_argument("--timeout-s", type=float, default=1500.0, help="bound on each wait for a log line")
    args = ap.parse_args(argv)
    fig = run(args.out, args.steps_before, args.timeout_s)
    (args.out / "vllm_restart.json").write_text(json.dumps(fig, indent=2) + "\n")
    for k, v in fig.items():
        print(f"{k}: {v}")
    return 0 if fig["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
