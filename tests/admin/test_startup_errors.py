"""Every start-up failure of ``pearl serve`` is one line naming the file and what to do, and one
``output_dir`` serves one service: a second start on the same folder stops at once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pearl.runtime.clock import LoopClock, run_virtual
from pearl.serve import Service, StartupError, lock_output_dir, release_output_dir
from tests.admin.test_emulated_resume import emulated_cfg
from tests.admin.test_service import write_config

ROOT = Path(__file__).resolve().parents[2]


def serve(cfg: Path, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("PEARL_ADMIN_TOKEN", None)
    return subprocess.run([sys.executable, "-m", "pearl", "serve", "--config", str(cfg), "--port", "0"],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def one_line_error(p: subprocess.CompletedProcess[str]) -> str:
    assert p.returncode == 2, p.stderr[-2000:]
    assert "Traceback" not in p.stderr, p.stderr[-2000:]
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("pearl serve:")]
    assert len(lines) == 1, p.stderr[-2000:]
    return lines[0]


def test_a_second_service_on_one_output_dir_stops_at_once(tmp_path: Path) -> None:
    cfg = emulated_cfg(tmp_path / "run")

    async def main() -> str:
        first = Service(cfg, LoopClock(), port=0)
        await first.start()
        try:
            second = Service(cfg, LoopClock(), port=0)
            with pytest.raises(StartupError) as err:
                await second.start()
            await second.stop()
        finally:
            await first.stop()
        third = Service(cfg, LoopClock(), port=0)  # the folder is free again once the first stopped
        await third.start()
        await third.stop()
        return str(err.value)

    msg = run_virtual(main())
    assert f"output_dir {tmp_path / 'run'} is in use by another pearl serve (pid {os.getpid()}" in msg
    assert "\n" not in msg


def test_pearl_serve_on_a_locked_folder_is_one_line(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    fd = lock_output_dir(tmp_path / "run")
    try:
        line = one_line_error(serve(cfg))
    finally:
        release_output_dir(fd)
    assert line.startswith(f"pearl serve: error: output_dir {tmp_path / 'run'} is in use by another pearl serve")


def test_pearl_main_on_a_locked_folder_is_one_line(tmp_path: Path) -> None:
    from tests.admin.test_service import free_port

    cfg = write_config(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(ROOT), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    env.pop("PEARL_ADMIN_TOKEN", None)
    fd = lock_output_dir(tmp_path / "run")
    try:
        p = subprocess.run([sys.executable, "pearl/main.py", "--config", str(cfg), "--port", "0"],
                           capture_output=True, text=True, timeout=180, env=env, cwd=ROOT)
    finally:
        release_output_dir(fd)
    assert p.returncode == 2, p.stderr[-2000:]
    assert "Traceback" not in p.stderr, p.stderr[-2000:]
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("pearl/main.py:")]
    assert len(lines) == 1, p.stderr[-2000:]
    assert lines[0].startswith(f"pearl/main.py: rank 0: error: output_dir {tmp_path / 'run'} is in use by another "
                               "pearl serve")


def test_a_corrupt_journal_is_one_line_naming_it(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "journal.sqlite").write_bytes(b"this is not a database, " * 200)
    line = one_line_error(serve(cfg))
    assert f"journal {tmp_path / 'run' / 'journal.sqlite'} is not a usable SQLite database" in line
    assert "move it away" in line


def test_an_unusable_output_dir_is_one_line_naming_it(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    (tmp_path / "run").write_text("a file where the folder should be")
    line = one_line_error(serve(cfg))
    assert f"output_dir {tmp_path / 'run'} is not a usable folder" in line
