"""SWE-bench harness conventions: images, test commands, the eval script, patch application.

These follow the official ``swebench`` harness (``swebench/harness``: ``constants``,
``test_spec/test_spec.py``, ``test_spec/python.py``), restated here so that PEARL needs neither the
package nor network access to build an episode:

- Instance image: ``sweb.eval.<arch>.<instance_id lower-cased>:<tag>``; with a registry
  namespace (Docker Hub ``swebench``) it becomes ``<namespace>/sweb.eval...`` with ``__`` replaced
  by ``_1776_``. The repository is checked out at ``/testbed``, its conda env is ``testbed``.
- The model patch is written to ``/tmp/patch.diff`` and applied with, in turn, ``git apply
  --verbose``, ``git apply --verbose --reject``, ``patch --batch --fuzz=5 -p1 -i``; the log says
  ``>>>>> Applied Patch`` or ``>>>>> Patch Apply Failed``.
- The eval script (``set -uxo pipefail``) activates the env, runs the version's ``install``
  command, resets the test files the test patch touches to ``base_commit`` (new files are removed),
  applies the test patch, prints ``>>>>> Start Test Output``, runs ``test_cmd`` on the test
  directives (the files of the test patch, minus non-test extensions; Django: dotted module names),
  prints ``>>>>> End Test Output`` and resets the test files again.
- ``REPO_SPECS`` holds the test command, log parser and install command of the SWE-bench
  (Lite / Verified / dev) Python repositories, ``repo_spec`` their per-version rules; for every
  repository and version the test command, install command and evaluation pre-commands equal
  ``MAP_REPO_VERSION_TO_SPECS_PY`` of ``swebench`` 4.1.0 (tests/envs/test_swebench_harness_equal.py).
  A repository not listed is refused with a message.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

from envs.base import TaskError
from envs.swebench.dataset import SWEBenchInstance

START_TEST_OUTPUT = ">>>>> Start Test Output"
END_TEST_OUTPUT = ">>>>> End Test Output"
APPLY_PATCH_FAIL = ">>>>> Patch Apply Failed"
APPLY_PATCH_PASS = ">>>>> Applied Patch"
RESET_FAILED = ">>>>> Reset Failed"
TESTS_ERROR = ">>>>> Tests Errored"
TESTS_TIMEOUT = ">>>>> Tests Timed Out"
CONTAINER_PATCH_FILE = "/tmp/patch.diff"
REPO_DIR = "/testbed"
ENV_NAME = "testbed"
GIT_APPLY_CMDS = ("git apply --verbose", "git apply --verbose --reject", "patch --batch --fuzz=5 -p1 -i")
NON_TEST_EXTS = (".json", ".png", "csv", ".txt", ".md", ".jpg", ".jpeg", ".pkl", ".yml", ".yaml", ".toml")
_HEREDOC = "EOF_114329324912"

TEST_PYTEST = "pytest -rA"
TEST_ASTROPY_PYTEST = "pytest -rA -vv -o console_output_style=classic --tb=no"
TEST_DJANGO = "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1"
TEST_DJANGO_NO_PARALLEL = "./tests/runtests.py --verbosity 2"
TEST_SEABORN = "pytest --no-header -rA"
TEST_SPHINX = "tox --current-env -epy39 -v --"
TEST_SYMPY = "PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' bin/test -C --verbose"


@dataclass(frozen=True, slots=True)
class RepoSpec:
    test_cmd: str
    parser: str  # a key of envs.swebench.grading.PARSERS
    install: str | None = "python -m pip install -e ."
    eval_commands: tuple[str, ...] = ()


_DJANGO_LOCALE = ("export LANG=en_US.UTF-8", "export LC_ALL=en_US.UTF-8", "export PYTHONIOENCODING=utf8",
                  "export LANGUAGE=en_US:en")
REPO_SPECS: dict[str, RepoSpec] = {
    "astropy/astropy": RepoSpec(TEST_PYTEST, "pytest_v2", "python -m pip install -e .[test] --verbose"),
    "django/django": RepoSpec(TEST_DJANGO, "django"),
    "marshmallow-code/marshmallow": RepoSpec(TEST_PYTEST, "pytest", "python -m pip install -e '.[dev]'"),
    "matplotlib/matplotlib": RepoSpec(TEST_PYTEST, "matplotlib"),
    "mwaskom/seaborn": RepoSpec(TEST_SEABORN, "seaborn"),
    "pallets/flask": RepoSpec(TEST_PYTEST, "pytest"),
    "psf/requests": RepoSpec(TEST_PYTEST, "pytest_options", "python -m pip install ."),
    "pvlib/pvlib-python": RepoSpec(TEST_PYTEST, "pytest", "python -m pip install -e .[all]"),
    "pydata/xarray": RepoSpec(TEST_PYTEST, "pytest"),
    "pydicom/pydicom": RepoSpec(TEST_PYTEST, "pytest_options"),
    "pylint-dev/astroid": RepoSpec(TEST_PYTEST, "pytest"),
    "pylint-dev/pylint": RepoSpec(TEST_PYTEST, "pytest_options"),
    "pytest-dev/pytest": RepoSpec(TEST_PYTEST, "pytest"),
    "pyvista/pyvista": RepoSpec(TEST_PYTEST, "pytest"),
    "scikit-learn/scikit-learn": RepoSpec(
        TEST_PYTEST, "pytest_v2", "python -m pip install -v --no-use-pep517 --no-build-isolation -e ."),
    "sphinx-doc/sphinx": RepoSpec(TEST_SPHINX, "pytest_v2", "python -m pip install -e .[test]"),
    "sqlfluff/sqlfluff": RepoSpec(TEST_PYTEST, "pytest"),
    "sympy/sympy": RepoSpec(TEST_SYMPY, "sympy"),
}


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version))


def repo_spec(repo: str, version: str) -> RepoSpec:
    """The harness spec of ``repo`` at ``version`` (the version-specific rules of the harness)."""
    spec = REPO_SPECS.get(repo)
    if spec is None:
        raise TaskError(f"repository {repo!r} has no SWE-bench harness spec here; known: "
                        f"{', '.join(sorted(REPO_SPECS))} (add it to envs/swebench/harness.py REPO_SPECS)")
    v = _version_tuple(version)
    if repo == "django/django":
        cmd = TEST_DJANGO_NO_PARALLEL if version == "1.9" else TEST_DJANGO
        install = "python setup.py install" if v < (3, 0) else "python -m pip install -e ."
        extra = _DJANGO_LOCALE if (1, 7) <= v <= (2, 2) else (
            ("sed -i '/en_US.UTF-8/s/^# //g' /etc/locale.gen && locale-gen", *_DJANGO_LOCALE[:1],
             "export LANGUAGE=en_US:en", "export LC_ALL=en_US.UTF-8") if (3, 0) <= v <= (3, 2) else ())
        return RepoSpec(cmd, "django", install, extra)
    if repo == "astropy/astropy" and v and v <= (1, 3):
        return RepoSpec(TEST_ASTROPY_PYTEST, "pytest_v2", spec.install)
    if repo == "matplotlib/matplotlib" and v and v < (3, 0):
        return RepoSpec(spec.test_cmd, spec.parser, "python setup.py build; python setup.py install")
    if repo == "matplotlib/matplotlib" and v in ((3, 8), (3, 9)):
        return RepoSpec(spec.test_cmd, spec.parser, 'python -m pip install --no-build-isolation -e ".[dev]"')
    if repo == "mwaskom/seaborn" and v >= (0, 12):
        return RepoSpec(spec.test_cmd, spec.parser, "python -m pip install -e .[dev]")
    return spec


@dataclass(frozen=True, slots=True)
class ImageNaming:
    """How instance images are named: ``{namespace/}sweb.eval.{arch}.{id}:{tag}``."""

    prefix: str = "sweb.eval.x86_64."
    namespace: str | None = None
    tag: str = "latest"

    def image(self, instance_id: str) -> str:
        key = f"{self.prefix}{instance_id.lower()}:{self.tag}"
        if self.namespace:
            key = f"{self.namespace}/{key}".replace("__", "_1776_")
        return key


def _diff_files(patch: str) -> list[tuple[str, str]]:
    """(old path, new path) of every file in a unified diff (``/dev/null`` for a missing side)."""
    out = []
    old = None
    for line in patch.splitlines():
        if line.startswith("--- "):
            old = line[4:].split("\t")[0].strip()
        elif line.startswith("+++ ") and old is not None:
            new = line[4:].split("\t")[0].strip()
            out.append((old, new))
            old = None
    return out


def _strip_prefix(p: str) -> str:
    return p[2:] if p.startswith(("a/", "b/")) else p


def modified_files(patch: str) -> list[str]:
    """Files the patch changes that exist before it (``git checkout`` can reset them)."""
    return [_strip_prefix(a) for a, b in _diff_files(patch) if a != "/dev/null" and b != "/dev/null"]


def new_files(patch: str) -> list[str]:
    return [_strip_prefix(b) for a, b in _diff_files(patch) if a == "/dev/null"]


def get_test_directives(instance: SWEBenchInstance) -> list[str]:
    """The test files of the test patch (harness ``get_test_directives``)."""
    directives = re.findall(r"diff --git a/.* b/(.*)", instance.test_patch)
    directives = [d for d in directives if not any(d.endswith(ext) for ext in NON_TEST_EXTS)]
    if instance.repo == "django/django":
        out = []
        for d in directives:
            name = posixpath.basename(d)
            if not (name == "tests.py" or name.startswith("test_") or "/tests/" in d or "/test_" in d):
                continue
            d = d[: -len(".py")] if d.endswith(".py") else d
            d = d[len("tests/"):] if d.startswith("tests/") else d
            out.append(d.replace("/", "."))
        directives = out
    return directives


def build_test_command(instance: SWEBenchInstance, target: str | None = None) -> str:
    spec = repo_spec(instance.repo, instance.version)
    return " ".join([spec.test_cmd, *([target] if target else get_test_directives(instance))])


def activate_lines() -> list[str]:
    return ["source /opt/miniconda3/bin/activate", f"conda activate {ENV_NAME}", f"cd {REPO_DIR}"]


def eval_script(instance: SWEBenchInstance) -> str:
    """The bash eval script of the harness (``make_eval_script_list_py`` + ``TestSpec.eval_script``)."""
    spec = repo_spec(instance.repo, instance.version)
    base = instance.base_commit
    reset = []
    mod, new = modified_files(instance.test_patch), new_files(instance.test_patch)
    if mod:
        reset.append(f"git checkout {base} {' '.join(mod)}")
    if new:
        reset.append(f"rm -f {' '.join(new)}")
    lines = ["#!/bin/bash", "set -uxo pipefail", *activate_lines(), *spec.eval_commands,
             f"git config --global --add safe.directory {REPO_DIR}", f"cd {REPO_DIR}", "git status", "git show",
             f"git -c core.fileMode=false diff {base}", "source /opt/miniconda3/bin/activate",
             f"conda activate {ENV_NAME}"]
    if spec.install:
        lines.append(spec.install)
    lines += reset
    lines += [f"git apply -v - <<'{_HEREDOC}'\n{instance.test_patch}\n{_HEREDOC}", f": '{START_TEST_OUTPUT}'",
              build_test_command(instance), f": '{END_TEST_OUTPUT}'", *reset]
    return "\n".join(lines) + "\n"


def apply_patch_script(patch_file: str = CONTAINER_PATCH_FILE) -> str:
    """Try each apply command in turn in ``/testbed``; print the harness's pass / fail marker."""
    tries = " || ".join(f"{cmd} {patch_file}" for cmd in GIT_APPLY_CMDS)
    return (f"cd {REPO_DIR} && ( {tries} ) && echo '{APPLY_PATCH_PASS}' "
            f"|| {{ echo '{APPLY_PATCH_FAIL}'; exit 1; }}")
