"""Running a repofix project's tests in its checkout and reading the results.

The projects' tests are plain ``unittest`` (stdlib: fast start, no plugins), run as
``python -m unittest -v ...`` under the sandbox guard (``envs.sandbox.python_command``). The
verbose runner prints one line per test, ``name (module.Class.name) ... ok|FAIL|ERROR|skipped``;
``parse_unittest`` turns those into ``{test_id: status}``. A test that never reports (its module
failed to import, the run was killed) is absent from the map and counts as failed when graded.

Reward (``grade``), with F2P = tests the injected bug breaks, P2P = the other tests::

    r = 1.0                         if every F2P and P2P test passes
    r = 0.5 * passed(F2P) / |F2P|   if every P2P test passes but some F2P test does not
    r = 0.0                         otherwise (a P2P test broken, the run killed or timed out)

Modelling choice: partial credit only while nothing else is broken, and at most half, so that
fixing the bug completely always beats fixing it partly, and breaking the project never pays.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from envs.sandbox import ProcResult, SandboxLimits, python_command, run_limited

PASSED, FAILED, ERROR, SKIPPED = "PASSED", "FAILED", "ERROR", "SKIPPED"

_HEADER = re.compile(r"^(?P<name>[\w.]+) \((?P<where>[\w.]+)\)[^\n]*? \.\.\. ", re.M)
_STATUS = re.compile(r"(ok|FAIL|ERROR|skipped\b.*|expected failure|unexpected success)$", re.M)
_STATUS_MAP = {"ok": PASSED, "FAIL": FAILED, "ERROR": ERROR, "expected failure": PASSED,
               "unexpected success": FAILED}
_TARGET = re.compile(r"^[\w./:-]+$")


class TargetError(ValueError):
    """A ``run_tests`` target that is not a test file / test id; ``str(err)`` is the observation."""


def parse_unittest(output: str) -> dict[str, str]:
    """``{test_id: PASSED|FAILED|ERROR|SKIPPED}`` from ``unittest -v`` output."""
    result: dict[str, str] = {}
    headers = list(_HEADER.finditer(output))
    for k, h in enumerate(headers):
        stop = headers[k + 1].start() if k + 1 < len(headers) else len(output)
        m = _STATUS.search(output, h.end(), stop)
        if m is None:
            continue
        name, where = h.group("name"), h.group("where")
        test_id = where if where.endswith("." + name) else f"{where}.{name}"
        word = m.group(1)
        result[test_id] = SKIPPED if word.startswith("skipped") else _STATUS_MAP[word]
    return result


def target_to_unittest(target: str) -> str:
    """``tests/test_x.py``, ``tests/test_x.py::Cls::test_y`` or ``tests.test_x.Cls`` -> a unittest name."""
    target = target.strip()
    if not _TARGET.match(target) or ".." in target or target.startswith("/"):
        raise TargetError(f"Error: target {target!r} is not a test file or test id (e.g. tests/test_core.py)")
    path, _, rest = target.partition("::")
    if path.endswith(".py"):
        path = path[:-3]
    name = path.replace("/", ".")
    if rest:
        name += "." + rest.replace("::", ".")
    return name


@dataclass(frozen=True, slots=True)
class SuiteRun:
    proc: ProcResult
    status: Mapping[str, str]

    @property
    def passed(self) -> list[str]:
        return sorted(t for t, s in self.status.items() if s == PASSED)

    @property
    def failed(self) -> list[str]:
        return sorted(t for t, s in self.status.items() if s in (FAILED, ERROR))

    def report(self) -> str:
        """The output without the per-test ``... ok`` lines (failures and errors stay in full)."""
        return "\n".join(line for line in self.proc.output.splitlines() if not line.endswith(" ... ok"))

    def summary(self) -> str:
        head = f"{len(self.passed)} passed, {len(self.failed)} failed"
        if self.proc.timed_out or self.proc.returncode < 0:
            head += f" ({self.proc.describe()})"
        return head


async def run_tests(root: Path, limits: SandboxLimits, target: str | None = None) -> SuiteRun:
    """Run the tests of the checkout at ``root`` (all, or ``target``)."""
    args = ["-v", target_to_unittest(target)] if target else ["discover", "-v", "-s", "tests", "-t", "."]
    proc = await run_limited(python_command(root, limits, "unittest", *args), root, limits)
    # Tracebacks name files by absolute path: show them relative to the checkout, as the agent sees it.
    proc = dataclasses.replace(proc, output=proc.output.replace(f"{root}/", ""))
    return SuiteRun(proc, parse_unittest(proc.output))


@dataclass(frozen=True, slots=True)
class Grade:
    reward: float
    resolved: bool
    f2p_passed: int
    f2p_total: int
    p2p_failed: tuple[str, ...]
    timed_out: bool

    def as_info(self) -> dict[str, object]:
        return {"resolved": self.resolved, "f2p_passed": self.f2p_passed, "f2p_total": self.f2p_total,
                "p2p_failed": list(self.p2p_failed), "timed_out": self.timed_out}


def grade(run: SuiteRun, fail_to_pass: tuple[str, ...], pass_to_pass: tuple[str, ...]) -> Grade:
    """The reward of a final test run (formula in the module docstring)."""
    ok = {t for t, s in run.status.items() if s == PASSED}
    f2p_passed = sum(1 for t in fail_to_pass if t in ok)
    p2p_failed = tuple(t for t in pass_to_pass if t not in ok and run.status.get(t) != SKIPPED)
    killed = run.proc.timed_out or run.proc.returncode < 0
    if killed or p2p_failed:
        reward = 0.0
    elif f2p_passed == len(fail_to_pass):
        reward = 1.0
    else:
        reward = 0.5 * f2p_passed / max(1, len(fail_to_pass))
    resolved = reward == 1.0
    return Grade(reward, resolved, f2p_passed, len(fail_to_pass), p2p_failed, run.proc.timed_out)
