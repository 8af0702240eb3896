"""Auth, the listen policy, and the app over a real socket (``AdminServer``)."""

from __future__ import annotations

import logging

import aiohttp
import pytest
from aiohttp.test_utils import TestClient

from pearl.access import AdminSecurityError, check_listen, is_loopback, resolve_token, token_matches
from pearl.admin.app import AdminServer
from pearl.admin.local import StateControlPlane
from pearl.admin.openapi import ROUTES
from pearl.config import AdminSpec
from tests.admin.conftest import AUTH, TOKEN, ManualClock


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong-token-0123456789"}, {"Authorization": TOKEN},
     {"Authorization": f"Basic {TOKEN}"}, {"Authorization": f"Bearer {TOKEN}x"}, {"Authorization": "Bearer "}],
)
async def test_every_route_but_healthz_needs_the_token(client: TestClient, control: StateControlPlane,
                                                       headers: dict[str, str]) -> None:
    for r in ROUTES:
        resp = await client.request(r.method, r.path, json={}, headers=headers)
        if r.path == "/healthz":
            assert resp.status == 200
        else:
            assert resp.status == 401, r.path
            assert resp.headers["WWW-Authenticate"].startswith("Bearer")
            assert (await resp.json())["error"] == "unauthorized"
    assert control.events_applied == 0


async def test_bearer_scheme_is_case_insensitive(client: TestClient) -> None:
    resp = await client.get("/v1/state", headers={"Authorization": f"bearer {TOKEN}"})
    assert resp.status == 200


async def test_token_never_reaches_a_log(client: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        await client.post("/v1/events/training-started", json={"step": 1}, headers=AUTH)
        await client.get("/v1/config", headers=AUTH)
        await client.get("/v1/state", headers={"Authorization": f"Bearer {TOKEN}-wrong"})
    assert caplog.records, "the app logs events"
    assert all(TOKEN not in r.getMessage() for r in caplog.records)


def test_token_from_config_then_env() -> None:
    assert resolve_token("c" * 16, {"PEARL_ADMIN_TOKEN": "e" * 16}) == "c" * 16
    assert resolve_token(None, {"PEARL_ADMIN_TOKEN": "e" * 16}) == "e" * 16
    assert resolve_token(None, {}) is None
    assert resolve_token("", {"PEARL_ADMIN_TOKEN": ""}) is None
    with pytest.raises(AdminSecurityError, match="at least 16"):
        resolve_token("short", {})


def test_token_compare() -> None:
    assert token_matches(f"Bearer {TOKEN}", TOKEN)
    assert not token_matches(None, TOKEN)
    assert not token_matches(f"Bearer {TOKEN[:-1]}", TOKEN)
    assert not token_matches("Bearer \udcff", TOKEN)  # undecodable header bytes do not raise


@pytest.mark.parametrize(("host", "loop"), [("127.0.0.1", True), ("127.3.4.5", True), ("::1", True),
                                            ("localhost", True), ("0.0.0.0", False), ("10.0.0.7", False),
                                            ("example.org", False), ("::", False)])
def test_listen_policy(host: str, loop: bool) -> None:
    assert is_loopback(host) is loop
    check_listen(host, TOKEN)  # with a token, anything goes
    if loop:
        check_listen(host, None)
    else:
        with pytest.raises(AdminSecurityError, match="refusing to listen"):
            check_listen(host, None)


def test_admin_server_refuses_exposed_address_without_token(control: StateControlPlane, clock: ManualClock) -> None:
    with pytest.raises(AdminSecurityError, match=r"0\.0\.0\.0"):
        AdminServer(control, AdminSpec(host="0.0.0.0"), clock, env={})


async def test_over_a_real_socket(control: StateControlPlane, clock: ManualClock) -> None:
    server = AdminServer(control, AdminSpec(port=0), clock, env={"PEARL_ADMIN_TOKEN": TOKEN})
    await server.start()
    try:
        assert server.port > 0
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{server.url}/v1/state") as resp:
                assert resp.status == 401
            async with http.post(f"{server.url}/v1/events/gpus-granted", headers=AUTH,
                                 json={"gpus": [{"gpu_id": "p7", "instance_id": "i-077"}]}) as resp:
                assert resp.status == 202
            async with http.post(f"{server.url}/v1/events/reclaim-notice", headers=AUTH,
                                 json={"instance_id": "i-077", "deadline_in_s": 0}) as resp:
                assert resp.status == 202
            async with http.get(f"{server.url}/v1/state", headers=AUTH) as resp:
                assert "p7" not in {g["gpu_id"] for g in (await resp.json())["gpus"]}
    finally:
        await server.stop()


async def test_service_refuses_exposed_address_before_any_work(tmp_path) -> None:
    from pearl.config import load_config
    from pearl.runtime.clock import LoopClock
    from pearl.serve import Service

    cfg = load_config("configs/emulated-demo.yaml", overrides={"output_dir": str(tmp_path)})
    svc = Service(cfg, LoopClock(), host="0.0.0.0", port=0, env={}, journal=False)
    with pytest.raises(AdminSecurityError, match="PEARL_ADMIN_TOKEN"):
        await svc.start()
    assert svc.controller is not None and svc.controller.started_at is None  # never started
    await svc.stop()
