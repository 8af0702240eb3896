"""Record SWE-bench-style evaluation logs here, without Docker: real bash, real ``pytest -rA``.

For an instance, ``record_log`` writes one test module per test file named in FAIL_TO_PASS /
PASS_TO_PASS (functions, ``Class::method`` and ``name[param]`` parametrisations with the same
ids), each test passing or failing as asked, then runs a script with the eval script's shape
(``set -uxo pipefail``, the ``: '>>>>> Start Test Output'`` markers traced by ``-x``, the test
command ``pytest -rA <files>``) and returns its combined output: the same log the harness grades.

``python tests/envs/swebench_logs.py OUT_DIR`` re-records the fixture logs in ``tests/envs/data``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from envs.swebench.dataset import SWEBenchInstance
from envs.swebench.harness import END_TEST_OUTPUT, START_TEST_OUTPUT

DATA = Path(__file__).resolve().parent / "data"


def _module_source(tests: list[tuple[str, bool]]) -> str:
    """Source of a test module holding ``tests`` ((name within the file, passes?))."""
    funcs: dict[tuple[str | None, str], list[tuple[str | None, bool]]] = defaultdict(list)
    for name, ok in tests:
        cls, _, func = name.rpartition("::")
        m = re.fullmatch(r"(\w+)\[(.*)\]", func)
        base, param = (m.group(1), m.group(2)) if m else (func, None)
        if m is None and "[" in func:  # the harness cut an id that had a space: "name[select a b]" -> "name[select"
            base, param = func.split("[", 1)[0], func.split("[", 1)[1] + " (rest of the id)"
        funcs[(cls or None, base)].append((param, ok))
    lines = ["import pytest", ""]
    by_class: dict[str | None, list[str]] = defaultdict(list)
    for (cls, base), cases in funcs.items():
        indent = "    " if cls else ""
        self_arg = "self, " if cls else ""
        body: list[str] = []
        if cases[0][0] is None:
            ok = cases[0][1]
            body += [f"{indent}def {base}({self_arg.rstrip(', ')}):", f"{indent}    assert {ok}"]
        else:
            ids = [p for p, _ in cases]
            oks = [ok for _, ok in cases]
            body += [f"{indent}@pytest.mark.parametrize('ok', {oks!r}, ids={ids!r})",
                     f"{indent}def {base}({self_arg}ok):", f"{indent}    assert ok"]
        by_class[cls].extend([*body, ""])
    for cls, body in by_class.items():
        if cls:
            lines.append(f"class {cls}:")
        lines.extend(body)
    return "\n".join(lines) + "\n"


def record_log(instance: SWEBenchInstance, workdir: Path, failing: set[str] = frozenset()) -> str:  # type: ignore[assignment]
    """The eval log of ``instance`` where every F2P/P2P test passes except those in ``failing``."""
    files: dict[str, list[tuple[str, bool]]] = defaultdict(list)
    for test in (*instance.fail_to_pass, *instance.pass_to_pass):
        path, _, name = test.partition("::")
        files[path].append((name, test not in failing))
    for path, tests in files.items():
        target = workdir / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(_module_source(tests))
    script = "\n".join([
        "set -uxo pipefail", f"cd {workdir}", "git status 2>/dev/null || true",
        f": '{START_TEST_OUTPUT}'",
        f"{sys.executable} -m pytest -rA -p no:cacheprovider {' '.join(sorted(files))}",
        f": '{END_TEST_OUTPUT}'",
    ])
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
           "PYTHONDONTWRITEBYTECODE": "1", "HOME": str(workdir)}
    res = subprocess.run(["bash", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=env, timeout=120, check=False)
    return res.stdout


if __name__ == "__main__":
    import tempfile

    from envs.swebench.dataset import load_instances

    src = Path(__file__).resolve().parents[2] / "envs/swebench/data/SWE-bench_Lite-dev.json"
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else DATA
    inst = {i.instance_id: i for i in load_instances(src)}["sqlfluff__sqlfluff-1625"]
    with tempfile.TemporaryDirectory() as d:
        (out / "sqlfluff__sqlfluff-1625.resolved.log").write_text(record_log(inst, Path(d) / "a"))
        failing = {inst.fail_to_pass[0], inst.pass_to_pass[3]}
        (out / "sqlfluff__sqlfluff-1625.unresolved.log").write_text(record_log(inst, Path(d) / "b", failing))
