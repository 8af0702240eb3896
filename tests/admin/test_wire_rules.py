"""The API's wire rules: a valid OpenAPI document, strict numbers, bounded deadlines, only secrets
redacted, metrics that read 0 instead of vanishing and throughput in base units."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from pearl.admin.openapi import build_document
from tests.admin.conftest import AUTH


async def post(c: TestClient, path: str, body: Any) -> tuple[int, Any]:
    r = await c.post(path, json=body, headers=AUTH)
    return r.status, await r.json()


def test_the_openapi_document_is_valid() -> None:
    validator = pytest.importorskip("openapi_spec_validator")  # dev extra (pyproject.toml)
    validator.validate(build_document())  # raises OpenAPIValidationError naming the bad part


def test_no_optional_request_field_defaults_to_a_value_its_schema_refuses() -> None:
    schemas = build_document()["components"]["schemas"]
    props = schemas["ReclaimNoticeIn"]["properties"]
    for name in ("gpu_ids", "instance_id", "deadline_in_s", "deadline"):
        assert "default" not in props[name], name


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/v1/events/training-started", {"step": "3"}, "step"),
    ("/v1/events/training-started", {"step": True}, "step"),
    ("/v1/events/training-started", {"step": 3.5}, "step"),
    ("/v1/events/training-finished", {"step": 1, "weight_version": 1, "expected_idle_s": False}, "expected_idle_s"),
    ("/v1/events/training-finished", {"step": 1, "weight_version": "1"}, "weight_version"),
    ("/v1/events/reclaim-notice", {"gpu_ids": ["p2"], "deadline_in_s": True}, "deadline_in_s"),
    ("/v1/events/reclaim-notice", {"gpu_ids": ["p2"], "deadline_in_s": "30"}, "deadline_in_s"),
])
async def test_numbers_are_strict(client: TestClient, path: str, body: dict[str, Any], field: str) -> None:
    status, out = await post(client, path, body)
    assert status == 422 and out["fields"][0]["field"] == field


async def test_an_integer_is_a_number(client: TestClient) -> None:
    status, _ = await post(client, "/v1/events/reclaim-notice", {"gpu_ids": ["p2"], "deadline_in_s": 30})
    assert status == 202


async def test_an_absolute_deadline_has_the_relative_bound(client: TestClient) -> None:
    # the wall clock of the fixtures is 2027-01-15T08:00:00Z
    status, out = await post(client, "/v1/events/reclaim-notice", {"gpu_ids": ["p2"], "deadline": "9999-01-01T00:00:00Z"})
    assert status == 422 and out["fields"][0]["field"] == "deadline"
    status, _ = await post(client, "/v1/events/reclaim-notice", {"gpu_ids": ["p2"], "deadline": "2027-01-15T09:00:00Z"})
    assert status == 202


async def test_config_redacts_secrets_not_token_counts(client: TestClient, control: Any) -> None:
    control._config = {"admin": {"token": "s3cret-s3cret-s3cret"}, "workload": {"max_trajectory_tokens": 16384},
                       "train": {"micro_batch_tokens": 4096}, "env": {"hf_token": "hf_abc", "max_new_tokens": 8}}
    r = await client.get("/v1/config", headers=AUTH)
    cfg = await r.json()
    assert cfg["admin"]["token"] == "***" and cfg["env"]["hf_token"] == "***"
    assert cfg["workload"]["max_trajectory_tokens"] == 16384 and cfg["train"]["micro_batch_tokens"] == 4096
    assert cfg["env"]["max_new_tokens"] == 8


async def test_worker_series_read_zero_and_throughput_is_per_second(client: TestClient) -> None:
    text = await (await client.get("/metrics", headers=AUTH)).text()
    assert 'pearl_workers{role="prefill",status="draining"} 0.0' in text  # no such worker: 0, not absent
    assert 'pearl_workers{role="decode",status="active"} 3.0' in text
    assert "pearl_throughput_trajectories_per_second " in text and "per_hour" not in text
