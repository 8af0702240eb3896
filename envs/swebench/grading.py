"""Grading an evaluation log the way the SWE-bench harness does (``harness/grading.py``).

``status_map(log, parser)``: the log must not carry a failure marker (patch apply failed, reset
failed, tests errored / timed out) and must hold the ``Start/End Test Output`` markers; the text
between them is parsed by the repository's log parser into ``{test: PASSED|FAILED|SKIPPED|ERROR|
XFAIL}`` (falling back to the whole log when the markers enclose no result line).

``grade(instance, log)``: with the gold lists F2P = FAIL_TO_PASS and P2P = PASS_TO_PASS,

- an F2P test succeeds if its status is PASSED or XFAIL; it fails if it is absent, FAILED,
  ERROR or SKIPPED;
- a P2P test is maintained if PASSED, XFAIL or SKIPPED; it fails if absent, FAILED or ERROR;
- f2p = |F2P succeeded| / |F2P| and p2p = |P2P maintained| / |P2P| (each 1 when its list is empty);
- status FULL if f2p = p2p = 1, PARTIAL if 0 < f2p < 1 and p2p = 1, else NO.

Reward: ``1.0`` for FULL (resolved), else ``0.0`` -- the binary "resolved" signal SWE-bench RL
trains on; the fractions are reported in ``info`` for analysis.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from envs.swebench.dataset import SWEBenchInstance
from envs.swebench.harness import (
    APPLY_PATCH_FAIL,
    END_TEST_OUTPUT,
    RESET_FAILED,
    START_TEST_OUTPUT,
    TESTS_ERROR,
    TESTS_TIMEOUT,
    repo_spec,
)

PASSED, FAILED, SKIPPED, ERROR, XFAIL = "PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL"
_STATUSES = (FAILED, PASSED, SKIPPED, ERROR, XFAIL)
_ST = "|".join(_STATUSES)
_STATUS_FIRST = re.compile(rf"^({_ST})\s+(\S+)")
_TEST_FIRST = re.compile(rf"^(\S+)\s+({_ST})(?:\s|$)")
_SKIP_COUNT = re.compile(r"\[\d+\]")


def _pytest_line(line: str) -> tuple[str, str] | None:
    m = _STATUS_FIRST.match(line)
    if m:
        status, name = m.groups()
        if status == FAILED:
            name = line.replace(" - ", " ").split()[1]
        if status == SKIPPED and _SKIP_COUNT.match(name):
            return None
        return name, status
    m = _TEST_FIRST.match(line)
    if m:
        return m.group(1), m.group(2)
    return None


def parse_log_pytest(log: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in log.split("\n"):
        parsed = _pytest_line(line)
        if parsed:
            out[parsed[0]] = parsed[1]
    return out


def _normalise_option(name: str) -> str:
    m = re.search(r"(.*?)\[(.*)\]", name)
    if not m:
        return name
    main, option = m.groups()
    if option.startswith("/") and not option.startswith("//") and "*" not in option:
        option = "/" + option.split("/")[-1]
    return f"{main}[{option}]"


def parse_log_pytest_options(log: str) -> dict[str, str]:
    return {_normalise_option(k): v for k, v in parse_log_pytest(log).items()}


def parse_log_pytest_v2(log: str) -> dict[str, str]:
    escapes = "".join(chr(c) for c in range(1, 32))
    table = str.maketrans("", "", escapes)
    out: dict[str, str] = {}
    for line in log.split("\n"):
        line = re.sub(r"\[(\d+)m", "", line).translate(table)
        parsed = _pytest_line(line)
        if parsed:
            out[parsed[0]] = parsed[1]
    return out


def parse_log_django(log: str) -> dict[str, str]:
    out: dict[str, str] = {}
    prev = None
    for raw in log.split("\n"):
        line = raw.strip()
        if " ... " in line:
            prev = line.split(" ... ")[0]
        for suffix in (" ... ok", " ... OK", " ...  OK"):
            if line.endswith(suffix):
                out[line.rsplit(suffix, 1)[0]] = PASSED
                break
        if " ... skipped" in line:
            out[line.split(" ... skipped")[0]] = SKIPPED
        if line.endswith(" ... FAIL"):
            out[line.split(" ... FAIL")[0]] = FAILED
        if line.startswith("FAIL:") and len(line.split()) > 1:
            out[line.split()[1].strip()] = FAILED
        if line.endswith(" ... ERROR"):
            out[line.split(" ... ERROR")[0]] = ERROR
        if line.startswith("ERROR:") and len(line.split()) > 1:
            out[line.split()[1].strip()] = ERROR
        if line.lstrip().startswith("ok") and prev is not None:
            out[prev] = PASSED
    return out


def parse_log_sympy(log: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for m in re.findall(r"(_*) (.*)\.py:(.*) (_*)", log):
        out[f"{m[1]}.py:{m[2]}"] = FAILED
    for raw in log.split("\n"):
        line = raw.strip()
        if line.startswith("test_"):
            name = line.split()[0]
            if line.endswith(" E"):
                out[name] = ERROR
            if line.endswith(" F"):
                out[name] = FAILED
            if line.endswith(" ok"):
                out[name] = PASSED
    return out


def parse_log_matplotlib(log: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for raw in log.split("\n"):
        line = raw.replace("MouseButton.LEFT", "1").replace("MouseButton.RIGHT", "3")
        if any(line.startswith(s) for s in _STATUSES):
            if line.startswith(FAILED):
                line = line.replace(" - ", " ")
            parts = line.split()
            if len(parts) > 1:
                out[parts[1]] = parts[0]
    return out


def parse_log_seaborn(log: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in log.split("\n"):
        if line.startswith(FAILED):
            out[line.split()[1]] = FAILED
        elif f" {PASSED} " in line:
            parts = line.split()
            if parts[1] == PASSED:
                out[parts[0]] = PASSED
        elif line.startswith(PASSED):
            out[line.split()[1]] = PASSED
    return out


PARSERS: dict[str, Callable[[str], dict[str, str]]] = {
    "pytest": parse_log_pytest, "pytest_options": parse_log_pytest_options, "pytest_v2": parse_log_pytest_v2,
    "django": parse_log_django, "sympy": parse_log_sympy, "matplotlib": parse_log_matplotlib,
    "seaborn": parse_log_seaborn,
}
_BAD_CODES = (APPLY_PATCH_FAIL, RESET_FAILED, TESTS_ERROR, TESTS_TIMEOUT)


def status_map(log: str, parser: str) -> tuple[dict[str, str], bool]:
    """(test statuses, whether the log is gradable) -- see the module docstring."""
    if any(code in log for code in _BAD_CODES):
        return {}, False
    if START_TEST_OUTPUT not in log or END_TEST_OUTPUT not in log:
        return {}, False
    body = log.split(START_TEST_OUTPUT)[1].split(END_TEST_OUTPUT)[0]
    parse = PARSERS[parser]
    statuses = parse(body)
    return (statuses or parse(log)), True


@dataclass(frozen=True, slots=True)
class SWEGrade:
    status: str  # RESOLVED_FULL | RESOLVED_PARTIAL | RESOLVED_NO
    patch_applied: bool
    f2p_success: tuple[str, ...]
    f2p_failure: tuple[str, ...]
    p2p_success: tuple[str, ...]
    p2p_failure: tuple[str, ...]

    @property
    def resolved(self) -> bool:
        return self.status == "RESOLVED_FULL"

    @property
    def reward(self) -> float:
        return 1.0 if self.resolved else 0.0

    def as_info(self) -> dict[str, object]:
        return {"status": self.status, "resolved": self.resolved, "patch_applied": self.patch_applied,
                "f2p_passed": len(self.f2p_success), "f2p_total": len(self.f2p_success) + len(self.f2p_failure),
                "p2p_failed": list(self.p2p_failure)}


def grade(instance: SWEBenchInstance, log: str) -> SWEGrade:
    """Grade an evaluation log of ``instance`` (rules in the module docstring)."""
    parser = repo_spec(instance.repo, instance.version).parser
    sm, ok = status_map(log, parser)
    if not ok:
        return SWEGrade("RESOLVED_NO", False, (), tuple(instance.fail_to_pass), (), tuple(instance.pass_to_pass))
    f2p_s = tuple(t for t in instance.fail_to_pass if sm.get(t) in (PASSED, XFAIL))
    f2p_f = tuple(t for t in instance.fail_to_pass if sm.get(t) not in (PASSED, XFAIL))
    p2p_s = tuple(t for t in instance.pass_to_pass if sm.get(t) in (PASSED, XFAIL, SKIPPED))
    p2p_f = tuple(t for t in instance.pass_to_pass if sm.get(t) not in (PASSED, XFAIL, SKIPPED))
    f2p = len(f2p_s) / len(instance.fail_to_pass) if instance.fail_to_pass else 1.0
    p2p = len(p2p_s) / len(instance.pass_to_pass) if instance.pass_to_pass else 1.0
    if f2p == 1 and p2p == 1:
        status = "RESOLVED_FULL"
    elif 0 < f2p < 1 and p2p == 1:
        status = "RESOLVED_PARTIAL"
    else:
        status = "RESOLVED_NO"
    return SWEGrade(status, True, f2p_s, f2p_f, p2p_s, p2p_f)
