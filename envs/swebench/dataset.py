"""Loading SWE-bench instances from json / jsonl / parquet into frozen ``SWEBenchInstance`` s.

Accepted layouts (what the public SWE-bench dumps look like):

- ``.json``: a list of rows; or an object with the rows under ``rows`` (the Hugging Face
  datasets-server format, each ``{"row_idx": i, "row": {...}}``), ``instances`` or ``data``.
- ``.jsonl``: one row per line (blank lines skipped).
- ``.parquet``: needs ``pyarrow`` (``pip install pyarrow``); the error says so if it is missing.

Row fields: ``instance_id``, ``repo``, ``base_commit``, ``problem_statement``, ``test_patch``,
``version`` are required; ``patch`` (gold), ``hints_text``, ``environment_setup_commit``,
``created_at`` optional. ``FAIL_TO_PASS`` / ``PASS_TO_PASS`` may be JSON-encoded strings (the
original rows, as in SWE-bench_Lite-dev.json) or lists; both become tuples of test ids. Every error
names the file, the row (index and instance id) and the field.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envs.base import EnvUnavailableError, TaskError

REQUIRED = ("instance_id", "repo", "base_commit", "problem_statement", "test_patch", "version")


@dataclass(frozen=True, slots=True)
class SWEBenchInstance:
    instance_id: str
    repo: str
    base_commit: str
    version: str
    problem_statement: str
    test_patch: str
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    patch: str = ""
    hints_text: str = ""
    environment_setup_commit: str = ""
    created_at: str = ""

    @property
    def task_id(self) -> str:
        return self.instance_id


def _test_list(value: Any, field: str, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        if not value.strip():
            return ()
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise TaskError(f"{where}: {field} is a string but not JSON ({e.msg})") from None
    if hasattr(value, "tolist"):  # numpy arrays from pandas / pyarrow
        value = value.tolist()
    if not isinstance(value, list | tuple) or not all(isinstance(t, str) for t in value):
        raise TaskError(f"{where}: {field} must be a list of test ids (or a JSON string of one), "
                        f"got {type(value).__name__}")
    return tuple(value)


def parse_row(row: Mapping[str, Any], where: str = "row") -> SWEBenchInstance:
    """One dataset row -> ``SWEBenchInstance`` (``where`` names the row in errors)."""
    if not isinstance(row, Mapping):
        raise TaskError(f"{where}: a row must be an object, got {type(row).__name__}")
    iid = row.get("instance_id")
    if iid:
        where = f"{where} ({iid})"
    missing = [f for f in REQUIRED if not isinstance(row.get(f), str) or not row.get(f)]
    if missing:
        raise TaskError(f"{where}: missing or empty field(s) {', '.join(missing)}")

    def opt(name: str) -> str:
        v = row.get(name)
        return v if isinstance(v, str) else ""

    return SWEBenchInstance(
        instance_id=row["instance_id"], repo=row["repo"], base_commit=row["base_commit"],
        version=str(row["version"]), problem_statement=row["problem_statement"], test_patch=row["test_patch"],
        fail_to_pass=_test_list(row.get("FAIL_TO_PASS"), "FAIL_TO_PASS", where),
        pass_to_pass=_test_list(row.get("PASS_TO_PASS"), "PASS_TO_PASS", where),
        patch=opt("patch"), hints_text=opt("hints_text"),
        environment_setup_commit=opt("environment_setup_commit"), created_at=opt("created_at"),
    )


def _rows_from_json(data: Any, path: Path) -> list[Any]:
    if isinstance(data, list):
        return data
    if isinstance(data, dict):
        for key in ("rows", "instances", "data"):
            if isinstance(data.get(key), list):
                rows = data[key]
                return [r["row"] if isinstance(r, dict) and isinstance(r.get("row"), dict) else r for r in rows]
    raise TaskError(f"{path}: expected a JSON list of rows or an object with 'rows'/'instances'/'data', "
                    f"got {type(data).__name__}")


def _read_rows(path: Path) -> list[Any]:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq  # type: ignore[import-untyped]  # pyarrow ships no type information
        except ImportError:
            raise EnvUnavailableError(f"{path}: reading parquet needs pyarrow: pip install pyarrow "
                                      "(or convert the file to json/jsonl)") from None
        return list(pq.read_table(path).to_pylist())
    try:
        text = path.read_text()
    except OSError as e:
        raise EnvUnavailableError(f"cannot read SWE-bench dataset {path}: {e.strerror}") from None
    if suffix == ".jsonl":
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise TaskError(f"{path} line {n}: not JSON ({e.msg})") from None
        return rows
    if suffix == ".json":
        try:
            return _rows_from_json(json.loads(text), path)
        except json.JSONDecodeError as e:
            raise TaskError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
    raise TaskError(f"{path}: unknown dataset format {suffix!r}: use .json, .jsonl or .parquet")


def load_instances(path: str | Path, instance_ids: Iterable[str] | None = None,
                   limit: int | None = None) -> tuple[SWEBenchInstance, ...]:
    """Instances of the dataset at ``path``, in file order; optionally only ``instance_ids``."""
    path = Path(path)
    if not path.is_file():
        raise EnvUnavailableError(f"SWE-bench dataset {path} not found (set env.dataset to a json/jsonl/parquet file)")
    rows = _read_rows(path)
    out = [parse_row(r, f"{path.name} row {i}") for i, r in enumerate(rows)]
    seen: set[str] = set()
    for inst in out:
        if inst.instance_id in seen:
            raise TaskError(f"{path}: instance {inst.instance_id} appears twice")
        seen.add(inst.instance_id)
    if instance_ids is not None:
        wanted = list(instance_ids)
        unknown = [i for i in wanted if i not in seen]
        if unknown:
            raise TaskError(f"{path}: instance(s) {', '.join(unknown)} not in the dataset")
        keep = set(wanted)
        out = [i for i in out if i.instance_id in keep]
    if limit is not None:
        out = out[:limit]
    return tuple(out)
