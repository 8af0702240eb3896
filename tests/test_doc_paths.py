"""Every file path a document names exists: README.md and docs/*.md are read for paths under the
repository's top folders (``pearl/...``, ``tests/...``, ``docs/...``, ...) and for the modules named
in docs/runtime.md's table, and each must be a file or folder of this checkout."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOPS = ("pearl", "envs", "tests", "benchmarks", "configs", "scripts", "docs")
PATH = re.compile(r"(?<![\w/.-])((?:{})/[\w./-]*[\w/])".format("|".join(TOPS)))
GLOB = re.compile(r"[*<>{}]")


def named_paths(text: str) -> set[str]:
    out = set()
    for m in PATH.finditer(text):
        p = m.group(1).rstrip("./")
        after = text[m.end():m.end() + 2]
        if GLOB.search(p) or GLOB.search(after):  # a pattern (``configs/swebench-*.yaml``), not a path
            continue
        out.add(p)
    return out


def test_every_path_a_doc_names_exists() -> None:
    missing = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for p in sorted(named_paths(doc.read_text())):
            if not (ROOT / p).exists():
                missing.append(f"{doc.relative_to(ROOT)}: {p}")
    assert not missing, "paths named in the docs that do not exist:\n" + "\n".join(missing)


def test_the_runtime_table_names_modules_that_exist() -> None:
    text = (ROOT / "docs" / "runtime.md").read_text()
    rows = re.findall(r"^\| `([\w./]+\.py)` \|", text, flags=re.M)
    assert rows, "docs/runtime.md has no module table"
    missing = [r for r in rows if not (ROOT / "pearl" / "runtime" / r).resolve().exists()]
    assert not missing, f"docs/runtime.md names modules that do not exist: {missing}"


def test_the_path_reader_finds_what_it_should() -> None:
    text = "see pearl/runtime/door.py and `docs/service.md`, not http://x/pearl/y, runs/pearl, tests/*.py or configs/swebench-*.yaml"
    assert named_paths(text) == {"pearl/runtime/door.py", "docs/service.md"}
