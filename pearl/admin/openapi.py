"""The OpenAPI 3.1 document of the admin API, rendered from the pydantic models in ``schemas``.

``ROUTES`` is the one table of operations: ``pearl.admin.app`` registers a handler for each entry
and this module documents the same entries, so the served document (``GET /v1/openapi.json``)
cannot drift from the routes. Every error response shares ``ErrorOut``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from pearl import __version__
from pearl.admin import schemas as s

_REF = "#/components/schemas/{model}"
IDEMPOTENCY_HEADER = "Idempotency-Key"


@dataclass(frozen=True, slots=True)
class RouteDoc:
    method: str
    path: str
    op_id: str
    summary: str
    body: type[BaseModel] | None = None
    ok: type[BaseModel] | None = None
    ok_status: int = 200
    errors: tuple[int, ...] = ()
    event: bool = False  # a signal in: Idempotency-Key header, 200 on a duplicate
    auth: bool = True
    query: tuple[tuple[str, dict[str, Any], bool, str], ...] = ()  # (name, schema, required, description)
    text: bool = False  # text/plain response


_EVENT_ERRORS = (400, 401, 408, 409, 413, 415, 422, 429, 503)

ROUTES: tuple[RouteDoc, ...] = (
    RouteDoc("POST", "/v1/events/gpus-granted", "gpusGranted", "Preemptible GPUs were granted",
             s.GpusGrantedIn, s.EventAcceptedOut, 202, _EVENT_ERRORS, event=True),
    RouteDoc("POST", "/v1/events/reclaim-notice", "reclaimNotice", "Preemptible GPUs will be reclaimed",
             s.ReclaimNoticeIn, s.EventAcceptedOut, 202, (*_EVENT_ERRORS, 404), event=True),
    RouteDoc("POST", "/v1/events/notice-cancelled", "noticeCancelled", "A reclaim notice was withdrawn",
             s.NoticeCancelledIn, s.EventAcceptedOut, 202, (*_EVENT_ERRORS, 404), event=True),
    RouteDoc("POST", "/v1/events/training-started", "trainingStarted", "Training needs its GPUs back",
             s.TrainingStartedIn, s.EventAcceptedOut, 202, _EVENT_ERRORS, event=True),
    RouteDoc("POST", "/v1/events/training-finished", "trainingFinished", "Training GPUs are idle",
             s.TrainingFinishedIn, s.EventAcceptedOut, 202, _EVENT_ERRORS, event=True),
    RouteDoc("POST", "/v1/cloud/aws/eventbridge", "awsEventBridge",
             "AWS EventBridge 'EC2 Spot Instance Interruption Warning' event",
             s.AwsSpotInterruptionIn, s.EventAcceptedOut, 202, (*_EVENT_ERRORS, 404), event=True),
    RouteDoc("POST", "/v1/cloud/aws/instance-action", "awsInstanceAction",
             "EC2 instance metadata spot/instance-action document for one instance",
             s.InstanceActionIn, s.EventAcceptedOut, 202, (*_EVENT_ERRORS, 404), event=True,
             query=(("instance_id", {"type": "string", "pattern": s.IDENT_PATTERN, "maxLength": s.IDENT_MAX}, True,
                     "the instance the document came from (metadata instance-id)"),)),
    RouteDoc("GET", "/v1/state", "getState", "The GPU-worker-role table", ok=s.StateOut, errors=(401, 429)),
    RouteDoc("GET", "/v1/decision", "getDecision", "The current PD decision with every candidate's makespan",
             ok=s.DecisionOut, errors=(401, 429)),
    RouteDoc("GET", "/v1/history", "getHistory", "Recent decisions, plans and events (newest last)",
             ok=s.HistoryOut, errors=(400, 401, 429),
             query=(("limit", {"type": "integer", "minimum": 1, "maximum": 1000}, False, "entries (default 100)"),)),
    RouteDoc("GET", "/v1/nodes", "getNodes", "Node agents and the health of their engine servers",
             ok=s.NodesOut, errors=(401, 429)),
    RouteDoc("GET", "/v1/progress", "getProgress", "Rollout progress", ok=s.ProgressOut, errors=(401, 429)),
    RouteDoc("GET", "/v1/config", "getConfig", "The effective config, secrets redacted", errors=(401, 429)),
    RouteDoc("GET", "/v1/openapi.json", "getOpenApi", "This document", errors=(401, 429)),
    RouteDoc("GET", "/metrics", "getMetrics", "Prometheus metrics", errors=(401, 429), text=True),
    RouteDoc("GET", "/healthz", "getHealth", "Liveness (no auth)", ok=s.HealthOut, auth=False),
)

_REASONS = {
    400: "malformed request (not HTTP, not JSON, a bad query parameter, a body that ended early)",
    408: "the body did not arrive within admin.read_timeout_s",
    401: "missing or wrong bearer token",
    404: "unknown GPU, instance or notice",
    409: "conflict: idempotency key or notice_id reused with another payload, a training event while an "
         "internal trainer owns them or with a step behind / beside the running one, a grant over "
         "cluster.max_preemptible_gpus or on an unknown node, or the event conflicts with the current state",
    413: "request body over the size limit",
    415: "body is not application/json",
    422: "validation failed: `fields` names each field and the reason",
    429: "rate limited: retry after the Retry-After header",
    503: "the controller did not accept the event in time (retry with the same Idempotency-Key)",
}


def build_document() -> dict[str, Any]:
    models: list[tuple[type[BaseModel], Any]] = [(s.ErrorOut, "serialization")]
    for r in ROUTES:
        if r.body is not None:
            models.append((r.body, "validation"))
        if r.ok is not None:
            models.append((r.ok, "serialization"))
    _, defs = models_json_schema(models, ref_template=_REF)
    paths: dict[str, Any] = {}
    for r in ROUTES:
        paths.setdefault(r.path, {})[r.method.lower()] = _operation(r)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "PEARL admin API",
            "version": __version__,
            "description": "Preemption signals in; GPU-worker-role state, decisions and metrics out.",
        },
        "paths": paths,
        "components": {
            "schemas": defs.get("$defs", {}),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


def _operation(r: RouteDoc) -> dict[str, Any]:
    op: dict[str, Any] = {"operationId": r.op_id, "summary": r.summary, "responses": {}}
    op["security"] = [{"bearer": []}] if r.auth else []
    params: list[dict[str, Any]] = [
        {"name": name, "in": "query", "required": req, "schema": schema, "description": desc}
        for name, schema, req, desc in r.query
    ]
    if r.event:
        params.append(
            {
                "name": IDEMPOTENCY_HEADER,
                "in": "header",
                "required": False,
                "schema": {"type": "string", "pattern": s.IDENT_PATTERN, "maxLength": s.IDENT_MAX},
                "description": "event id; a repeated key is applied once (also accepted as body event_id)",
            }
        )
    if params:
        op["parameters"] = params
    if r.body is not None:
        op["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": _REF.format(model=r.body.__name__)}}},
        }
    if r.text:
        ok_content: dict[str, Any] = {"text/plain": {"schema": {"type": "string"}}}
    elif r.ok is not None:
        ok_content = {"application/json": {"schema": {"$ref": _REF.format(model=r.ok.__name__)}}}
    else:
        ok_content = {"application/json": {"schema": {"type": "object"}}}
    op["responses"][str(r.ok_status)] = {"description": "OK", "content": ok_content}
    if r.event:
        op["responses"]["200"] = {"description": "duplicate event: already applied, nothing changed",
                                  "content": ok_content}
    err = {"application/json": {"schema": {"$ref": _REF.format(model="ErrorOut")}}}
    codes = set(r.errors) | ({400, 401, 429} if r.auth else set())  # the guard's answers
    for code in sorted(codes):
        op["responses"][str(code)] = {"description": _REASONS[code], "content": err}
    return op
