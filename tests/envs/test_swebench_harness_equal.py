"""``envs/swebench`` against the ``swebench`` package itself (4.1.0, the official SWE-bench harness).

For every repository and version of ``MAP_REPO_VERSION_TO_SPECS_PY``: the test command, the install
command and the evaluation pre-commands of ``repo_spec`` equal the package's spec. For every
repository of ``MAP_REPO_TO_PARSER_PY`` and every version of it, our log parser gives the same
status map as the package's on a log mixing every format the parsers read (pytest ``-rA``
summaries with options, ``SKIPPED [n]`` count lines and ANSI colours, the verbose pytest and
seaborn forms, Django's runner with its multi-line prints, sympy's ``bin/test``) and on the
recorded evaluation logs of ``tests/envs/data``. And ``grade`` resolves exactly as the package's
``get_logs_eval`` + ``get_eval_tests_report`` + ``get_resolution_status`` on gradable and
ungradable logs of Lite dev instances.

The package comes from ``.swebench`` in the repository root (``scripts/setup_swebench.sh``, run by
``make setup``: ``pip install --no-deps --target .swebench swebench==4.1.0``), or from the folder
``PEARL_SWEBENCH_PATH`` names; skipped when neither holds it. Without its dependencies (Docker,
datasets, modal, ...) the package's ``__init__`` files cannot run, so ``_load_harness`` executes
only the pure modules: ``harness/constants`` (standard library only) and the files
``harness/log_parsers/python.py`` and ``harness/grading.py``, with two stand-ins for what those
files import and the Python grading never uses: ``TestSpec`` (an annotation only; ``get_logs_eval``
reads ``.repo`` and ``.version`` from what it is given) and ``MAP_REPO_TO_PARSER`` (the Python
repositories' map, the only one graded here).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import re
import sys
import types
from pathlib import Path

import pytest

from envs.base import TaskError
from envs.swebench import SWEBenchInstance, grade, load_instances
from envs.swebench.grading import PARSERS, status_map
from envs.swebench.harness import (
    APPLY_PATCH_FAIL,
    APPLY_PATCH_PASS,
    END_TEST_OUTPUT,
    RESET_FAILED,
    START_TEST_OUTPUT,
    TESTS_ERROR,
    TESTS_TIMEOUT,
    repo_spec,
)
from tests.conftest import LITE_DEV, missing_setup
from tests.envs.swebench_logs import DATA

SWEBENCH_VERSION = "4.1.0"
ROOT = Path(os.environ.get("PEARL_SWEBENCH_PATH") or Path(__file__).resolve().parents[2] / ".swebench")
HARNESS = ROOT / "swebench" / "harness"
if not (HARNESS / "log_parsers" / "python.py").is_file():
    missing_setup(f"swebench {SWEBENCH_VERSION} is not in {ROOT}: run `bash scripts/setup_swebench.sh` "
                  "(make setup does) or set PEARL_SWEBENCH_PATH to a folder holding it", allow_module_level=True)


def _exec_file(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _load_harness() -> tuple[types.ModuleType, types.ModuleType, types.ModuleType]:
    """(constants, log_parsers.python, grading) of the package in ``ROOT`` (module docstring).

    ``sys.modules`` is restored afterwards: nothing else in the process sees these modules.
    """
    saved = {k: v for k, v in sys.modules.items() if k == "swebench" or k.startswith("swebench.")}
    for k in saved:
        del sys.modules[k]
    try:
        for name, path in (("swebench", ROOT / "swebench"), ("swebench.harness", HARNESS)):
            package = types.ModuleType(name)
            package.__path__ = [str(path)]
            sys.modules[name] = package
        constants = importlib.import_module("swebench.harness.constants")
        test_spec = types.ModuleType("swebench.harness.test_spec.test_spec")
        test_spec.TestSpec = object  # type: ignore[attr-defined]
        sys.modules["swebench.harness.test_spec"] = types.ModuleType("swebench.harness.test_spec")
        sys.modules["swebench.harness.test_spec.test_spec"] = test_spec
        parsers = _exec_file("swebench.harness.log_parsers.python", HARNESS / "log_parsers" / "python.py")
        log_parsers = types.ModuleType("swebench.harness.log_parsers")
        log_parsers.MAP_REPO_TO_PARSER = parsers.MAP_REPO_TO_PARSER_PY  # type: ignore[attr-defined]
        sys.modules["swebench.harness.log_parsers"] = log_parsers
        grading = _exec_file("swebench.harness.grading", HARNESS / "grading.py")
    finally:
        for k in [k for k in sys.modules if k == "swebench" or k.startswith("swebench.")]:
            del sys.modules[k]
        sys.modules.update(saved)
    return constants, parsers, grading


constants, parsers, grading = _load_harness()
OURS_UNSUPPORTED = {"dbt-labs/dbt-core", "swe-bench/humaneval"}  # not SWE-bench (Lite) Python repositories

ESC = "\x1b"
LOG = "\n".join([
    "PASSED tests/test_a.py::test_one",
    "FAILED tests/test_a.py::test_two - AssertionError: 1 != 2",
    "SKIPPED [1] tests/test_a.py:10: needs network",
    "SKIPPED [3] tests/test_a.py:12: no numpy",
    "SKIPPED tests/test_a.py::test_skip",
    "ERROR tests/test_b.py::test_setup",
    "ERROR tests/test_b.py::test_err - RuntimeError",
    "XFAIL tests/test_b.py::test_known - reason",
    "PASSED tests/test_c.py::test_param[/tmp/abc/data.txt]",
    "PASSED tests/test_c.py::test_param[//net/share]",
    "PASSED tests/test_c.py::test_param[/tmp/*.txt]",
    "FAILED tests/test_c.py::test_param[a-b]",
    "PASSED lib/matplotlib/tests/test_backend.py::test_click[MouseButton.LEFT]",
    "PASSED lib/matplotlib/tests/test_backend.py::test_click[MouseButton.RIGHT]",
    f"{ESC}[32mPASSED{ESC}[0m tests/test_d.py::test_colour",
    f"{ESC}[31mFAILED{ESC}[0m tests/test_d.py::test_colour_fail - boom",
    "tests/test_e.py::test_verbose PASSED",
    "tests/test_e.py::test_verbose_fail FAILED",
    "tests/test_e.py::test_verbose_skip SKIPPED",
    "tests/test_e.py::test_verbose_xfail XFAIL",
    "tests/test_f.py::test_sea PASSED [ 50%]",
    "tests/test_f.py::test_sea_fail FAILED [ 75%]",
    "test_ok (admin_views.tests.AdminViewTests) ... ok",
    "test_OK (admin_views.tests.AdminViewTests) ... OK",
    "test_skip (admin_views.tests.AdminViewTests) ... skipped 'no db'",
    "test_fail (admin_views.tests.AdminViewTests) ... FAIL",
    "test_err (admin_views.tests.AdminViewTests) ... ERROR",
    "FAIL: test_fail2 (admin_views.tests.AdminViewTests)",
    "ERROR: test_err2 (admin_views.tests.AdminViewTests)",
    "test_multiline (utils.tests.T) ... Some output",
    "ok",
    "test_version (admin_scripts.tests.CommandTypes)",
    "--version is equivalent to version ... ok",
    "Applying sites.0002_alter_domain_unique...test_no_migrations (migrations.tests.M) ... ok",
    "test_server (view_tests.tests.V) ... Internal Server Error: /raises/",
    "ok",
    "test_checks (check_framework.tests.C) ... System check identified no issues (0 silenced)",
    "ok",
    "test_against (runner.tests.R) ... Testing against Django installed in '/testbed/django'",
    "System check identified no issues (0 silenced).",
    "ok",
    "test_sym_ok ok",
    "test_sym_fail F",
    "test_sym_err E",
    "________________ sympy/core/tests/test_basic.py:test_equality ________________",
    "test_matplotlib_ok PASSED",
    "PASSED lib/matplotlib/tests/test_axes.py::test_plot[png]",
])
RECORDED = sorted(DATA.glob("*.log"))


def test_the_package_is_the_pinned_version() -> None:
    text = (ROOT / "swebench" / "__init__.py").read_text()
    assert re.search(r'^__version__ = "(.*)"', text, re.M).group(1) == SWEBENCH_VERSION  # type: ignore[union-attr]


def _versions() -> list[tuple[str, str]]:
    return [(r, v) for r, by in sorted(constants.MAP_REPO_VERSION_TO_SPECS_PY.items()) for v in sorted(by)]


@pytest.mark.parametrize(("repo", "version"), _versions())
def test_repo_spec_equals_the_package(repo: str, version: str) -> None:
    theirs = constants.MAP_REPO_VERSION_TO_SPECS_PY[repo][version]
    if repo in OURS_UNSUPPORTED:
        with pytest.raises(TaskError, match="no SWE-bench harness spec"):
            repo_spec(repo, version)
        return
    ours = repo_spec(repo, version)
    assert ours.test_cmd == theirs["test_cmd"]
    assert ours.install == theirs.get("install")
    assert list(ours.eval_commands) == list(theirs.get("eval_commands", []))


@pytest.mark.parametrize("repo", sorted(parsers.MAP_REPO_TO_PARSER_PY))
def test_log_parser_equals_the_package(repo: str) -> None:
    theirs = parsers.MAP_REPO_TO_PARSER_PY[repo]
    expected = theirs(LOG, None)
    assert expected  # the log exercises this parser
    recorded = [(p.name, p.read_text()) for p in RECORDED]
    for version in sorted(constants.MAP_REPO_VERSION_TO_SPECS_PY[repo]):
        ours = PARSERS[repo_spec(repo, version).parser]
        assert ours(LOG) == expected, version
        for name, log in recorded:
            assert ours(log) == theirs(log, None), (version, name)


def _cases(inst: SWEBenchInstance) -> list[str]:
    """Evaluation logs of ``inst`` covering every grading outcome: resolved, partial, P2P broken,
    skipped or errored gold tests, no markers, failure codes, results only outside the markers."""
    f2p, p2p = list(inst.fail_to_pass), list(inst.pass_to_pass)
    body = [f"PASSED {t}" for t in f2p + p2p]

    def wrap(lines: list[str]) -> str:
        return f"{APPLY_PATCH_PASS}\n{START_TEST_OUTPUT}\n" + "\n".join(lines) + f"\n{END_TEST_OUTPUT}\n"

    out = [wrap(body), wrap(body[1:]), wrap([f"FAILED {f2p[0]} - boom", *body[1:]]),
           wrap([f"SKIPPED {f2p[0]}", *body[1:]]), wrap([f"ERROR {f2p[0]}", *body[1:]]),
           wrap([f"XFAIL {f2p[0]}", *body[1:]]), wrap([f"SKIPPED {t}" for t in f2p]),
           wrap([f"ERROR: {f2p[0]}", *body[1:]]), "\n".join(body),
           f"{START_TEST_OUTPUT}\n{END_TEST_OUTPUT}\n" + "\n".join(body)]
    if p2p:
        out += [wrap([*body[:-1], f"FAILED {p2p[-1]}"]), wrap([*body[:-1], f"SKIPPED {p2p[-1]}"])]
    out += [code + "\n" + wrap(body) for code in (APPLY_PATCH_FAIL, RESET_FAILED, TESTS_ERROR, TESTS_TIMEOUT)]
    return out


def _package_resolution(inst: SWEBenchInstance, log: str, path: Path) -> tuple[str, bool]:
    path.write_text(log)
    spec = types.SimpleNamespace(repo=inst.repo, version=inst.version)
    sm, found = grading.get_logs_eval(spec, str(path))
    if not found:
        return "RESOLVED_NO", False
    report = grading.get_eval_tests_report(
        sm, {"FAIL_TO_PASS": list(inst.fail_to_pass), "PASS_TO_PASS": list(inst.pass_to_pass)})
    return grading.get_resolution_status(report), True


def test_grade_equals_the_package(tmp_path: Path) -> None:
    insts = load_instances(LITE_DEV)
    assert {i.repo for i in insts} >= {"sqlfluff/sqlfluff", "pydicom/pydicom", "marshmallow-code/marshmallow"}
    checked = set()
    for inst in insts:
        for i, log in enumerate(_cases(inst)):
            ours = grade(inst, log)
            assert (ours.status, ours.patch_applied) == _package_resolution(inst, log, tmp_path / "log"), (
                inst.instance_id, i)
            checked.add(ours.status)
        for p in RECORDED:
            ours = grade(inst, p.read_text())
            assert (ours.status, ours.patch_applied) == _package_resolution(inst, p.read_text(), tmp_path / "log")
    assert checked == {"RESOLVED_FULL", "RESOLVED_PARTIAL", "RESOLVED_NO"}


def test_status_map_equals_the_package(tmp_path: Path) -> None:
    inst = dataclasses.replace(load_instances(LITE_DEV)[0], repo="django/django", version="3.0")
    for log in (f"{START_TEST_OUTPUT}\n{LOG}\n{END_TEST_OUTPUT}\n", LOG, f"{TESTS_TIMEOUT}\n{START_TEST_OUTPUT}\n"
                f"{LOG}\n{END_TEST_OUTPUT}\n", f"{START_TEST_OUTPUT}\n{END_TEST_OUTPUT}\n{LOG}"):
        (tmp_path / "log").write_text(log)
        theirs = grading.get_logs_eval(types.SimpleNamespace(repo=inst.repo, version=inst.version),
                                       str(tmp_path / "log"))
        assert status_map(log, repo_spec(inst.repo, inst.version).parser) == theirs


@pytest.mark.parametrize(("repo", "log", "expected"), [
    ("mwaskom/seaborn", "FAILED\nPASSED a.py::t\n", {"a.py::t": "PASSED"}),
    ("mwaskom/seaborn", "PASSED\nFAILED a.py::t\n", {"a.py::t": "FAILED"}),
    ("django/django", "FAIL:\ntest_a (m.T) ... ok\n", {"test_a (m.T)": "PASSED"}),
    ("django/django", "ERROR:\ntest_a (m.T) ... FAIL\n", {"test_a (m.T)": "FAILED"}),
])
def test_a_line_the_package_raises_on_is_skipped(repo: str, log: str, expected: dict[str, str]) -> None:
    with pytest.raises(IndexError):
        parsers.MAP_REPO_TO_PARSER_PY[repo](log, None)
    assert PARSERS[repo_spec(repo, "3.0" if repo == "django/django" else "0.12").parser](log) == expected
