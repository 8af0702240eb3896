"""How one SGLang server is launched: ``SglangSettings`` (the engine-wide flags) and ``SglangServer``
(the child process of one worker: its ``python -m sglang.launch_server`` command line, environment,
ports and the role it serves). ``pearl.engines.sglang.SglangEngine`` drives these over HTTP.

The command line is pinned against SGLang's own argument parser in
``tests/contract/test_sglang_server_args.py``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Literal

from pearl.core.state import Role
from pearl.engines.child_server import ChildServer
from pearl.procutil import free_port

#: SGLang's ``/health`` handler waits up to ``SGLANG_HEALTH_CHECK_TIMEOUT`` (20 s) for its one-token
#: generation (``http_server.py``: ``HEALTH_CHECK_TIMEOUT``); a start-up poll gives it that and more
HEALTH_POLL_TIMEOUT_S = 25.0
MODE_OF_ROLE = {Role.COLOCATED: "null", Role.PREFILL: "prefill", Role.DECODE: "decode"}
#: transfer backends whose SGLang KV manager implements ``/pd_role_switch`` (``supports_role_switch``)
ROLE_SWITCH_BACKENDS = frozenset({"mooncake", "mori"})


@dataclass(frozen=True, slots=True)
class SglangSettings:
    python: str = sys.executable
    module: str = "sglang.launch_server"
    #: ``fake`` moves no KV and serves only decode servers (SGLang refuses a fake prefill server)
    transfer_backend: Literal["mooncake", "nixl", "mori", "fake"] = "nixl"
    mem_fraction_static: float = 0.8
    enable_memory_saver: bool = True
    #: ``--enable-weights-cpu-backup``: ``release_memory`` keeps the weights in host memory and
    #: ``resume_memory`` restores them; without it SGLang discards them (only buffers are kept) and
    #: the server reports ``NO_WEIGHTS`` until a load
    weights_cpu_backup: bool = True
    enable_pd_role_switch: bool = False
    #: a prefill -> decode switch captures decode CUDA graphs and SGLang wants their footprint (GB)
    #: measured on a matching decode server; None: switches to decode relaunch instead
    decode_cuda_graph_memory_gb: float | None = None
    #: ``--enable-deterministic-inference``: without it SGLang ignores ``sampling_seed``
    deterministic_inference: bool = False
    #: events carry only new tokens (``--incremental-streaming-output``); False: SGLang's cumulative
    incremental_streaming: bool = True
    start_timeout_s: float = 600.0
    request_timeout_s: float = 600.0
    #: a cross-node prefill half (``pd_prefill``) not taken by a decode server within this is aborted
    pd_prefill_timeout_s: float = 600.0
    extra_args: tuple[str, ...] = ()
    extra_env: tuple[tuple[str, str], ...] = ()


@dataclass(kw_only=True)
class SglangServer(ChildServer):
    settings: SglangSettings
    bootstrap_port: int = 0
    #: released without a CPU backup and not loaded since: the parameters hold no version
    weights_lost: bool = False
    #: the ids SGLang stops on besides ``stop_token_ids`` (``model_eos_ids``)
    eos_ids: frozenset[int] = frozenset()
    kind = "SGLang server"
    health_timeout_s = HEALTH_POLL_TIMEOUT_S

    @property
    def mode(self) -> str:
        return MODE_OF_ROLE[self.spec.role]

    def allocate_ports(self) -> None:
        super().allocate_ports()
        self.bootstrap_port = free_port(self.spec.host)

    def command(self) -> list[str]:
        s = self.settings
        cmd = [s.python, "-m", s.module, "--model-path", self.spec.weights, "--host", self.spec.host,
               "--port", str(self.port), "--tp-size", str(max(len(self.spec.devices), 1)),
               "--mem-fraction-static", str(s.mem_fraction_static), "--skip-server-warmup",
               "--weight-version", str(self.weight_version)]
        if s.enable_memory_saver:
            cmd.append("--enable-memory-saver")
            if s.weights_cpu_backup:
                cmd.append("--enable-weights-cpu-backup")
        if s.incremental_streaming:
            cmd.append("--incremental-streaming-output")
        if s.deterministic_inference:
            cmd.append("--enable-deterministic-inference")
        if self.mode != "null":
            cmd += ["--disaggregation-mode", self.mode, "--disaggregation-transfer-backend", s.transfer_backend,
                    "--disaggregation-bootstrap-port", str(self.bootstrap_port)]
            if s.enable_pd_role_switch and s.transfer_backend in ROLE_SWITCH_BACKENDS:
                cmd.append("--enable-pd-role-switch")
        return cmd + list(s.extra_args)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        gpus = [d for d in self.spec.devices if d.isdigit()]
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        env["PYTHONUNBUFFERED"] = "1"
        env.update(dict(self.settings.extra_env))
        return env
