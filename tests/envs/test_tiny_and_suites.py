"""The tiny environment's reward, task suites from configs, the sandbox's process control."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

from envs.base import EnvError, StepResult, TaskError
from envs.factory import build_suite
from envs.repofix import RepoFixEnv
from envs.sandbox import Checkout, SandboxLimits, run_limited
from envs.swebench import SWEBenchEnv
from envs.tiny import TinyEnv, TinyTask, make_tiny_tasks, score
from envs.tiny.env import lcs_length
from envs.toolcall import ToolCall
from pearl.config import ConfigError, EnvSpec, load_config
from tests.conftest import LITE_DEV


def test_tiny_score_formula() -> None:
    assert score("apple", "apple") == 1.0
    assert score("  Apple, of course.", "apple") == 1.0  # first word, case and punctuation ignored
    assert score("apply", "apple") == pytest.approx(0.5 * 4 / 5)
    assert score("applesauce", "apple") == pytest.approx(0.5 * 5 / 10)  # long words are penalised
    assert score("", "apple") == 0.0 and score("!!!", "apple") == 0.0
    assert score("zzz", "apple") == 0.0
    assert lcs_length("kitten", "sitting") == 4


async def test_tiny_episode_mean_over_turns() -> None:
    env = TinyEnv()
    assert await env.reset(TinyTask("t", ("river", "stone", "cloud"))) == "Say the word: river"
    r1 = await env.step(ToolCall("answer", {"text": "river"}))
    assert (r1.observation, r1.done, r1.info["turn_score"]) == ("Say the word: stone", False, 1.0)
    await env.step(ToolCall("answer", {"text": "nope"}))
    last = await env.step(ToolCall("answer", {"text": "cloud"}))
    assert last.done and last.reward == pytest.approx((1.0 + score("nope", "stone") + 1.0) / 3)
    with pytest.raises(EnvError, match="already done"):
        await env.step(ToolCall("answer", {"text": "x"}))


def test_tiny_tasks_deterministic() -> None:
    a = make_tiny_tasks(5, seed=1, turns=2)
    assert a == make_tiny_tasks(5, seed=1, turns=2) and a != make_tiny_tasks(5, seed=2, turns=2)
    assert all(len(t.targets) == 2 for t in a) and len({t.task_id for t in a}) == 5
    with pytest.raises(TaskError):
        make_tiny_tasks(0)


def test_step_result_rewards_are_final() -> None:
    with pytest.raises(ValueError, match="not done"):
        StepResult("x", reward=0.5)


async def test_suites_from_env_spec(tmp_path: Path) -> None:
    tiny = await build_suite(EnvSpec(kind="tiny", num_tasks=3, tiny_turns=2))
    assert len(tiny.tasks) == 3 and isinstance(tiny.make_env(), TinyEnv)
    rf = await build_suite(EnvSpec(kind="repofix", num_tasks=2, projects=["textkit"], workdir=str(tmp_path)))
    assert [t.project for t in rf.tasks] == ["textkit", "textkit"] and isinstance(rf.make_env(), RepoFixEnv)
    sw = await build_suite(EnvSpec(kind="swebench", dataset=str(LITE_DEV), instance_ids=["pydicom__pydicom-901"],
                                   image_namespace="swebench"))
    env = sw.make_env()
    assert isinstance(env, SWEBenchEnv) and sw.tasks[0].instance_id == "pydicom__pydicom-901"
    assert env.config.images.image("pydicom__pydicom-901") == "swebench/sweb.eval.x86_64.pydicom_1776_pydicom-901:latest"


def test_env_spec_validation_and_paper_configs() -> None:
    with pytest.raises(ValueError, match=r"env\.kind=swebench needs env\.dataset"):
        EnvSpec(kind="swebench")
    with pytest.raises(ConfigError, match=r"env\.kind"):
        load_config("qwen3-8b-h200", {"env.kind": "chess"})
    for name, model in (("swebench-qwen3-8b", "qwen3-8b"), ("swebench-qwen3-30b-a3b", "qwen3-30b-a3b")):
        cfg = load_config(name)
        assert cfg.model.name == model and cfg.model.path and cfg.model.n_layers > 0  # from: + path override
        assert (cfg.cluster.training_gpus, cfg.cluster.reserved_gpus, cfg.cluster.max_preemptible_gpus) == (16, 4, 12)
        assert cfg.train.algorithm == "grpo" and cfg.engine.kind == "sglang"
        assert cfg.env.kind == "swebench" and cfg.env.dataset and cfg.workload.max_trajectory_tokens == 32768


async def test_run_limited_kills_the_process_group_on_cancel(tmp_path: Path) -> None:
    """Cancelling a command kills its whole process group, grandchildren included."""
    co = Checkout.create("pearl-test-", tmp_path)
    fifo = co.root / "pid.fifo"
    os.mkfifo(fifo)
    code = ("import subprocess, sys, time\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            f"open({str(fifo)!r}, 'w').write(str(p.pid))\n"
            "time.sleep(60)\n")
    task = asyncio.ensure_future(run_limited([sys.executable, "-c", code], co.root, SandboxLimits(time_s=60)))
    grandchild = int(await asyncio.to_thread(fifo.read_text))  # returns when the child has written
    assert not _dead_or_dying(grandchild)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert _dead_or_dying(grandchild)
    co.remove()


def _dead_or_dying(pid: int) -> bool:
    """Gone, a zombie, or holding a pending SIGKILL (decided now: no waiting for the kernel to act)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    if stat.rsplit(")", 1)[1].split()[0] in ("Z", "X"):
        return True
    pending = 0
    for line in status.splitlines():
        if line.startswith(("SigPnd:", "ShdPnd:")):
            pending |= int(line.split()[1], 16)
    return bool(pending & (1 << (9 - 1)))


async def test_run_limited_timeout_and_output_cap(tmp_path: Path) -> None:
    t0 = time.monotonic()
    res = await run_limited([sys.executable, "-c", "print('x' * 100000, flush=True); import time; time.sleep(30)"],
                            tmp_path, SandboxLimits(time_s=0.5, max_output_chars=300))
    assert res.timed_out and time.monotonic() - t0 < 10
    assert res.omitted_chars == 100001 - 300 + 0 or res.omitted_chars > 99000
    assert "bytes of output omitted" in res.output and len(res.output) < 400
