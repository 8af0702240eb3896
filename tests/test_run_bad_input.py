"""``pearl run`` on bad input: a model folder missing or broken, a server that never gets ready or
finds its port taken, a trainer that fails, Ctrl-C during start-up and during training. Each gives a
message that names what failed and what to do; the servers and the trainer are stopped; the report
and the picture are written."""

from __future__ import annotations

import argparse
import asyncio
import shutil
from pathlib import Path
from typing import Any, ClassVar

import pytest

from envs.base import TaskError
from pearl.config import CONFIG_DIR, load_config
from pearl.engines.base import EngineDeadError, EngineStartError
from pearl.engines.emulated import EmulatedEngine
from pearl.obs.preflight import ModelFolderError, check_model_folder, explain_failure
from pearl.run import RunError, _resolve_model_path, _run_cmd, run_demo
from pearl.runtime.clock import LoopClock
from pearl.train.client import TrainerError
from tests.conftest import MODELS_DIR


def model_copy(tmp: Path, name: str = "smollm2-135m") -> Path:
    """A copy of the built SmolLM2-135M folder at ``tmp/name``."""
    dst = tmp / name
    shutil.copytree(MODELS_DIR / "smollm2-135m", dst)
    return dst


def test_a_complete_model_folder_passes_and_each_broken_one_is_named(tmp_path: Path) -> None:
    good = model_copy(tmp_path)
    check_model_folder(good)
    with pytest.raises(ModelFolderError, match=f"model folder {tmp_path / 'nope'} does not exist"):
        check_model_folder(tmp_path / "nope")
    (good / "config.json").write_text("{not json")
    with pytest.raises(ModelFolderError, match=r"config.json is not valid JSON \(line 1\).*delete .* and run again"):
        check_model_folder(good)
    (good / "config.json").write_text("{}")
    (good / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelFolderError, match=r"weight file\(s\) model\.safetensors are empty"):
        check_model_folder(good)
    (good / "model.safetensors").unlink()
    with pytest.raises(ModelFolderError, match=r"no \*\.safetensors weights"):
        check_model_folder(good)
    (good / "tokenizer.json").unlink()
    (good / "tokenizer_config.json").unlink()
    with pytest.raises(ModelFolderError, match="no tokenizer"):
        check_model_folder(good)


def test_the_run_refuses_a_broken_model_folder_before_starting_anything(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    broken = model_copy(tmp_path, "my-model")
    (broken / "model.safetensors").write_bytes(b"")
    cfg = load_config(CONFIG_DIR / "cpu-demo.yaml", {"model.path": str(broken), "output_dir": str(tmp_path / "runs")})
    with pytest.raises(RunError, match=r"my-model: weight file\(s\) model\.safetensors are empty: copy a complete"):
        _resolve_model_path(cfg)
    missing = cfg.model_copy(update={"model": cfg.model.model_copy(update={"path": str(tmp_path / "gone")})})
    with pytest.raises(RunError, match=r"has no config\.json"):
        _resolve_model_path(missing)
    # through the command: exit 2, one message on stderr, no traceback
    cfg_file = tmp_path / "cfg.yaml"
    cfg_file.write_text((CONFIG_DIR / "cpu-demo.yaml").read_text().replace(
        "model: {from: smollm2-135m}", f"model: {{from: smollm2-135m, path: {broken}}}").replace(
        "output_dir: runs", f"output_dir: {tmp_path / 'runs'}"))
    args = argparse.Namespace(config=str(cfg_file), tiny=False, env=None, batch=None, dtype=None, steps=1,
                              no_live=True, notice_s=30.0, verbose=False)
    assert _run_cmd(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("pearl run: error: model folder") and "Traceback" not in err


def test_failures_are_worded_with_what_failed_and_what_to_do() -> None:
    taken = EngineStartError("r0", "vLLM server exited during start-up (log /r/servers/logs/r0.log)", exit_code=1,
                             log_tail="OSError: [Errno 98] Address already in use")
    msg = explain_failure(taken)
    assert msg is not None and msg.startswith("an inference server failed to start: worker r0: vLLM server exited")
    assert "what to do: a port the server needs is taken by another process" in msg
    slow = EngineStartError("r0", "vLLM server not ready after 1200 s (log x); raise engine.start_timeout_s or "
                                  "check CPU load")
    assert "what to do: the server never answered /health in time: raise engine.start_timeout_s" in str(
        explain_failure(slow))
    oom = EngineDeadError("spot-00", "vLLM server died during generate", exit_code=-9)
    assert "ran out of memory" in str(explain_failure(oom))
    assert str(explain_failure(TrainerError("trainer rank 0 exited (code 1)"))).startswith(
        "the trainer failed: trainer rank 0 exited (code 1)\nwhat to do: read the rank logs")
    assert str(explain_failure(TaskError("task 3: no targets"))) == "the environment failed: task 3: no targets"
    assert explain_failure(ZeroDivisionError()) is None


class HangingTrainer:
    """The trainer seam: ``start`` returns at once (or hangs, ``hang_start``), ``train_step`` hangs
    until cancelled; records whether it was closed."""

    instances: ClassVar[list[HangingTrainer]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.version = 0
        self.closed = False
        self.training = asyncio.Event()
        HangingTrainer.instances.append(self)

    async def start(self) -> None:
        return None

    async def train_step(self, records: Any) -> Any:
        self.training.set()
        await asyncio.Event().wait()

    async def close(self) -> None:
        self.closed = True


def emulated_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, launch_s: float) -> tuple[Any, list[Any]]:
    """The demo's config on the emulated engine (launch ``launch_s`` seconds) and the hanging trainer."""
    engines: list[EmulatedEngine] = []

    def make_engine(cfg: Any, run_dir: Path) -> EmulatedEngine:
        eng = EmulatedEngine.from_config(cfg, LoopClock())
        engines.append(eng)
        return eng

    monkeypatch.setattr("pearl.run.make_engine", make_engine)
    monkeypatch.setattr("pearl.train.client.TrainerClient", HangingTrainer)
    HangingTrainer.instances.clear()
    cfg = load_config(CONFIG_DIR / "cpu-demo.yaml", {
        "emulator.launch_s": [launch_s, launch_s], "emulator.admission_s": [0.0, 0.0],
        "emulator.activation_s": [0.0, 0.0], "emulator.deactivation_s": [0.0, 0.0],
        # SmolLM2 on a CPU is not in the measured kernel database: the datasheet formulas, named
        "emulator.costs": "datasheet",
        "workload.batch_size": 4, "workload.group_size": 2, "trace": None, "output_dir": str(tmp_path)})
    return cfg, engines


@pytest.mark.parametrize("moment", ["server start", "training"])
@pytest.mark.timeout(120)
async def test_ctrl_c_at_any_moment_stops_servers_and_trainer_and_writes_the_report(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moment: str) -> None:
    cfg, engines = emulated_run(tmp_path, monkeypatch, launch_s=3600.0 if moment == "server start" else 0.05)
    out = tmp_path / "run"
    task = asyncio.ensure_future(run_demo(cfg, out, steps=3, live=False, notice_s=30.0))
    if moment == "server start":
        while not engines or not engines[0]._workers:
            await asyncio.sleep(0.05)
    else:
        while not HangingTrainer.instances or not HangingTrainer.instances[0].training.is_set():
            await asyncio.sleep(0.05)
    task.cancel()  # what Ctrl-C and SIGTERM do (pearl.run._until_signal)
    with pytest.raises(asyncio.CancelledError):
        await task
    eng = engines[0]
    assert eng._workers and not [w for w, h in eng._workers.items() if eng._workers[w].status.value != "stopped"]
    assert HangingTrainer.instances[0].closed
    assert (out / "report.md").is_file()
    assert (out / "run.png").read_bytes()[:4] == b"\x89PNG"


def test_a_failed_run_is_worded_and_its_report_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    async def failing(cfg: Any, out: Path, *a: Any) -> dict[str, Any]:
        out.mkdir(parents=True)
        (out / "report.md").write_text("# report")
        raise EngineStartError("r0", "vLLM server exited during start-up", exit_code=1,
                               log_tail="OSError: [Errno 98] Address already in use")

    monkeypatch.setattr("pearl.run.run_demo", failing)
    args = argparse.Namespace(config=str(CONFIG_DIR / "cpu-demo.yaml"), tiny=False, env=None, batch=None,
                              dtype=None, steps=1, no_live=True, notice_s=30.0, verbose=False)
    monkeypatch.chdir(tmp_path)
    assert _run_cmd(args) == 1
    err = capsys.readouterr().err
    assert "an inference server failed to start: worker r0" in err
    assert "what to do: a port the server needs is taken" in err
    assert "servers and trainer stopped; report and picture so far in runs/cpu-demo-" in err
