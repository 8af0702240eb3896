"""The suite's hang watchdog (tests/conftest.py): a test whose teardown hangs after its timeout is
reported by name with every stack, its child processes are killed, and pytest is ended if that does
not free it - so CI reports a hang instead of being killed silently at its time limit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

HUNG = '''
import asyncio, subprocess, time, pytest

@pytest.fixture
def child():
    p = subprocess.Popen(["sleep", "600"])
    yield p
    p.wait()  # hangs until the watchdog kills the child

@pytest.mark.timeout(1)
def test_teardown_waits_on_a_child(child):
    time.sleep(3)

def test_next_one_runs():
    pass

@pytest.fixture
def stuck():
    yield
    time.sleep(600)  # nothing frees this one

@pytest.mark.timeout(1)
async def test_teardown_stuck(stuck):
    await asyncio.sleep(3)
'''


def test_watchdog_reports_frees_and_ends_a_hung_test(tmp_path: Path) -> None:
    (tmp_path / "test_hung.py").write_text(HUNG)
    env = dict(os.environ, PEARL_TEST_WATCHDOG_GRACE_S="2", PEARL_TEST_WATCHDOG_EXIT_S="3")
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
         "-o", "asyncio_mode=auto", "--rootdir", str(tmp_path), str(tmp_path / "test_hung.py")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    text = out.stdout + out.stderr
    assert out.returncode == 3, text[-3000:]
    assert "WATCHDOG: test_hung.py::test_teardown_waits_on_a_child still running" in text, text[-3000:]
    assert "WATCHDOG: killed" in text and "sleep 600" in text
    assert "WATCHDOG: test_hung.py::test_teardown_stuck still hung" in text
    assert "in _watch" in text  # thread stacks were dumped
    assert "asyncio tasks:" in text  # and the event loop's tasks
