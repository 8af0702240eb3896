"""SWE-bench grading on recorded logs (real bash + pytest runs), the log parsers, and the submit flow."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from envs.sandbox import ProcResult, SandboxLimits
from envs.swebench import SWEBenchEnv, SWEBenchInstance, grade, load_instances
from envs.swebench.grading import (
    parse_log_django,
    parse_log_pytest,
    parse_log_pytest_options,
    parse_log_pytest_v2,
    parse_log_sympy,
    status_map,
)
from envs.swebench.harness import APPLY_PATCH_FAIL, APPLY_PATCH_PASS, END_TEST_OUTPUT, START_TEST_OUTPUT
from envs.toolcall import ToolCall
from tests.conftest import LITE_DEV
from tests.envs.swebench_logs import DATA, record_log


@pytest.fixture(scope="module")
def insts() -> dict[str, SWEBenchInstance]:
    return {i.instance_id: i for i in load_instances(LITE_DEV)}


def test_recorded_logs(insts: dict[str, SWEBenchInstance]) -> None:
    inst = insts["sqlfluff__sqlfluff-1625"]
    ok = grade(inst, (DATA / "sqlfluff__sqlfluff-1625.resolved.log").read_text())
    assert ok.status == "RESOLVED_FULL" and ok.reward == 1.0 and ok.patch_applied
    assert len(ok.p2p_success) == 64 and ok.f2p_failure == ()
    bad = grade(inst, (DATA / "sqlfluff__sqlfluff-1625.unresolved.log").read_text())
    assert bad.status == "RESOLVED_NO" and bad.reward == 0.0
    assert bad.f2p_failure == inst.fail_to_pass
    assert bad.p2p_failure == (inst.pass_to_pass[3],) and len(bad.p2p_success) == 63
    # test ids with spaces are cut at the first space by the harness parser, on both sides
    assert "test/cli/commands_test.py::test__cli__command_fix_stdin[select" in ok.p2p_success


def test_live_recorded_log_partial_and_full(insts: dict[str, SWEBenchInstance], tmp_path: Path) -> None:
    inst = insts["pydicom__pydicom-1139"]  # 3 FAIL_TO_PASS, pytest_options parser
    partial = grade(inst, record_log(inst, tmp_path / "a", failing={inst.fail_to_pass[0]}))
    assert partial.status == "RESOLVED_PARTIAL" and partial.reward == 0.0
    assert partial.as_info()["f2p_passed"] == 2 and partial.as_info()["f2p_total"] == 3
    full = grade(inst, record_log(inst, tmp_path / "b"))
    assert full.status == "RESOLVED_FULL" and full.reward == 1.0


def test_failure_markers_and_missing_markers_are_not_gradable(insts: dict[str, SWEBenchInstance]) -> None:
    inst = insts["sqlfluff__sqlfluff-1625"]
    log = (DATA / "sqlfluff__sqlfluff-1625.resolved.log").read_text()
    for broken in (f"{APPLY_PATCH_FAIL}\n{log}", log.replace(END_TEST_OUTPUT, ""), log + "\n>>>>> Tests Timed Out"):
        g = grade(inst, broken)
        assert g.status == "RESOLVED_NO" and not g.patch_applied and g.f2p_failure == inst.fail_to_pass
    # results outside the markers are used when the markers enclose none (the harness fallback)
    moved = f"{START_TEST_OUTPUT}\n{END_TEST_OUTPUT}\n" + log.replace(START_TEST_OUTPUT, "").replace(END_TEST_OUTPUT, "")
    assert grade(inst, moved).resolved


def test_empty_gold_lists_count_as_satisfied(insts: dict[str, SWEBenchInstance]) -> None:
    inst = dataclasses.replace(insts["pydicom__pydicom-901"], fail_to_pass=("a::t",))
    assert inst.pass_to_pass == ()
    log = f"{START_TEST_OUTPUT}\nPASSED a::t\n{END_TEST_OUTPUT}"
    assert grade(inst, log).resolved


def test_uncounted_statuses(insts: dict[str, SWEBenchInstance]) -> None:
    """SKIPPED (or any status but PASSED / XFAIL / FAILED / ERROR) counts as neither success nor failure."""
    inst = dataclasses.replace(insts["pydicom__pydicom-901"], fail_to_pass=("a::t1", "a::t2"), pass_to_pass=("a::p",))

    def log(*lines: str) -> str:
        return f"{START_TEST_OUTPUT}\n" + "\n".join(lines) + f"\n{END_TEST_OUTPUT}"
    assert grade(inst, log("PASSED a::t1", "SKIPPED a::t2", "PASSED a::p")).status == "RESOLVED_FULL"
    assert grade(inst, log("SKIPPED a::t1", "SKIPPED a::t2", "SKIPPED a::p")).status == "RESOLVED_FULL"
    assert grade(inst, log("PASSED a::t1", "ERROR: a::t2", "PASSED a::p")).status == "RESOLVED_FULL"
    partial = grade(inst, log("PASSED a::t1", "SKIPPED a::p"))
    assert partial.status == "RESOLVED_PARTIAL" and partial.f2p_failure == ("a::t2",) and partial.p2p_success == ()
    assert grade(inst, log("PASSED a::t1", "PASSED a::t2", "ERROR a::p")).status == "RESOLVED_NO"


def test_log_parsers() -> None:
    pytest_log = ("PASSED a.py::t1\nFAILED a.py::t2 - AssertionError: boom\na.py::t3 PASSED\n"
                  "SKIPPED [2] a.py:10: no numpy\nSKIPPED a.py::t4\nXFAIL a.py::t5 - known\nERROR a.py::t6\n")
    # the harness's reading: a count line keys its "[n]", the verbose "name STATUS" form is not read
    assert parse_log_pytest(pytest_log) == {"a.py::t1": "PASSED", "a.py::t2": "FAILED", "[2]": "SKIPPED",
                                            "a.py::t4": "SKIPPED", "a.py::t5": "XFAIL", "a.py::t6": "ERROR"}
    assert parse_log_pytest_v2(pytest_log)["a.py::t3"] == "PASSED"
    opts = "PASSED p/test_x.py::test_read[/home/ci/data/ct.dcm]\nPASSED p/test_x.py::test_y[//net/a]\n"
    assert parse_log_pytest_options(opts) == {"p/test_x.py::test_read[/ct.dcm]": "PASSED",
                                              "p/test_x.py::test_y[//net/a]": "PASSED"}
    assert parse_log_pytest_v2("\x1b[32mPASSED\x1b[0m a.py::t1\n") == {"a.py::t1": "PASSED"}
    django = ("test_ok (admin.tests.T) ... ok\ntest_skip (admin.tests.T) ... skipped 'x'\n"
              "test_bad (admin.tests.T) ... FAIL\ntest_err (admin.tests.T) ... ERROR\n"
              "test_slow (admin.tests.T) ... System check\nok\n")
    assert parse_log_django(django) == {"test_ok (admin.tests.T)": "PASSED", "test_skip (admin.tests.T)": "SKIPPED",
                                        "test_bad (admin.tests.T)": "FAILED", "test_err (admin.tests.T)": "ERROR",
                                        "test_slow (admin.tests.T)": "PASSED"}
    assert parse_log_sympy("test_a ok\ntest_b F\ntest_c E\n") == {"test_a": "PASSED", "test_b": "FAILED",
                                                                  "test_c": "ERROR"}
    assert status_map("no markers", "pytest") == ({}, False)


# ------------------------------------------------------------- the submit flow, Docker faked
class FakeDocker:
    """The ``DockerCLI`` contract over an in-memory /testbed (Docker cannot run here).

    Scripts are recognised by the exact shapes ``SWEBenchEnv`` sends; the eval run returns the
    recorded log for the instance, resolved iff the agent's file holds the fix.
    """

    def __init__(self, log_ok: str, log_bad: str) -> None:
        self.files = {"/testbed/src/sqlfluff/rules/L031.py": "def check():\n    return 'alias'\n"}
        self.original = dict(self.files)
        self.log_ok, self.log_bad = log_ok, log_bad
        self.containers: list[str] = []
        self.removed: list[str] = []
        self.scripts: list[str] = []
        self.patch = ""

    async def check(self) -> None:
        return None

    async def image_exists(self, image: str) -> bool:
        return image == "sweb.eval.x86_64.sqlfluff__sqlfluff-1625:latest"

    async def start(self, image: str, name_hint: str) -> str:
        self.containers.append(f"c{len(self.containers)}")
        return self.containers[-1]

    async def remove(self, container: str) -> None:
        self.removed.append(container)

    async def exec(self, container: str, script: str, limits: SandboxLimits, stdin: bytes | None = None,
                   workdir: str = "/testbed") -> ProcResult:
        self.scripts.append(f"{container}: {script}")
        if script.startswith("cat -- "):
            path = script.split()[-1].strip("'")
            return ProcResult(0, self.files[path]) if path in self.files else ProcResult(1, "No such file")
        if script.startswith("mkdir -p -- "):
            self.files[script.rsplit("> ", 1)[1].strip("'")] = (stdin or b"").decode()
            return ProcResult(0, "")
        if "git diff --cached" in script:
            changed = [p for p, t in self.files.items() if self.original.get(p) != t]
            return ProcResult(0, "".join(f"diff --git a{p[8:]} b{p[8:]}\n" for p in changed))
        if script.startswith("cat > /tmp/patch.diff"):
            self.patch = (stdin or b"").decode()
            return ProcResult(0, "")
        if "git apply --verbose" in script:
            return ProcResult(0, f"Checking patch...\n{APPLY_PATCH_PASS}\n")
        if script.startswith("cat > /eval.sh"):
            return ProcResult(0, "")
        if script.startswith("bash /eval.sh"):
            fixed = "return 'fixed'" in self.files["/testbed/src/sqlfluff/rules/L031.py"]
            return ProcResult(0, self.log_ok if fixed else self.log_bad)
        return ProcResult(0, f"ran in {workdir}")


async def test_submit_extracts_the_patch_and_grades_in_a_fresh_container(insts: dict[str, SWEBenchInstance]) -> None:
    inst = insts["sqlfluff__sqlfluff-1625"]
    fake = FakeDocker((DATA / "sqlfluff__sqlfluff-1625.resolved.log").read_text(),
                      (DATA / "sqlfluff__sqlfluff-1625.unresolved.log").read_text())
    env = SWEBenchEnv(docker=fake)  # type: ignore[arg-type]
    prompt = await env.reset(inst)
    assert inst.problem_statement.strip()[:60] in prompt
    view = await env.step(ToolCall("view", {"path": "src/sqlfluff/rules/L031.py", "lines": "1-2"}))
    assert view.observation == "ran in /testbed"
    assert "cat -n -- /testbed/src/sqlfluff/rules/L031.py | sed -n '1,2p'" in fake.scripts[-1]
    refused = await env.step(ToolCall("write", {"path": "../etc/passwd", "content": "x"}))
    assert "outside the repository /testbed" in refused.observation
    edit = await env.step(ToolCall("edit", {"path": "/testbed/src/sqlfluff/rules/L031.py", "old": "'alias'",
                                            "new": "'fixed'"}))
    assert edit.observation == "Edited /testbed/src/sqlfluff/rules/L031.py."
    tests = await env.step(ToolCall("run_tests"))
    assert "pytest -rA test/cli/commands_test.py" in fake.scripts[-1]
    assert "conda activate testbed" in fake.scripts[-1] and tests.info["returncode"] == 0
    await env.step(ToolCall("shell", {"cmd": "git status"}))
    assert fake.scripts[-1].endswith("&& git status")
    done = await env.step(ToolCall("submit"))
    assert done.done and done.reward == 1.0 and done.info["status"] == "RESOLVED_FULL"
    assert fake.patch == "diff --git a/src/sqlfluff/rules/L031.py b/src/sqlfluff/rules/L031.py\n"
    assert fake.containers == ["c0", "c1"]  # the eval ran in a fresh container
    assert any(s.startswith("c1: bash /eval.sh") for s in fake.scripts)
    await env.close()
    assert fake.removed == ["c0", "c1"]


async def test_unfixed_and_empty_submissions(insts: dict[str, SWEBenchInstance]) -> None:
    inst = insts["sqlfluff__sqlfluff-1625"]
    log_ok = (DATA / "sqlfluff__sqlfluff-1625.resolved.log").read_text()
    log_bad = (DATA / "sqlfluff__sqlfluff-1625.unresolved.log").read_text()
    fake = FakeDocker(log_ok, log_bad)
    env = SWEBenchEnv(docker=fake)  # type: ignore[arg-type]
    await env.reset(inst)
    empty = await env.step(ToolCall("submit"))
    assert empty.done and empty.reward == 0.0 and empty.info["status"] == "EMPTY_PATCH"
    await env.close()
    fake = FakeDocker(log_ok, log_bad)
    env = SWEBenchEnv(docker=fake)  # type: ignore[arg-type]
    await env.reset(inst)
    await env.step(ToolCall("write", {"path": "src/sqlfluff/rules/L031.py", "content": "wrong\n"}))
    res = await env.step(ToolCall("submit"))
    assert res.reward == 0.0 and res.info["status"] == "RESOLVED_NO"
    await env.close()
