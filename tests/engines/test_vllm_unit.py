"""VllmEngine pieces that need no vLLM server: launch flags, errors, and the gloo wire protocol."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from pearl.core.state import Role
from pearl.engines.base import EngineError, EngineStartError, GenerateRequest, SamplingParams, ServerSpec
from pearl.engines.vllm import VllmEngine, kv_role_for
from pearl.engines.vllm_broadcast import GlooBroadcaster, bucketize
from pearl.engines.vllm_server import VllmServer, VllmSettings, omp_bind
from pearl.engines.vllm_worker_ext import PearlWorkerExtension


def test_kv_roles_and_thread_binding() -> None:
    assert kv_role_for(Role.COLOCATED, "per_role") is None
    assert kv_role_for(Role.PREFILL, "per_role") == "kv_producer"
    assert kv_role_for(Role.DECODE, "per_role") == "kv_consumer"
    assert kv_role_for(Role.COLOCATED, "both") == "kv_both"
    assert omp_bind(("1",), 1) == "1" and omp_bind((), 1) == "auto" and omp_bind(("0", "1"), 2) == "0,1"


def test_server_command_and_env(tmp_path: Path) -> None:
    spec = ServerSpec("w0", ("1",), Role.PREFILL, "/models/m")
    srv = VllmServer(spec=spec, log_dir=tmp_path, settings=VllmSettings(kv_cache_gib=1.6), kv_role="kv_producer")
    srv.allocate_ports()
    cmd = srv.command()
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    kv = json.loads(cmd[cmd.index("--kv-transfer-config") + 1])
    assert kv == {"kv_connector": "NixlConnector", "kv_role": "kv_producer", "kv_buffer_device": "cpu"}
    env = srv.env()
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2" and env["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and int(env["VLLM_NIXL_SIDE_CHANNEL_PORT"]) == srv.nixl_port
    coloc = VllmServer(spec=spec, log_dir=tmp_path, settings=VllmSettings(), kv_role=None)
    assert "--kv-transfer-config" not in coloc.command()


async def test_launch_failure_reports_exit_code_and_log(tmp_path: Path) -> None:
    fake_python = tmp_path / "python"
    fake_python.write_text("#!/bin/sh\necho 'RuntimeError: no CPU for you' >&2\nexit 3\n")
    fake_python.chmod(0o755)
    eng = VllmEngine(tmp_path, VllmSettings(python=str(fake_python), start_timeout_s=30))
    with pytest.raises(EngineStartError) as err:
        await eng.launch(ServerSpec("w0", ("0",), Role.COLOCATED, "/models/m"))
    assert err.value.exit_code == 3 and "no CPU for you" in err.value.log_tail
    assert not await eng.healthy("w0")
    await eng.close()


async def test_unknown_worker_is_a_clear_error(tmp_path: Path) -> None:
    eng = VllmEngine(tmp_path)
    with pytest.raises(EngineError, match="no server launched"):
        await eng.generate("ghost", GenerateRequest("r", (1, 2), SamplingParams(4)))
    await eng.close()


def test_gloo_broadcast_wire_protocol_roundtrip() -> None:
    """Trainer (rank 0) and a worker extension (rank 1) in two threads over a real gloo group."""
    gen = torch.Generator().manual_seed(0)
    state = {"a.weight": torch.randn(4, 3, generator=gen).to(torch.bfloat16),
             "b.bias": torch.randn(5, generator=gen),
             "c.weight": torch.randn(2, 2, generator=gen).to(torch.bfloat16)}
    layout, flats = bucketize(state)
    assert [d for d, _ in layout] == ["bfloat16", "float32"]
    received: dict[str, Any] = {}

    class Worker(PearlWorkerExtension):
        def reload_weights(self, weights_iterator: Any) -> None:
            received.update({k: v.clone() for k, v in weights_iterator})

    sender = GlooBroadcaster("127.0.0.1", world_size=2, timeout_s=30)
    worker = Worker()
    errors: list[BaseException] = []

    def run_worker() -> None:
        try:
            worker.pearl_join_group("127.0.0.1", sender.port, 1, 2, 30)
            worker.pearl_receive(json.loads(json.dumps(layout)))  # as it arrives over HTTP
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    t = threading.Thread(target=run_worker)
    t.start()
    sender.connect()
    sender.send(flats)
    t.join(30)
    sender.close()
    assert not errors and not t.is_alive()
    assert set(received) == set(state)
    for k, v in state.items():
        assert received[k].dtype == v.dtype and torch.equal(received[k], v)


def test_receive_before_join_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="join the broadcast group first"):
        PearlWorkerExtension().pearl_receive([["float32", [["w", [1]]]]])


def test_from_config_uses_engine_spec(tmp_path: Path) -> None:
    from pearl.config import EngineSpec

    eng = VllmEngine.from_config(EngineSpec(kind="vllm", max_model_len=512, kv_cache_gib=2.0), tmp_path)
    assert eng.settings.max_model_len == 512 and eng.settings.kv_cache_gib == 2.0


def test_lower_priority_renices_the_server_session() -> None:
    """A ready server's whole process group gets ``engine.nice``, and so does its autogroup (the
    session it leads): with autogroup scheduling, nice alone would not yield the cores."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from pearl.engines.child_server import lower_priority

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == os.getpriority(os.PRIO_PROCESS, 0) < 7
        lower_priority(child.pid, 7)
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == 7
        autogroup = Path(f"/proc/{child.pid}/autogroup")
        if autogroup.exists():
            assert autogroup.read_text().strip().endswith("nice 7")
        lower_priority(child.pid, 0)  # 0: leave it alone
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == 7
    finally:
        child.kill()
        child.wait()
