"""SWE-bench: dataset loading (json / jsonl / parquet), prompts, harness conventions, Docker errors."""

from __future__ import annotations

import dataclasses
import json
import shutil
import stat
from pathlib import Path

import pytest

from envs.base import EnvUnavailableError, TaskError
from envs.sandbox import PathRefused
from envs.swebench import ImageNaming, SWEBenchConfig, SWEBenchEnv, SWEBenchInstance, load_instances
from envs.swebench.dataset import parse_row
from envs.swebench.docker import DockerCLI, DockerConfig
from envs.swebench.env import container_path
from envs.swebench.harness import (
    APPLY_PATCH_FAIL,
    END_TEST_OUTPUT,
    START_TEST_OUTPUT,
    apply_patch_script,
    build_test_command,
    eval_script,
    get_test_directives,
    modified_files,
    new_files,
    repo_spec,
)
from envs.swebench.prompt import build_prompt
from tests.conftest import LITE_DEV


@pytest.fixture(scope="module")
def raw_rows() -> list[dict]:
    return json.loads(LITE_DEV.read_text())


def test_lite_dev_json_old_row_format(raw_rows: list[dict]) -> None:
    assert isinstance(raw_rows[0]["FAIL_TO_PASS"], str)  # the old format: JSON-encoded strings
    insts = load_instances(LITE_DEV)
    assert len(insts) == len(raw_rows) == 23
    first = insts[0]
    assert first.instance_id == "sqlfluff__sqlfluff-1625" and first.task_id == first.instance_id
    assert first.fail_to_pass == ("test/cli/commands_test.py::test__cli__command_directed",)
    assert len(first.pass_to_pass) == 64 and first.version == "0.6"
    assert first.patch.startswith("diff --git") and first.environment_setup_commit
    assert {i.repo for i in insts} == {"marshmallow-code/marshmallow", "pvlib/pvlib-python", "pydicom/pydicom",
                                       "pylint-dev/astroid", "pyvista/pyvista", "sqlfluff/sqlfluff"}
    sub = load_instances(LITE_DEV, ["pydicom__pydicom-901", "sqlfluff__sqlfluff-1625"])
    assert [i.instance_id for i in sub] == ["sqlfluff__sqlfluff-1625", "pydicom__pydicom-901"]  # file order
    assert sub[1].pass_to_pass == ()


def test_jsonl_parquet_and_rows_layouts_load_the_same(raw_rows: list[dict], tmp_path: Path) -> None:
    rows = raw_rows[:5]
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    (tmp_path / "rows.json").write_text(json.dumps({"rows": [{"row_idx": i, "row": r} for i, r in enumerate(rows)]}))
    # the newer layout: test lists as real lists
    listed = [dict(r, FAIL_TO_PASS=json.loads(r["FAIL_TO_PASS"]), PASS_TO_PASS=json.loads(r["PASS_TO_PASS"]))
              for r in rows]
    (tmp_path / "listed.json").write_text(json.dumps(listed))
    ref = load_instances(LITE_DEV, limit=5)
    for name in ("d.jsonl", "rows.json", "listed.json"):
        assert load_instances(tmp_path / name) == ref, name
    pa = pytest.importorskip("pyarrow", reason="parquet loading needs pyarrow (pip install pyarrow)")
    import pyarrow.parquet as pq

    keep = ["instance_id", "repo", "base_commit", "problem_statement", "test_patch", "version", "patch",
            "hints_text", "environment_setup_commit", "created_at", "FAIL_TO_PASS", "PASS_TO_PASS"]
    pq.write_table(pa.Table.from_pylist([{k: r[k] for k in keep} for r in rows]), tmp_path / "d.parquet")
    assert load_instances(tmp_path / "d.parquet") == ref
    pq.write_table(pa.Table.from_pylist([{k: r[k] for k in keep} for r in listed]), tmp_path / "l.parquet")
    assert load_instances(tmp_path / "l.parquet") == ref


def test_bad_rows_and_files_name_what_is_wrong(raw_rows: list[dict], tmp_path: Path) -> None:
    row = dict(raw_rows[0])
    del row["base_commit"]
    with pytest.raises(TaskError, match=r"row 3 \(sqlfluff__sqlfluff-1625\): missing or empty field\(s\) base_commit"):
        parse_row(row, "row 3")
    with pytest.raises(TaskError, match="FAIL_TO_PASS is a string but not JSON"):
        parse_row(dict(raw_rows[0], FAIL_TO_PASS="[oops"))
    with pytest.raises(TaskError, match="must be a list of test ids"):
        parse_row(dict(raw_rows[0], PASS_TO_PASS=[1, 2]))
    (tmp_path / "x.jsonl").write_text(json.dumps(raw_rows[0]) + "\n{nope\n")
    with pytest.raises(TaskError, match=r"x.jsonl line 2: not JSON"):
        load_instances(tmp_path / "x.jsonl")
    (tmp_path / "dup.json").write_text(json.dumps([raw_rows[0], raw_rows[0]]))
    with pytest.raises(TaskError, match="appears twice"):
        load_instances(tmp_path / "dup.json")
    (tmp_path / "d.csv").write_text("a,b")
    with pytest.raises(TaskError, match=r"unknown dataset format '\.csv'"):
        load_instances(tmp_path / "d.csv")
    with pytest.raises(EnvUnavailableError, match="not found"):
        load_instances(tmp_path / "missing.json")
    with pytest.raises(TaskError, match="not in the dataset"):
        load_instances(LITE_DEV, ["django__django-1"])


def test_prompt_from_problem_statement() -> None:
    inst = load_instances(LITE_DEV, ["pydicom__pydicom-1139"])[0]
    p = build_prompt(inst)
    assert p.startswith("<uploaded_files>\n/testbed\n</uploaded_files>")
    assert f"<issue>\n{inst.problem_statement.strip()}\n</issue>" in p
    assert "pydicom/pydicom" in p and inst.base_commit[:12] in p and "<hints>" not in p
    hinted = dataclasses.replace(inst, hints_text="look at valuerep")
    assert "<hints>\nlook at valuerep\n</hints>" in build_prompt(hinted, include_hints=True)
    long = build_prompt(inst, max_issue_chars=50)
    assert "issue text cut at 50 characters" in long


def test_image_names_follow_the_harness() -> None:
    assert ImageNaming().image("sqlfluff__sqlfluff-1625") == "sweb.eval.x86_64.sqlfluff__sqlfluff-1625:latest"
    assert ImageNaming(namespace="swebench").image("pydicom__pydicom-1139") == \
        "swebench/sweb.eval.x86_64.pydicom_1776_pydicom-1139:latest"
    assert ImageNaming(prefix="sweb.eval.arm64.", tag="v2").image("A__B-1") == "sweb.eval.arm64.a__b-1:v2"


def test_eval_script_and_directives() -> None:
    insts = load_instances(LITE_DEV)
    for inst in insts:  # every dev instance has a spec and a script
        script = eval_script(inst)
        assert script.startswith("#!/bin/bash\nset -uxo pipefail\nsource /opt/miniconda3/bin/activate\n")
        assert f": '{START_TEST_OUTPUT}'\n{build_test_command(inst)}\n: '{END_TEST_OUTPUT}'" in script
        assert inst.test_patch in script
    inst = next(i for i in insts if i.instance_id == "sqlfluff__sqlfluff-1625")
    assert get_test_directives(inst) == ["test/cli/commands_test.py"]
    assert build_test_command(inst) == "pytest -rA test/cli/commands_test.py"
    assert f"git checkout {inst.base_commit} test/cli/commands_test.py" in eval_script(inst)
    pv = next(i for i in insts if i.repo == "pvlib/pvlib-python")
    assert "python -m pip install -e .[all]" in eval_script(pv)
    patch = ("diff --git a/t/x_test.py b/t/x_test.py\n--- a/t/x_test.py\n+++ b/t/x_test.py\n@@ -1 +1 @@\n-a\n+b\n"
             "diff --git a/t/new_test.py b/t/new_test.py\nnew file mode 100644\n--- /dev/null\n+++ b/t/new_test.py\n"
             "diff --git a/t/data.json b/t/data.json\n--- a/t/data.json\n+++ b/t/data.json\n")
    assert modified_files(patch) == ["t/x_test.py", "t/data.json"] and new_files(patch) == ["t/new_test.py"]
    dj_patch = ("diff --git a/tests/admin_views/test_forms.py b/tests/admin_views/test_forms.py\n"
                "diff --git a/tests/admin_views/models.py b/tests/admin_views/models.py\n"
                "diff --git a/docs/ref.txt b/docs/ref.txt\n")
    django = SWEBenchInstance("django__django-1", "django/django", "abc", "3.0", "p", dj_patch, (), ())
    assert get_test_directives(django) == ["admin_views.test_forms"]  # models.py is not a test file
    assert repo_spec("django/django", "1.9").test_cmd == "./tests/runtests.py --verbosity 2"
    with pytest.raises(TaskError, match="has no SWE-bench harness spec"):
        repo_spec("octo/cat", "1.0")
    assert "git apply --verbose /tmp/patch.diff || git apply --verbose --reject" in apply_patch_script()
    assert APPLY_PATCH_FAIL in apply_patch_script()


def test_container_paths_stay_in_testbed() -> None:
    assert container_path("src/a.py") == "/testbed/src/a.py"
    assert container_path("/testbed/src/../b.py") == "/testbed/b.py"
    assert container_path(".") == "/testbed"
    for bad in ("../etc/passwd", "/etc/passwd", "src/../../x", ""):
        with pytest.raises(PathRefused):
            container_path(bad)


# ------------------------------------------------------------------------------------- Docker
async def test_missing_docker_cli_is_explained() -> None:
    inst = load_instances(LITE_DEV, limit=1)[0]
    env = SWEBenchEnv(docker=DockerCLI(DockerConfig(binary="pearl-no-such-docker")))
    with pytest.raises(EnvUnavailableError, match="Docker CLI 'pearl-no-such-docker' is not on PATH"):
        await env.reset(inst)
    await env.close()


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker CLI on this machine")
async def test_unreachable_engine_is_explained(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real CLI against an engine that is not there (this machine runs no Docker daemon)."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-daemon.sock")
    env = SWEBenchEnv(docker=DockerCLI(DockerConfig(control_timeout_s=30)))
    with pytest.raises(EnvUnavailableError, match=r"no Docker engine is reachable .*start the Docker daemon"):
        await env.reset(load_instances(LITE_DEV, limit=1)[0])


async def test_missing_image_is_explained(tmp_path: Path) -> None:
    """A stand-in CLI whose engine answers but holds no images (the real one needs a daemon)."""
    fake = tmp_path / "docker"
    fake.write_text('#!/bin/sh\ncase "$1" in version) echo 27.0.1;; image) echo "No such image: $5" >&2; '
                    'exit 1;; *) exit 2;; esac\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    inst = load_instances(LITE_DEV, limit=1)[0]
    env = SWEBenchEnv(SWEBenchConfig(images=ImageNaming(namespace="swebench")),
                      DockerCLI(DockerConfig(binary=str(fake))))
    with pytest.raises(EnvUnavailableError) as err:
        await env.reset(inst)
    msg = str(err.value)
    assert "swebench/sweb.eval.x86_64.sqlfluff_1776_sqlfluff-1625:latest" in msg and "not present locally" in msg
    assert "prepare_images --instance_ids sqlfluff__sqlfluff-1625" in msg
