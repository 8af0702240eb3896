from __future__ import annotations

import pytest

from pearl.config import RunConfig, load_config
from pearl.core.profile import HardwareProfile, WorkloadProfile


@pytest.fixture(scope="session")
def cfg8b() -> RunConfig:
    return load_config("qwen3-8b-h200")


@pytest.fixture(scope="session")
def cfg30b() -> RunConfig:
    return load_config("qwen3-30b-a3b-h200")


@pytest.fixture(scope="session")
def prof8b(cfg8b: RunConfig) -> tuple[HardwareProfile, WorkloadProfile]:
    return HardwareProfile.from_specs(cfg8b.model, cfg8b.hardware, 1), WorkloadProfile.from_spec(cfg8b.workload)


@pytest.fixture(scope="session")
def prof30b(cfg30b: RunConfig) -> tuple[HardwareProfile, WorkloadProfile]:
    return HardwareProfile.from_specs(cfg30b.model, cfg30b.hardware, 1), WorkloadProfile.from_spec(cfg30b.workload)
