"""SGLang's own ``ServerArgs`` parses the launch argv ``SglangServer.command()`` builds, for every
role x transfer backend, and its PD validation (``srt/arg_groups/pd_disaggregation_hook.py``)
accepts each combination PEARL launches and refuses the one PEARL refuses up front. SGLang runs in
its own process (``tests/contract/sglang_parse_args.py``), once for all combinations."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pearl.core.state import Role
from pearl.engines.base import EngineStartError, ServerSpec
from pearl.engines.sglang import ROLE_SWITCH_BACKENDS, SglangEngine, SglangServer, SglangSettings

from .sglang_env import ROOT, SGLANG_DIR, SGLANG_VERSION

pytestmark = pytest.mark.sglang_contract

BACKENDS = ("mooncake", "nixl", "mori", "fake")
MODEL = str(ROOT / ".models" / "smollm2-135m")
COMBOS = [(role, backend) for role in Role for backend in BACKENDS]


def _server(role: Role, backend: str) -> SglangServer:
    srv = SglangServer(spec=ServerSpec("w", ("0", "1"), role, MODEL, 7), log_dir=Path("/nonexistent"),
                       start_timeout_s=1, weight_version=7,
                       settings=SglangSettings(transfer_backend=backend,  # type: ignore[arg-type]
                                               enable_pd_role_switch=True, deterministic_inference=True))
    srv.port, srv.bootstrap_port = 31000, 31001
    return srv


@pytest.fixture(scope="module")
def parsed(sglang_installed: None) -> dict[tuple[Role, str], dict[str, Any]]:
    argvs = [_server(role, backend).command()[3:] for role, backend in COMBOS]
    proc = subprocess.run([sys.executable, "-m", "tests.contract.sglang_parse_args"], input=json.dumps(argvs),
                          capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(zip(COMBOS, json.loads(proc.stdout.strip().splitlines()[-1]), strict=True))


@pytest.mark.parametrize(("role", "backend"), COMBOS, ids=[f"{r.value}-{b}" for r, b in COMBOS])
def test_server_args_parse_our_argv(parsed: dict[tuple[Role, str], dict[str, Any]], role: Role,
                                    backend: str) -> None:
    assert _server(role, backend).command()[1:3] == ["-m", "sglang.launch_server"]
    args = parsed[(role, backend)]
    if role is Role.PREFILL and backend == "fake":
        assert args == {"error": "AssertionError: Prefill server does not support 'fake' as the transfer backend"}
        return
    assert args["sglang"] == SGLANG_VERSION
    assert (args["model_path"], args["host"], args["port"], args["tp_size"]) == (MODEL, "127.0.0.1", 31000, 2)
    assert (args["weight_version"], args["mem_fraction_static"]) == ("7", 0.8)
    assert args["skip_server_warmup"] and args["enable_memory_saver"] and args["incremental_streaming_output"]
    assert args["enable_deterministic_inference"]
    assert args["disaggregation_mode"] == {Role.COLOCATED: "null", Role.PREFILL: "prefill",
                                           Role.DECODE: "decode"}[role]
    if role is not Role.COLOCATED:
        assert (args["disaggregation_transfer_backend"], args["disaggregation_bootstrap_port"]) == (backend, 31001)
        assert args["enable_pd_role_switch"] == (backend in ROLE_SWITCH_BACKENDS)


async def test_prefill_on_the_fake_backend_is_refused_before_launch(tmp_path: Path) -> None:
    eng = SglangEngine(tmp_path, SglangSettings(transfer_backend="fake"))
    with pytest.raises(EngineStartError, match="does not support the 'fake' transfer backend"):
        await eng.launch(ServerSpec("p", ("0",), Role.PREFILL, MODEL))
    await eng.close()


def test_sglang_is_not_imported_into_the_test_process() -> None:
    """SGLang's code runs in child processes only: importing it here would install uvloop's policy
    and make ``find_spec("sglang")`` true for every later test."""
    assert "sglang" not in sys.modules and str(SGLANG_DIR) not in sys.path
