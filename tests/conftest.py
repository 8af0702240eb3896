"""Shared pytest setup: the opt-in ``gpu`` marker, paths to local models and data, and a hang
watchdog that no test can outlive.

Data: the real trace and the SWE-bench Lite dev rows ship inside the repository (``SHIPPED_TRACE``,
``LITE_DEV``, each beside its licence). Data without a licence to redistribute (the spot-traces
JSON of ``SPOT_AWS``) stays outside: ``PEARL_SHARED_DIR`` names the folder that holds it
(default: ``shared/`` beside the checkout), and the tests that read it skip when it is absent."""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
MODELS_DIR = Path(os.environ.get("PEARL_MODELS_DIR", ROOT / ".models"))
SHARED_DIR = Path(os.environ.get("PEARL_SHARED_DIR", ROOT.parent / "shared"))
SHIPPED_TRACE = ROOT / "configs/traces/bamboo-g4dn/g4dn-trace.csv"
LITE_DEV = ROOT / "envs/swebench/data/SWE-bench_Lite-dev.json"
SPOT_AWS = SHARED_DIR / "data/traces/spot-aws-16node-2023-08-27"


def missing_setup(reason: str, allow_module_level: bool = False) -> None:
    """A folder ``make setup`` builds (``.sglang``, ``.swebench``) is absent: skip, saying so, on a
    developer's machine; fail under CI (``CI=true``), where the setup must have built it, so a broken
    install step can never pass as skipped tests."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{reason} (CI: make setup must build it)", pytrace=False)
    pytest.skip(reason, allow_module_level=allow_module_level)


needs_spot_aws = pytest.mark.skipif(
    not SPOT_AWS.is_dir(),
    reason=f"the spot-traces JSON ({SPOT_AWS}) is not here: it has no licence to ship in the repository; "
           "set PEARL_SHARED_DIR to the folder holding data/traces/spot-aws-16node-2023-08-27")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-gpu", action="store_true", default=False, help="run tests marked gpu (needs GPUs + SGLang)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-gpu"):
        return
    skip_gpu = pytest.mark.skip(reason="needs a GPU host: run with `make test-gpu` (pytest -m gpu --run-gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


# --- hang watchdog -------------------------------------------------------------------------------
# pytest-timeout (signal method) fails a test whose *call* overruns, but it is armed once per test:
# a teardown that then hangs (an event loop closing over a task that waits on a dead server, an
# executor thread blocked in a collective) has no limit, and one such test once held CI until its
# 90-minute kill with no word of which test it was. The watchdog covers setup + call + teardown:
# past the test's timeout + WATCHDOG_GRACE_S it prints every thread's stack and the test's name,
# SIGKILLs the test's child processes (servers, trainer ranks: usually what teardown waits on),
# and if the test is still not done WATCHDOG_EXIT_S later, ends pytest with exit code 3.
WATCHDOG_GRACE_S = float(os.environ.get("PEARL_TEST_WATCHDOG_GRACE_S", "180"))
WATCHDOG_EXIT_S = float(os.environ.get("PEARL_TEST_WATCHDOG_EXIT_S", "120"))


def _test_timeout(item: pytest.Item) -> float:
    marker = item.get_closest_marker("timeout")
    if marker is not None and marker.args:
        return float(marker.args[0])
    try:
        return float(item.config.getini("timeout") or 300)
    except (ValueError, TypeError):
        return 300.0


def _kill_children() -> list[str]:
    import psutil

    killed = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            killed.append(f"{child.pid} {' '.join(child.cmdline()[:4])[:120]}")
            child.kill()
    return killed


def _watch(config: pytest.Config, nodeid: str, limit: float, done: threading.Event) -> None:
    if done.wait(limit):
        return
    # pytest captures fd 2 into a temporary file: give the terminal back so the report is seen even
    # if pytest has to be ended below (a captured report would die with it)
    capman = config.pluginmanager.getplugin("capturemanager")
    if capman is not None:
        with contextlib.suppress(Exception):
            capman.suspend_global_capture(in_=False)
    err = sys.stderr
    print(f"\n\nWATCHDOG: {nodeid} still running {limit:.0f} s after it started (setup + call + "
          f"teardown); stacks of every thread follow, then its child processes are killed", file=err, flush=True)
    faulthandler.dump_traceback(file=err, all_threads=True)
    # and the event loop's tasks (the main thread prints them from its SIGUSR1 handler)
    with contextlib.suppress(Exception):
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGUSR1)
        done.wait(3)
    for line in _kill_children():
        print(f"WATCHDOG: killed {line}", file=err, flush=True)
    if done.wait(WATCHDOG_EXIT_S):
        return
    print(f"WATCHDOG: {nodeid} still hung {WATCHDOG_EXIT_S:.0f} s after its children were killed: "
          "ending pytest (exit 3)", file=err, flush=True)
    faulthandler.dump_traceback(file=err, all_threads=True)
    os._exit(3)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    done = threading.Event()
    limit = _test_timeout(item) + WATCHDOG_GRACE_S
    threading.Thread(target=_watch, args=(item.config, item.nodeid, limit, done), name="pearl-test-watchdog", daemon=True).start()
    try:
        yield
    finally:
        done.set()


def _dump_asyncio_tasks(signum: int, frame: object) -> None:
    """SIGUSR1: print every task of the running event loop with its stack (what an idle, hung async
    test waits on; thread stacks alone show only the selector)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        print("asyncio tasks: no event loop is running", file=sys.stderr, flush=True)
        return
    tasks = asyncio.all_tasks(loop)
    print(f"asyncio tasks: {len(tasks)} in the running loop", file=sys.stderr, flush=True)
    for task in tasks:
        # Task.print_stack shows only the task's own frame: follow the chain of awaited coroutines
        print(f"-- {task!r}", file=sys.stderr)
        coro: Any = task.get_coro()
        while coro is not None:
            frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
            if frame is not None:
                print(f"   {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}", file=sys.stderr)
            coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    sys.stderr.flush()


def pytest_configure(config: pytest.Config) -> None:
    # CI's own kill (and `timeout` in .ci/run) sends SIGTERM: say where every thread was
    with contextlib.suppress(AttributeError, ValueError, RuntimeError):
        faulthandler.register(signal.SIGTERM, file=sys.__stderr__, all_threads=True, chain=True)
    with contextlib.suppress(ValueError):  # not the main thread (e.g. pytest run inside a thread)
        signal.signal(signal.SIGUSR1, _dump_asyncio_tasks)
