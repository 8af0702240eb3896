"""SGLang's own ``ServerArgs`` parses the launch argv ``SglangServer.command()`` builds, for every
role x transfer backend, and its PD validation (``srt/arg_groups/pd_disaggregation_hook.py``)
accepts each combination PEARL launches (and refuses the one PEARL refuses up front)."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pearl.core.state import Role
from pearl.engines.base import EngineStartError, ServerSpec
from pearl.engines.sglang import ROLE_SWITCH_BACKENDS, SglangEngine, SglangServer, SglangSettings

from .sglang_env import ROOT

pytestmark = pytest.mark.sglang_contract

BACKENDS = ("mooncake", "nixl", "mori", "fake")
MODEL = str(ROOT / ".models" / "smollm2-135m")


@pytest.fixture
def quiet_root_logger() -> Iterator[None]:
    """``prepare_server_args`` replaces the root logger's handlers (``basicConfig(force=True)``)."""
    handlers, level = list(logging.root.handlers), logging.root.level
    yield
    logging.root.handlers[:] = handlers
    logging.root.setLevel(level)


def _server(role: Role, backend: str, devices: tuple[str, ...] = ("0", "1")) -> SglangServer:
    srv = SglangServer(spec=ServerSpec("w", devices, role, MODEL, 7), log_dir=Path("/nonexistent"),
                       start_timeout_s=1, weight_version=7,
                       settings=SglangSettings(transfer_backend=backend,  # type: ignore[arg-type]
                                               enable_pd_role_switch=True, deterministic_inference=True))
    srv.port, srv.bootstrap_port = 31000, 31001
    return srv


def _parse(sglang_modules: Any, argv: list[str]) -> Any:
    from sglang.srt.arg_groups.pd_disaggregation_hook import handle_pd_disaggregation

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = sglang_modules.server_args.prepare_server_args(argv)
        args._resolved_overrides = []  # what resolve_once starts from (the rest of it needs a GPU)
        handle_pd_disaggregation(args)
    return args


@pytest.mark.parametrize("role", list(Role), ids=lambda r: r.value)
@pytest.mark.parametrize("backend", BACKENDS)
def test_server_args_parse_our_argv(sglang_modules: Any, quiet_root_logger: None, role: Role, backend: str) -> None:
    srv = _server(role, backend)
    cmd = srv.command()
    assert cmd[1:3] == ["-m", "sglang.launch_server"]
    if role is Role.PREFILL and backend == "fake":
        with pytest.raises(AssertionError, match="does not support 'fake'"):
            _parse(sglang_modules, cmd[3:])
        return
    args = _parse(sglang_modules, cmd[3:])
    assert (args.model_path, args.host, args.port, args.tp_size) == (MODEL, "127.0.0.1", 31000, 2)
    assert (args.weight_version, args.mem_fraction_static) == ("7", 0.8)
    assert args.skip_server_warmup and args.enable_memory_saver and args.incremental_streaming_output
    assert args.enable_deterministic_inference
    assert args.disaggregation_mode == {Role.COLOCATED: "null", Role.PREFILL: "prefill", Role.DECODE: "decode"}[role]
    if role is not Role.COLOCATED:
        assert (args.disaggregation_transfer_backend, args.disaggregation_bootstrap_port) == (backend, 31001)
        assert args.enable_pd_role_switch == (backend in ROLE_SWITCH_BACKENDS)


async def test_prefill_on_the_fake_backend_is_refused_before_launch(tmp_path: Path) -> None:
    eng = SglangEngine(tmp_path, SglangSettings(transfer_backend="fake"))
    with pytest.raises(EngineStartError, match="does not support the 'fake' transfer backend"):
        await eng.launch(ServerSpec("p", ("0",), Role.PREFILL, MODEL))
    await eng.close()
