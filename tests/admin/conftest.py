"""Fixtures for the admin API tests: a real ``StateControlPlane`` over a small cluster table, a
manual clock, and the real app served in-process by aiohttp's test server (a loopback socket)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from pearl.admin.app import AdminApp
from pearl.admin.local import StateControlPlane
from pearl.config import AdminSpec
from pearl.core.state import ClusterState, Gpu, Role, Worker, WorkerStatus, Zone

TOKEN = "t0ken-for-tests-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
async def procs() -> AsyncIterator[list[Any]]:
    """Service processes a test spawned (``test_service.Proc``, appended by the test): killed at
    teardown, whatever the test's outcome."""
    started: list[Any] = []
    yield started
    for p in started:
        await p.kill()


class ManualClock:
    """Time that moves only when a test says so."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def small_cluster() -> ClusterState:
    gpus = [
        Gpu("r0", Zone.RESERVED),
        Gpu("r1", Zone.RESERVED),
        Gpu("p0", Zone.PREEMPTIBLE, node="node1", instance_id="i-0abc"),
        Gpu("p1", Zone.PREEMPTIBLE, node="node1", instance_id="i-0abc"),
        Gpu("p2", Zone.PREEMPTIBLE, node="node2", instance_id="i-0def"),
        Gpu("o0", Zone.OVERLAP, node="node3"),
    ]
    workers = [
        Worker("w-r0", ("r0",), Role.PREFILL, WorkerStatus.ACTIVE),
        Worker("w-r1", ("r1",), Role.DECODE, WorkerStatus.ACTIVE),
        Worker("w-p0", ("p0", "p1"), Role.DECODE, WorkerStatus.ACTIVE),
        Worker("w-p2", ("p2",), Role.DECODE, WorkerStatus.ACTIVE),
        Worker("w-o0", ("o0",), Role.COLOCATED, WorkerStatus.INACTIVE),
    ]
    return ClusterState.build(gpus, workers)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def wall() -> ManualClock:
    return ManualClock(1_800_000_000.0)  # 2027-01-15T08:00:00Z


@pytest.fixture
def control(clock: ManualClock) -> StateControlPlane:
    config = {"name": "test", "admin": {"token": TOKEN, "port": 0}, "engine": {"kind": "emulated"}}
    return StateControlPlane(small_cluster(), clock, config)


@pytest.fixture
def spec() -> AdminSpec:
    return AdminSpec(port=0, max_events_per_s=1000.0, max_reads_per_s=1000.0)


@pytest.fixture
def admin(control: StateControlPlane, spec: AdminSpec, clock: ManualClock, wall: ManualClock) -> AdminApp:
    return AdminApp(control, spec, TOKEN, clock_now=clock, wall_now=wall, monotonic=clock)


@pytest.fixture
async def client(admin: AdminApp) -> AsyncIterator[TestClient]:
    async with TestClient(TestServer(admin.build())) as c:
        yield c
