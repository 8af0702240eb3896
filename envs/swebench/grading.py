"""Grading an evaluation log the way the SWE-bench harness does (``swebench`` 4.1.0).

``status_map(log, parser)``: the log must not carry a failure marker (patch apply failed, reset
failed, tests errored / timed out) and must hold the ``Start/End Test Output`` markers; the text
between them is parsed by the repository's log parser into ``{test: status word}`` (PASSED,
FAILED, SKIPPED, ERROR, XFAIL, as the parser reads them), falling back to the whole log when the
markers enclose no result line.

``grade(instance, log)``: with the gold lists F2P = FAIL_TO_PASS and P2P = PASS_TO_PASS, a test
succeeds if its status is PASSED or XFAIL and fails if it is absent, FAILED or ERROR; any other
status (SKIPPED, or a status word as a parser read it, e.g. ``ERROR:``) is counted in neither.
With S and F the succeeded and failed tests of a list,

- f2p = |S(F2P)| / (|S(F2P)| + |F(F2P)|) and p2p = |S(P2P)| / (|S(P2P)| + |F(P2P)|), each 1 when
  its denominator is 0 (an empty list, or every test of it uncounted);
- status FULL if f2p = p2p = 1, PARTIAL if 0 < f2p < 1 and p2p = 1, else NO.

The parsers and these rules equal those of the ``swebench`` package 4.1.0 (``harness/grading.py``,
``harness/log_parsers/python.py``) on every Python repository; each parser's docstring says what it
reads. Where the package's parser would raise on a line (a bare ``FAIL:`` / ``ERROR:`` for Django,
a status word with no name for seaborn) that line is skipped here.

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
_CONTROL = str.maketrans("", "", "".join(chr(c) for c in range(1, 32)))
_ANSI_CODE = re.compile(r"\[(\d+)m")
_OPTION = re.compile(r"(.*?)\[(.*)\]")


def _status_first(line: str) -> tuple[str, str] | None:
    """(name, status) of a line that starts with a status word, else None.

    The line is split on whitespace (a FAILED line first loses its `` - `` separators) and read as
    ``<status> <name> ...``: the first field is the status as written, so ``ERROR: x`` gives
    ``("x", "ERROR:")`` and ``SKIPPED [2] a.py:10: why`` gives ``("[2]", "SKIPPED")``. A line of
    one field gives None.
    """
    if not line.startswith(_STATUSES):
        return None
    if line.startswith(FAILED):
        line = line.replace(" - ", " ")
    fields = line.split()
    return (fields[1], fields[0]) if len(fields) > 1 else None


def parse_log_pytest(log: str) -> dict[str, str]:
    """pytest ``-rA`` summary lines ``STATUS name [- message]`` (``_status_first``), nothing else.

    Lines are read as they are: no ANSI stripping, and the verbose ``name STATUS`` form is not read.
    """
    out: dict[str, str] = {}
    for line in log.split("\n"):
        parsed = _status_first(line)
        if parsed:
            out[parsed[0]] = parsed[1]
    return out


def _normalise_option(name: str) -> str:
    """``test[/abs/path/file]`` -> ``test[/file]`` (an option that is one absolute path, not ``//``
    nor holding ``*``), so a parametrised test keeps its gold name whatever the checkout path."""
    m = _OPTION.search(name)
    if not m:
        return name
    main, option = m.groups()
    if option.startswith("/") and not option.startswith("//") and "*" not in option:
        option = "/" + option.split("/")[-1]
    return f"{main}[{option}]"


def parse_log_pytest_options(log: str) -> dict[str, str]:
    """``parse_log_pytest`` with each name's ``[option]`` normalised (``_normalise_option``)."""
    out: dict[str, str] = {}
    for line in log.split("\n"):
        parsed = _status_first(line)
        if parsed:
            out[_normalise_option(parsed[0])] = parsed[1]
    return out


def parse_log_pytest_v2(log: str) -> dict[str, str]:
    """pytest output with colours: each line loses ``[<n>m`` codes and control characters, then is
    read as ``STATUS name ...`` (``_status_first``) or, when it ends with a status word, as the
    verbose ``name STATUS`` (first field the name, second the status; two fields at least)."""
    out: dict[str, str] = {}
    for raw in log.split("\n"):
        line = _ANSI_CODE.sub("", raw).translate(_CONTROL)
        if line.startswith(_STATUSES):
            parsed = _status_first(line)
            if parsed:
                out[parsed[0]] = parsed[1]
        elif line.endswith(_STATUSES):
            fields = line.split()
            if len(fields) >= 2:
                out[fields[0]] = fields[1]
    return out


_DJANGO_PASS_SUFFIXES = (" ... ok", " ... OK", " ...  OK")
_DJANGO_VERSION_LINE = "--version is equivalent to version"
_DJANGO_MIGRATION_PREFIX = "Applying sites.0002_alter_domain_unique...test_no_migrations"
# A test whose "ok" lands on the next line after one of Django's multi-line prints.
_DJANGO_SPLIT_OK = tuple(re.compile(p, re.MULTILINE) for p in (
    r"^(.*?)\s\.\.\.\sTesting\ against\ Django\ installed\ in\ ((?s:.*?))\ silenced\)\.\nok$",
    r"^(.*?)\s\.\.\.\sInternal\ Server\ Error:\ \/(.*)\/\nok$",
    r"^(.*?)\s\.\.\.\sSystem check identified no issues \(0 silenced\)\nok$",
))


def parse_log_django(log: str) -> dict[str, str]:
    """Django's runner at ``--verbosity 2``, line by line (stripped), later lines overriding:

    ``name ... ok|OK`` PASSED; ``name ... skipped ...`` SKIPPED; ``name ... FAIL`` and ``FAIL: name``
    FAILED; ``name ... ERROR`` and ``ERROR: name`` ERROR; a line starting ``ok`` marks the last
    ``name ... `` seen PASSED (output between the name and its ``ok``); a line holding
    ``--version is equivalent to version`` is that name PASSED; a pass line starting with the
    ``sites.0002`` migration print is read after its first ``...``. Then over the whole log: a
    ``name ... <Django's multi-line print>\nok`` (``_DJANGO_SPLIT_OK``) is PASSED. A bare ``FAIL:``
    or ``ERROR:`` line (no name) is skipped.
    """
    out: dict[str, str] = {}
    prev = None
    for raw in log.split("\n"):
        line = raw.strip()
        if _DJANGO_VERSION_LINE in line:
            out[_DJANGO_VERSION_LINE] = PASSED
        if " ... " in line:
            prev = line.split(" ... ")[0]
        for suffix in _DJANGO_PASS_SUFFIXES:
            if line.endswith(suffix):
                if line.startswith(_DJANGO_MIGRATION_PREFIX):
                    line = line.split("...", 1)[-1].strip()
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
    for pattern in _DJANGO_SPLIT_OK:
        for m in pattern.finditer(log):
            out[m.group(1)] = PASSED
    return out


def parse_log_sympy(log: str) -> dict[str, str]:
    """sympy's ``bin/test --verbose``: every ``<_*> path.py:name <_*>`` failure header in the log is
    ``path.py:name`` FAILED; then each stripped line starting ``test_`` is ERROR / FAILED / PASSED
    when it ends with `` E`` / `` F`` / `` ok`` (its first field the name)."""
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
    """``parse_log_pytest`` on lines where ``MouseButton.LEFT`` / ``.RIGHT`` read ``1`` / ``3`` (the
    parametrised names of the gold lists)."""
    out: dict[str, str] = {}
    for raw in log.split("\n"):
        parsed = _status_first(raw.replace("MouseButton.LEFT", "1").replace("MouseButton.RIGHT", "3"))
        if parsed:
            out[parsed[0]] = parsed[1]
    return out


def parse_log_seaborn(log: str) -> dict[str, str]:
    """seaborn's pytest output: ``FAILED name`` FAILED; a line holding `` PASSED `` whose second
    field is ``PASSED`` (``name PASSED [ n%]``) has its first field PASSED; otherwise ``PASSED name``
    PASSED. Other statuses are not read; a bare ``FAILED`` / ``PASSED`` line is skipped."""
    out: dict[str, str] = {}
    for line in log.split("\n"):
        fields = line.split()
        if line.startswith(FAILED):
            if len(fields) > 1:
                out[fields[1]] = FAILED
        elif f" {PASSED} " in line:
            if len(fields) > 1 and fields[1] == PASSED:
                out[fields[0]] = PASSED
        elif line.startswith(PASSED) and len(fields) > 1:
            out[fields[1]] = PASSED
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


def _split(tests: tuple[str, ...], sm: dict[str, str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(succeeded, failed) of ``tests`` under ``sm``; a test in neither is not counted."""
    ok = tuple(t for t in tests if sm.get(t) in (PASSED, XFAIL))
    bad = tuple(t for t in tests if t not in sm or sm[t] in (FAILED, ERROR))
    return ok, bad


def _fraction(ok: tuple[str, ...], bad: tuple[str, ...]) -> float:
    return len(ok) / (len(ok) + len(bad)) if ok or bad else 1.0


def grade(instance: SWEBenchInstance, log: str) -> SWEGrade:
    """Grade an evaluation log of ``instance`` (rules in the module docstring)."""
    parser = repo_spec(instance.repo, instance.version).parser
    sm, ok = status_map(log, parser)
    if not ok:
        return SWEGrade("RESOLVED_NO", False, (), tuple(instance.fail_to_pass), (), tuple(instance.pass_to_pass))
    f2p_s, f2p_f = _split(tuple(instance.fail_to_pass), sm)
    p2p_s, p2p_f = _split(tuple(instance.pass_to_pass), sm)
    f2p, p2p = _fraction(f2p_s, f2p_f), _fraction(p2p_s, p2p_f)
    if f2p == 1 and p2p == 1:
        status = "RESOLVED_FULL"
    elif 0 < f2p < 1 and p2p == 1:
        status = "RESOLVED_PARTIAL"
    else:
        status = "RESOLVED_NO"
    return SWEGrade(status, True, f2p_s, f2p_f, p2p_s, p2p_f)
