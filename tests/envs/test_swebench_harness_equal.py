"""``envs/swebench`` against the ``swebench`` package itself (4.1.0: the old-format Lite rows).

For every repository and version of ``MAP_REPO_VERSION_TO_SPECS_PY``: the test command, the install
command and the evaluation pre-commands of ``repo_spec`` equal the package's spec; and for every
repository of ``MAP_REPO_TO_PARSER_PY`` our log parser gives the same status map as the package's
on a log mixing every format the parsers read (pytest ``-rA`` summaries with options and ANSI
colours, the verbose pytest and seaborn forms, Django's runner, sympy's ``bin/test``).

Where ours differs from the package the case is a strict ``xfail`` naming the difference (so the
list below is exactly what differs today, and a case that comes to agree fails until it is struck
off): the pytest-family parser also reads the verbose ``test STATUS`` form and ignores the
``SKIPPED [n]`` count lines and ``ERROR: name (class)`` headers, where the package keys ``[1]`` as
SKIPPED and ``name`` as ``ERROR:``; astropy <= 1.3 runs with ``-p no:nose`` (the package: without);
matplotlib <= 2.2 installs with ``pip install -e .`` (the package: ``setup.py build; setup.py
install``). The SWE-bench Lite rows (astropy >= 4.2, matplotlib >= 3.0) are not among them.

Skipped where ``swebench`` is not installed (it brings Docker, datasets and modal along; SWE-bench
stays optional): ``pip install --target DIR swebench==4.1.0`` and set ``PEARL_SWEBENCH_PATH=DIR``,
or install it into the environment.
"""

from __future__ import annotations

import os
import sys

import pytest

from envs.base import TaskError
from envs.swebench.grading import PARSERS
from envs.swebench.harness import repo_spec

if os.environ.get("PEARL_SWEBENCH_PATH"):
    sys.path.append(os.environ["PEARL_SWEBENCH_PATH"])  # appended: this environment's packages win
constants = pytest.importorskip("swebench.harness.constants.python")
parsers = pytest.importorskip("swebench.harness.log_parsers.python")

OURS_UNSUPPORTED = {"dbt-labs/dbt-core", "swe-bench/humaneval"}  # not SWE-bench (Lite) Python repositories

ESC = "\x1b"
LOG = "\n".join([
    "PASSED tests/test_a.py::test_one",
    "FAILED tests/test_a.py::test_two - AssertionError: 1 != 2",
    "SKIPPED [1] tests/test_a.py:10: needs network",
    "ERROR tests/test_b.py::test_setup",
    "XFAIL tests/test_b.py::test_known - reason",
    "PASSED tests/test_c.py::test_param[/tmp/abc/data.txt]",
    "PASSED tests/test_c.py::test_param[//net/share]",
    "FAILED tests/test_c.py::test_param[a-b]",
    f"{ESC}[32mPASSED{ESC}[0m tests/test_d.py::test_colour",
    "tests/test_e.py::test_verbose PASSED",
    "tests/test_e.py::test_verbose_fail FAILED",
    "tests/test_f.py::test_sea PASSED [ 50%]",
    "test_ok (admin_views.tests.AdminViewTests) ... ok",
    "test_skip (admin_views.tests.AdminViewTests) ... skipped 'no db'",
    "test_fail (admin_views.tests.AdminViewTests) ... FAIL",
    "test_err (admin_views.tests.AdminViewTests) ... ERROR",
    "FAIL: test_fail2 (admin_views.tests.AdminViewTests)",
    "ERROR: test_err2 (admin_views.tests.AdminViewTests)",
    "test_multiline (utils.tests.T) ... Some output",
    "ok",
    "test_sym_ok ok",
    "test_sym_fail F",
    "test_sym_err E",
    "________________ sympy/core/tests/test_basic.py:test_equality ________________",
    "test_matplotlib_ok PASSED",
    "PASSED lib/matplotlib/tests/test_axes.py::test_plot[png]",
])


SPEC_DIFFERS = {("astropy/astropy", v): "test_cmd: -p no:nose" for v in ("0.1", "0.2", "0.3", "0.4", "1.1", "1.2", "1.3")}
SPEC_DIFFERS |= {("matplotlib/matplotlib", v): "install: pip install -e . vs setup.py build + install"
                 for v in ("1.0", "1.1", "1.2", "1.3", "1.4", "1.5", "2.0", "2.1", "2.2")}
PARSER_DIFFERS = {"astropy/astropy", "marshmallow-code/marshmallow", "pallets/flask", "psf/requests",
                  "pvlib/pvlib-python", "pydata/xarray", "pydicom/pydicom", "pylint-dev/astroid",
                  "pylint-dev/pylint", "pytest-dev/pytest", "pyvista/pyvista", "scikit-learn/scikit-learn",
                  "sphinx-doc/sphinx", "sqlfluff/sqlfluff"}


def _versions() -> list[object]:
    out: list[object] = []
    for repo, by in sorted(constants.MAP_REPO_VERSION_TO_SPECS_PY.items()):
        for v in sorted(by):
            why = SPEC_DIFFERS.get((repo, v))
            out.append(pytest.param(repo, v, marks=pytest.mark.xfail(strict=True, reason=why)) if why else (repo, v))
    return out


def _repos() -> list[object]:
    why = "pytest-family parser: verbose form, SKIPPED [n] and ERROR: headers (module docstring)"
    return [pytest.param(r, marks=pytest.mark.xfail(strict=True, reason=why)) if r in PARSER_DIFFERS else r
            for r in sorted(parsers.MAP_REPO_TO_PARSER_PY)]


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


@pytest.mark.parametrize("repo", _repos())
def test_log_parser_equals_the_package(repo: str) -> None:
    by_version = constants.MAP_REPO_VERSION_TO_SPECS_PY[repo]
    ours = PARSERS[repo_spec(repo, sorted(by_version)[-1]).parser]
    theirs = parsers.MAP_REPO_TO_PARSER_PY[repo]
    expected = theirs(LOG, None)
    assert expected  # the log exercises this parser
    assert ours(LOG) == expected
