"""repofix: real projects, real mutants, real sandboxed test runs (each run is a subprocess)."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path

import pytest

from envs.base import EnvError, TaskError
from envs.repofix import RepoFixConfig, RepoFixEnv, RepoFixTask, available_projects, generate_tasks
from envs.repofix.mutate import MutationError, apply_mutation, find_sites, project_sites, revert_mutation
from envs.repofix.tasks import copy_project, project_dir
from envs.repofix.testrun import SuiteRun, grade, parse_unittest, run_tests, target_to_unittest
from envs.sandbox import ProcResult, SandboxLimits
from envs.toolcall import ToolCall


@pytest.fixture(scope="module")
def tasks() -> tuple[RepoFixTask, ...]:
    return asyncio.run(generate_tasks(4, seed=7))


def fix_call(env: RepoFixEnv, task: RepoFixTask) -> ToolCall:
    """The right patch, as an agent would write it: the mutated line(s) back to the original."""
    m = task.mutation
    mutated = (env._checkout.root / m.file).read_text()  # type: ignore[union-attr]
    fixed = revert_mutation(mutated, m)
    n_old = m.replacement.count("\n") + 1
    n_new = m.original.count("\n") + 1
    old = "\n".join(mutated.splitlines()[m.line - 1:m.line - 1 + n_old])
    new = "\n".join(fixed.splitlines()[m.line - 1:m.line - 1 + n_new])
    return ToolCall("edit", {"path": m.file, "old": old, "new": new})


def test_projects_are_real_and_pass_their_tests(tmp_path: Path) -> None:
    assert set(available_projects()) == {"intervals", "minstats", "stackcalc", "textkit"}

    async def check(name: str) -> SuiteRun:
        root = tmp_path / name
        root.mkdir()
        copy_project(name, root)
        return await run_tests(root, SandboxLimits(time_s=20))

    async def all_runs() -> list[SuiteRun]:
        return [await check(n) for n in available_projects()]

    for run in asyncio.run(all_runs()):
        assert run.proc.returncode == 0, run.proc.output[-2000:]
        assert len(run.passed) >= 20 and run.failed == []


def test_mutation_operators_are_minimal_text_edits() -> None:
    src = "def f(a, b):\n    if a < b and b >= 2:  # keep me\n        return max(a - b, 0) ** 2\n    return a % b\n"
    sites = find_sites("m.py", src)
    kinds = {(m.kind, m.original, m.replacement) for m in sites}
    assert ("compare_flip", "a < b", "a <= b") in kinds
    assert ("compare_flip", "b >= 2", "b > 2") in kinds
    assert ("operator_swap", "a < b and b >= 2", "a < b or b >= 2") in kinds
    assert ("operator_swap", "max(a - b, 0)", "min(a - b, 0)") in kinds
    assert ("operator_swap", "a - b", "a + b") in kinds
    assert ("operator_swap", "max(a - b, 0) ** 2", "max(a - b, 0) * 2") in kinds
    assert ("operator_swap", "a % b", "a // b") in kinds
    assert ("off_by_one", "2", "3") in kinds and ("off_by_one", "0", "-1") in kinds
    flip = next(m for m in sites if m.original == "a < b")
    out = apply_mutation(src, flip)
    assert out == src.replace("a < b", "a <= b", 1)  # the comment and layout stay
    with pytest.raises(MutationError, match="source at that span"):
        apply_mutation(out.replace("a <= b", "x <= y"), flip)


def test_sites_are_deterministic_and_skip_tests() -> None:
    a = project_sites(project_dir("intervals"))
    b = project_sites(project_dir("intervals"))
    assert a == b and len(a) > 20
    assert all(not m.file.startswith("tests/") and not m.file.endswith("__init__.py") for m in a)


def test_task_generation_is_deterministic(tasks: tuple[RepoFixTask, ...]) -> None:
    again = asyncio.run(generate_tasks(4, seed=7))
    assert [t.task_id for t in again] == [t.task_id for t in tasks]
    assert len({t.project for t in tasks}) == 4  # round-robin over the projects
    for t in tasks:
        assert t.fail_to_pass and not set(t.fail_to_pass) & set(t.pass_to_pass)
        assert "Traceback" in t.failure_excerpt or "AssertionError" in t.failure_excerpt
    with pytest.raises(TaskError, match="unknown repofix project 'nope'"):
        asyncio.run(generate_tasks(1, projects=("nope",)))


async def test_injected_bug_fails_and_right_patch_passes(tasks: tuple[RepoFixTask, ...]) -> None:
    task = tasks[0]
    env = RepoFixEnv()
    try:
        first = await env.reset(task)
        assert task.project in first and task.fail_to_pass[0] in first
        before = await env.step(ToolCall("run_tests"))
        assert before.info["failed"] == len(task.fail_to_pass) and not before.done
        assert f"{len(task.pass_to_pass)} passed, {len(task.fail_to_pass)} failed" in before.observation
        edited = await env.step(fix_call(env, task))
        assert edited.observation == f"Edited {task.mutation.file}."
        after = await env.step(ToolCall("run_tests"))
        assert after.info["failed"] == 0
        done = await env.step(ToolCall("submit"))
        assert done.done and done.reward == 1.0 and done.info["resolved"] is True
        with pytest.raises(EnvError, match="already done"):
            await env.step(ToolCall("submit"))
    finally:
        await env.close()


async def test_unfixed_submission_scores_zero_and_editing_tests_does_not_help(tasks: tuple[RepoFixTask, ...]) -> None:
    task = tasks[1]
    env = RepoFixEnv()
    try:
        await env.reset(task)
        # "fix" by deleting the tests: the suite is restored before grading
        for f in (Path(env._checkout.root) / "tests").glob("test_*.py"):  # type: ignore[union-attr]
            f.write_text("")
        res = await env.step(ToolCall("submit"))
        assert res.done and res.reward == 0.0 and res.info["f2p_passed"] == 0
    finally:
        await env.close()


def test_partial_credit_formula() -> None:
    ok = ProcResult(0, "")
    run = SuiteRun(ok, {"a": "PASSED", "b": "FAILED", "p": "PASSED", "q": "SKIPPED"})
    g = grade(run, ("a", "b"), ("p", "q"))
    assert g.reward == pytest.approx(0.25) and not g.resolved
    assert grade(run, ("a",), ("p", "q")).reward == 1.0
    assert grade(run, ("a",), ("p", "b")).reward == 0.0  # a P2P test broke
    assert grade(run, ("a", "missing"), ("p",)).reward == pytest.approx(0.25)
    killed = SuiteRun(ProcResult(-9, "", timed_out=True), {"a": "PASSED"})
    assert grade(killed, ("a",), ()).reward == 0.0


async def test_paths_outside_the_checkout_are_refused(tasks: tuple[RepoFixTask, ...], tmp_path: Path) -> None:
    env = RepoFixEnv()
    outside = tmp_path / "outside.txt"
    try:
        await env.reset(tasks[0])
        root = env._checkout.root  # type: ignore[union-attr]
        (root / "link").symlink_to(tmp_path)
        cases = {
            f"../{outside.name}": "'..' is not allowed",
            str(outside): "absolute path",
            "~/x": "absolute path",
            "link/outside.txt": "goes through a symlink",
            "": "empty path",
        }
        for path, message in cases.items():
            res = await env.step(ToolCall("write", {"path": path, "content": "pwned"}))
            assert message in res.observation and res.info["error"] == "refused", path
            res = await env.step(ToolCall("view", {"path": path}))
            assert res.observation.startswith("Error:"), path
        assert not outside.exists() and not list(tmp_path.glob("outside*"))
        # a new file inside, in a new folder, is fine
        res = await env.step(ToolCall("write", {"path": "notes/a.txt", "content": "ok"}))
        assert res.observation == "Created notes/a.txt." and (root / "notes" / "a.txt").read_text() == "ok"
    finally:
        await env.close()
    assert not root.exists()


async def test_code_under_test_cannot_write_outside_or_spawn(tasks: tuple[RepoFixTask, ...], tmp_path: Path) -> None:
    env = RepoFixEnv()
    target = tmp_path / "escaped.txt"
    evil = (
        "import os, subprocess, unittest\n"
        "class TestEvil(unittest.TestCase):\n"
        f"    def test_write(self):\n        open({str(target)!r}, 'w').write('x')\n"
        f"    def test_rename(self):\n        open('inside.txt', 'w').write('x')\n"
        f"        os.rename('inside.txt', {str(target)!r})\n"
        "    def test_spawn(self):\n        subprocess.run(['true'])\n"
        f"    def test_dir_fd(self):\n        fd = os.open({str(tmp_path)!r}, os.O_RDONLY)\n"
        "        os.open('escaped.txt', os.O_WRONLY | os.O_CREAT, dir_fd=fd)\n"
        "    def test_ctypes(self):\n        import ctypes\n"
        "    def test_inside_ok(self):\n        open('inside2.txt', 'w').write('fine')\n"
    )
    try:
        await env.reset(tasks[0])
        await env.step(ToolCall("write", {"path": "tests/test_evil.py", "content": evil}))
        res = await env.step(ToolCall("run_tests", {"target": "tests/test_evil.py"}))
        assert not target.exists()
        assert res.observation.count("PermissionError: sandbox:") == 5, res.observation
        assert "1 passed, 5 failed" in res.observation
    finally:
        await env.close()


async def test_time_limit_is_enforced(tasks: tuple[RepoFixTask, ...]) -> None:
    cfg = RepoFixConfig(command=SandboxLimits(time_s=1.0), grade=SandboxLimits(time_s=1.0))
    env = RepoFixEnv(cfg)
    task = tasks[0]
    try:
        await env.reset(task)
        src = env._checkout.root / task.mutation.file  # type: ignore[union-attr]
        src.write_text(src.read_text() + "\nwhile True:\n    pass\n")
        t0 = time.monotonic()
        res = await env.step(ToolCall("run_tests"))
        assert time.monotonic() - t0 < 10
        assert res.info["timed_out"] is True and "time limit" in res.observation
        done = await env.step(ToolCall("submit"))
        assert done.done and done.reward == 0.0 and done.info["timed_out"] is True
    finally:
        await env.close()


async def test_memory_and_output_limits(tasks: tuple[RepoFixTask, ...]) -> None:
    cfg = RepoFixConfig(command=SandboxLimits(time_s=10.0, memory_mb=256, max_output_chars=2000),
                        max_observation_chars=100_000)
    env = RepoFixEnv(cfg)
    test = ("import unittest\nclass TestBig(unittest.TestCase):\n"
            "    def test_alloc(self):\n        b = bytearray(1024 * 2**20)\n"
            "    def test_print(self):\n        print('y' * 50000)\n")
    try:
        await env.reset(tasks[0])
        await env.step(ToolCall("write", {"path": "tests/test_big.py", "content": test}))
        res = await env.step(ToolCall("run_tests", {"target": "tests/test_big.py"}))
        assert "MemoryError" in res.observation
        assert "bytes of output omitted" in res.observation and len(res.observation) < 3000
    finally:
        await env.close()


async def test_shell_only_when_allowed(tasks: tuple[RepoFixTask, ...]) -> None:
    env = RepoFixEnv()
    shell_env = RepoFixEnv(RepoFixConfig(allow_shell=True))
    try:
        await env.reset(tasks[0])
        res = await env.step(ToolCall("shell", {"cmd": "ls"}))
        assert "unknown tool 'shell'" in res.observation
        await shell_env.reset(tasks[0])
        res = await shell_env.step(ToolCall("shell", {"cmd": "ls tests | head -1; exit 3"}))
        assert res.observation.startswith("[exit code 3]\n__init__.py")
    finally:
        await env.close()
        await shell_env.close()


async def test_view_edit_errors_are_observations(tasks: tuple[RepoFixTask, ...]) -> None:
    env = RepoFixEnv()
    task = tasks[0]
    try:
        with pytest.raises(EnvError, match="before reset"):
            await env.step(ToolCall("view", {"path": "."}))
        await env.reset(task)
        listing = (await env.step(ToolCall("view", {"path": "."}))).observation
        assert task.mutation.file in listing and "tests/__init__.py" in listing
        view = (await env.step(ToolCall("view", {"path": task.mutation.file, "lines": "1-3"}))).observation
        assert view.splitlines()[0].startswith("1  ")
        bad = await env.step(ToolCall("edit", {"path": task.mutation.file, "old": "no such text", "new": "x"}))
        assert "was not found" in bad.observation
        missing = await env.step(ToolCall("view", {"path": "nope.py"}))
        assert "does not exist" in missing.observation
        bad_target = await env.step(ToolCall("run_tests", {"target": "tests/x.py; rm -rf /"}))
        assert "is not a test file" in bad_target.observation
        two = await env.step(ToolCall("view", {"path": "."}, ignored_calls=2))
        assert two.observation.startswith("[note: only the first tool call of a reply runs; 2 more ignored]")
    finally:
        await env.close()


def test_unittest_parsing() -> None:
    out = ("test_a (tests.test_m.T.test_a) ... ok\ntest_b (tests.test_m.T.test_b) ... FAIL\n"
           "test_c (tests.test_m.T.test_c) ... printed stuff\nERROR\n"
           "test_d (tests.test_m.T.test_d) ... skipped 'why'\ntest_e (tests.test_m.T) ... expected failure\n")
    assert parse_unittest(out) == {"tests.test_m.T.test_a": "PASSED", "tests.test_m.T.test_b": "FAILED",
                                   "tests.test_m.T.test_c": "ERROR", "tests.test_m.T.test_d": "SKIPPED",
                                   "tests.test_m.T.test_e": "PASSED"}
    broken = "tests.test_x (unittest.loader._FailedTest.tests.test_x) ... ERROR\n"
    assert parse_unittest(broken) == {"unittest.loader._FailedTest.tests.test_x": "ERROR"}  # import failure
    assert target_to_unittest("tests/test_m.py::T::test_a") == "tests.test_m.T.test_a"
    assert target_to_unittest("tests.test_m") == "tests.test_m"


def test_checkouts_do_not_leak(tasks: tuple[RepoFixTask, ...], tmp_path: Path) -> None:
    async def episode() -> None:
        env = RepoFixEnv(RepoFixConfig(workdir=str(tmp_path)))
        await env.reset(tasks[2])
        await env.reset(tasks[3])  # a second reset replaces the first checkout
        assert len(os.listdir(tmp_path)) == 1
        await env.close()
        await env.close()  # idempotent

    asyncio.run(episode())
    assert os.listdir(tmp_path) == []
    shutil.rmtree(tmp_path, ignore_errors=True)
