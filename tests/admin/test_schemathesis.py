"""Property-based tests of the served OpenAPI document with schemathesis.

The real app runs over a real socket in a background thread (schemathesis' calls are synchronous);
the document is fetched from ``/v1/openapi.json`` as a client would, and every operation is driven
with generated valid and invalid inputs: no 5xx, every status and body as documented.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.generation.modes import GenerationMode

from pearl.admin.app import AdminServer
from pearl.admin.local import StateControlPlane
from pearl.admin.openapi import ROUTES
from pearl.config import AdminSpec
from tests.admin.conftest import AUTH, TOKEN, small_cluster

ROOT = Path(__file__).resolve().parents[2]


class _ServerThread:
    """Runs an ``AdminServer`` on its own event loop in a daemon thread; ``close`` stops both.

    ``kind``: ``state`` - over ``StateControlPlane``; ``controller`` - over the real ``Controller``
    with the emulated engine rolling out in real time (the generated events reach the real
    schedulers: nothing a client sends may crash them)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.loop = asyncio.new_event_loop()
        self.server: AdminServer | None = None
        self.controller = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._ready = threading.Event()
        self.error: BaseException | None = None

    async def _start(self) -> None:
        spec = AdminSpec(port=0, max_events_per_s=1e6, max_reads_per_s=1e6, submit_timeout_s=30)
        env = {"PEARL_ADMIN_TOKEN": TOKEN}
        if self.kind == "state":
            control = StateControlPlane(small_cluster(), time.monotonic, {"admin": {"token": TOKEN}})
            self.server = AdminServer(control, spec, time.monotonic, env=env)
        else:
            from pearl.config import load_config
            from pearl.runtime.clock import LoopClock
            from pearl.serve import build_controller, make_local_engine

            cfg = load_config(str(ROOT / "configs/emulated-demo.yaml"))
            clock = LoopClock()
            self.controller, _trainer = build_controller(cfg, clock, make_local_engine(cfg, clock, Path(".")))
            await self.controller.start()
            self.server = AdminServer(self.controller, spec, clock.now, env=env)
        await self.server.start()

    async def _stop(self) -> None:
        if self.server is not None:
            await self.server.stop()
        if self.controller is not None:
            await self.controller.stop()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._start())
        except BaseException as e:  # reported by start()
            self.error = e
            self._ready.set()
            return
        self._ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(self._stop())
        self.loop.close()

    def start(self) -> None:
        self._thread.start()
        assert self._ready.wait(120), "admin server did not start"
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)


@pytest.fixture(scope="module", params=["state", "controller"])
def served(request: pytest.FixtureRequest) -> Iterator[str]:
    st = _ServerThread(request.param)
    st.start()
    assert st.server is not None
    yield st.server.url
    st.close()


def _operations(url: str) -> list:
    loaded = schemathesis.openapi.from_url(f"{url}/v1/openapi.json", headers=AUTH)
    return [r.ok() for r in loaded.get_all_operations()]


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_api_conforms_to_its_document(served: str, mode: GenerationMode) -> None:
    ops = _operations(served)
    # every route but the document itself (schemathesis leaves out the schema's own URL)
    assert {o.label for o in ops} == {f"{r.method} {r.path}" for r in ROUTES if r.path != "/v1/openapi.json"}
    for op in ops:

        @given(case=op.as_strategy(generation_mode=mode))
        @settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
                  database=None)
        def check(case) -> None:
            case.call_and_validate(base_url=served, headers=AUTH)

        try:
            check()
        except Unsatisfiable:
            # nothing to negate (e.g. /healthz takes no input); every route with input must be tested
            assert mode is GenerationMode.NEGATIVE and op.method == "get" and op.path != "/v1/history", op.label


def test_still_serving_after_fuzzing(served: str) -> None:
    """After the generated traffic the control plane still applies events (its loops are alive)."""
    import requests

    grant = {"gpus": [{"gpu_id": "after-fuzz-0", "node": "node0"}]}
    r = requests.post(f"{served}/v1/events/gpus-granted", json=grant, headers=AUTH, timeout=30)
    assert r.status_code == 202, r.text
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the real controller applies the grant on its event loop
        state = requests.get(f"{served}/v1/state", headers=AUTH, timeout=30).json()
        if "after-fuzz-0" in {g["gpu_id"] for g in state["gpus"]}:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the grant was never applied: the controller's event loop is stuck")
    assert requests.get(f"{served}/v1/progress", headers=AUTH, timeout=30).status_code == 200
