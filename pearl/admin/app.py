"""The admin API (aiohttp): preemption signals in, state / decisions / metrics out.

Life cycle: ``build_app(control, ...)`` returns an ``aiohttp.web.Application`` bound to one
``ControlPlane``; ``AdminServer`` resolves the token, refuses an unsafe listen address, serves the
app on host:port and stops it (``await server.stop()``). The app owns no background task.

A request passes, in order: the error/metrics middleware (every failure becomes an ``ErrorOut``
JSON, nothing propagates to the controller), the guard (body size from Content-Length -> 413,
bearer token on every route but ``/healthz`` -> 401, per-client rate limit -> 429), then the
handler (JSON parse -> 400, pydantic -> 422 naming each field, unknown GPU / instance / notice ->
404, idempotency key reused with another payload or a header/body id mismatch -> 409, a well-formed
event the controller rejects against its current state (``ValueError``, e.g. a granted GPU that is
already in the table) -> 409 naming the field, controller too slow -> 503).

Before the controller: the HTTP parser's own rejections (a bad header byte, a line over 8 KiB) are
answered as ``ErrorOut`` 400 with one log line (``pearl.admin.http``); a request head must arrive within
``admin.read_timeout_s`` of the connection opening and a body within the same time (408); a body
broken off is a 400.

Events go through the controller's one door (``pearl.runtime.door.EventDoor``, ``control.door``):
an id seen before is answered there (200 duplicate or 409) before any lookup; a reclaim notice is
named by its ``ReclaimKey`` (a later notice for the same grant tightens it); then this API's policy
(``EventPolicy``: training events owned by an internal trainer -> 409, outside steps that go back
or overlap -> 409, grants over ``cluster.max_preemptible_gpus`` or on unknown nodes -> 409); then
the event is journaled (a journal that cannot write -> 503 naming why) and submitted. A 202 means
journaled; ``replay`` submits the unfinished ones after a restart. ``cloud_signal`` and
``grant_gpus`` are the same door for callers inside the process (the cloud watch, tools).

Event ids: the ``Idempotency-Key`` header or the body's ``event_id`` (they must agree), an id
derived from the cloud event for the AWS shapes, else a fresh ``api:<uuid>``. An id is applied
once; a repeat answers 200 with ``duplicate: true`` (a first application answers 202).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ValidationError

from pearl.access import (
    IdempotencyLedger,
    RateLimiter,
    check_listen,
    redact,
    resolve_token,
    token_matches,
)
from pearl.admin import cloud
from pearl.admin import schemas as s
from pearl.admin.http import (
    ACCESS_LOG_FORMAT,
    ApiError,
    PathOnlyAccessLogger,
    ProtocolRunner,
    field_errors,
    json_response,
    read_model,
)
from pearl.admin.metrics import CONTENT_TYPE, AdminMetrics
from pearl.admin.openapi import IDEMPOTENCY_HEADER, ROUTES, RouteDoc, build_document
from pearl.config import AdminSpec
from pearl.core.events import (
    ElasticEvent,
    EventKind,
    GpusGranted,
    GrantedGpu,
    NoticeCancelled,
    ReclaimNotice,
    TrainingFinished,
    TrainingStarted,
)
from pearl.runtime.control import ControlPlane, UnknownResourceError
from pearl.runtime.door import Arrival, EventRefused, JournalUnavailable

log = logging.getLogger("pearl.admin")

_IDENT = re.compile(s.IDENT_PATTERN)


def _ident(text: str) -> bool:
    """An id as the schemas define it (``schemas.IDENT_PATTERN``, at most ``IDENT_MAX`` characters)."""
    return len(text) <= s.IDENT_MAX and _IDENT.match(text) is not None

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
#: Live health of the node agents (``pearl/main.py``); None on a single node without agents.
NodesProvider = Callable[[], Awaitable[list[dict[str, Any]]]]


# ---------------------------------------------------------------------------- the app
class AdminApp:
    """Handlers and middlewares of one admin app (state: the limiter, the ledger, the metrics)."""

    def __init__(
        self,
        control: ControlPlane,
        spec: AdminSpec,
        token: str | None,
        clock_now: Callable[[], float],
        wall_now: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        nodes: NodesProvider | None = None,
        policy: EventPolicy | None = None,
    ) -> None:
        self.control = control
        self._nodes = nodes
        self.policy = policy or EventPolicy()
        self._training: tuple[int | None, bool] = (None, False)  # outside trainer: (last step, running)
        self.spec = spec
        self._token = token
        self._clock_now = clock_now
        self._wall_now = wall_now
        self.write_limiter = RateLimiter(spec.max_events_per_s, monotonic)
        self.read_limiter = RateLimiter(spec.max_reads_per_s, monotonic)
        self.metrics = AdminMetrics(control)
        self.document = build_document()

    def build(self) -> web.Application:
        app = web.Application(client_max_size=self.spec.max_body_bytes, middlewares=[self._errors, self._guard])
        handlers: dict[str, Handler] = {
            "gpusGranted": self._event(self._grant),
            "reclaimNotice": self._event(self._reclaim),
            "noticeCancelled": self._event(self._cancel),
            "trainingStarted": self._event(self._training_started),
            "trainingFinished": self._event(self._training_finished),
            "awsEventBridge": self._event(self._eventbridge),
            "awsInstanceAction": self._event(self._instance_action),
            "getState": self._get_state,
            "getDecision": self._get_decision,
            "getHistory": self._get_history,
            "getProgress": self._get_progress,
            "getNodes": self._get_nodes,
            "getConfig": self._get_config,
            "getOpenApi": self._get_openapi,
            "getMetrics": self._get_metrics,
            "getHealth": self._get_health,
        }
        self._docs: dict[str, RouteDoc] = {}
        for r in ROUTES:
            app.router.add_route(r.method, r.path, handlers[r.op_id])
            self._docs[r.path] = r
        return app

    # ------------------------------------------------------------------ middlewares
    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        t0 = time.perf_counter()
        route = request.match_info.route.resource.canonical if request.match_info.route.resource else "unmatched"
        try:
            resp = await handler(request)
        except ApiError as e:
            resp = json_response(s.ErrorOut(error=e.code, message=e.message, fields=e.fields).model_dump(),
                                 e.status, e.headers)
        except web.HTTPException as e:  # aiohttp's own: 404 route, 405 method, 413 body, ...
            code = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}.get(e.status, "http_error")
            msg = e.reason
            if e.status == 413:
                msg = f"request body over the limit of {self.spec.max_body_bytes} bytes (admin.max_body_bytes)"
            hdrs = {k: v for k, v in e.headers.items() if k.lower() == "allow"}
            resp = json_response(s.ErrorOut(error=code, message=msg).model_dump(), e.status, hdrs)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("admin API: unexpected error serving %s %s", request.method, route)
            resp = json_response(
                s.ErrorOut(error="internal", message="internal error; the controller is unaffected, see its log")
                .model_dump(), 500)
        self.metrics.requests.labels(route, request.method, str(resp.status)).inc()
        self.metrics.latency.labels(route).observe(time.perf_counter() - t0)
        return resp

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.content_length is not None and request.content_length > self.spec.max_body_bytes:
            raise ApiError(413, "body_too_large",
                           f"request body of {request.content_length} bytes is over the limit of "
                           f"{self.spec.max_body_bytes} bytes (admin.max_body_bytes)")
        if request.path == "/healthz":
            return await handler(request)
        if self._token is not None and not token_matches(request.headers.get("Authorization"), self._token):
            raise ApiError(401, "unauthorized", "missing or wrong bearer token (Authorization: Bearer <token>)",
                           headers={"WWW-Authenticate": 'Bearer realm="pearl"'})
        doc = self._docs.get(request.path)
        if doc is not None:
            allowed = {q[0] for q in doc.query}
            unknown = sorted(k for k in request.query if k not in allowed)
            if unknown:
                raise ApiError(400, "bad_query", f"unknown query parameter {unknown[0][:40]!r} "
                               f"(this route takes: {', '.join(sorted(allowed)) or 'none'})",
                               [s.FieldError(field=unknown[0][:40], reason="unknown query parameter")])
        limiter = self.write_limiter if request.method == "POST" else self.read_limiter
        wait = limiter.take(request.remote or "?")
        if wait > 0:
            raise ApiError(429, "rate_limited", f"too many requests; retry in {wait:.2f} s",
                           headers={"Retry-After": RateLimiter.retry_after(wait)})
        return await handler(request)

    # ------------------------------------------------------------------ events
    def _event(self, build: Callable[[web.Request, str | None], Awaitable[Arrival]]) -> Handler:
        async def handle(request: web.Request) -> web.StreamResponse:
            key = request.headers.get(IDEMPOTENCY_HEADER)
            if key is not None and not _ident(key):
                raise ApiError(422, "validation", f"{IDEMPOTENCY_HEADER} must match {s.IDENT_PATTERN}",
                               [s.FieldError(field=IDEMPOTENCY_HEADER, reason=f"must match {s.IDENT_PATTERN}")])
            return await self._admit(request.remote or "?", await build(request, key))

        return handle

    async def cloud_signal(self, instance_id: str, node: str, deadline_wall: float, source: str) -> dict[str, Any]:
        """A node-side watcher's notice (``pearl.runtime.node.cloud_watch``) through the door of the
        HTTP routes: journaled, idempotent, the instance's reclaim (an EventBridge warning for the
        same instance tightens the same reclaim). The GPUs are the instance's, else the node's
        preemptible ones. Returns the ``EventAcceptedOut`` body; a refusal raises ``ApiError``."""
        event_id = f"watch:{source}:{instance_id}:{int(deadline_wall)}"[:128]
        n = cloud.CloudNotice(instance_id=instance_id, deadline_wall=deadline_wall, event_id=event_id, action=source)
        digest = IdempotencyLedger.digest("cloud-watch", event_id.encode())
        resp = await self._admit(f"cloud-watch@{node}", self._cloud_notice(n, None, digest, node))
        assert isinstance(resp, web.Response) and resp.text is not None
        out: dict[str, Any] = json.loads(resp.text)
        return out

    async def grant_gpus(self, gpus: list[dict[str, Any]], event_id: str) -> dict[str, Any]:
        """A grant from inside the process (tools, the restart campaign) through the same door as
        ``POST /v1/events/gpus-granted``: validated, journaled, idempotent. A refusal raises ``ApiError``."""
        try:
            m = s.GpusGrantedIn.model_validate({"gpus": gpus, "event_id": event_id})
        except ValidationError as e:
            raise ApiError(422, "validation", str(e), field_errors(e)) from None
        ev = GpusGranted(tuple(GrantedGpu(g.gpu_id, g.node, g.instance_id) for g in m.gpus), event_id=event_id)
        digest = IdempotencyLedger.digest("/v1/events/gpus-granted", m.model_dump_json(exclude={"event_id"}).encode())
        resp = await self._admit("in-process", Arrival(event_id, digest, ev.kind, lambda: ev))
        assert isinstance(resp, web.Response) and resp.text is not None
        out: dict[str, Any] = json.loads(resp.text)
        return out

    async def _admit(self, remote: str, a: Arrival) -> web.StreamResponse:
        """Through the door (``pearl.runtime.door``) with this API's policy; its refusals as HTTP."""
        kind = a.kind.value
        checked: list[ElasticEvent] = []

        def check(event: ElasticEvent) -> None:
            self._check_policy(event)
            checked.append(event)

        try:
            async with asyncio.timeout(self.spec.submit_timeout_s):
                adm = await self.control.door.admit(replace(a, check=check, source=remote))
        except EventRefused as e:
            self.metrics.events.labels(kind, "rejected").inc()
            raise ApiError(409, e.code, str(e), [s.FieldError(field=e.field, reason=str(e))]) from None
        except JournalUnavailable as e:
            self.metrics.events.labels(kind, "rejected").inc()
            raise ApiError(503, "journal_unavailable", f"{e}; nothing was accepted, retry with the same "
                           f"{IDEMPOTENCY_HEADER} once the disk has room", headers={"Retry-After": "5"}) from None
        except UnknownResourceError as e:
            self.metrics.events.labels(kind, "rejected").inc()
            field = "instance_id" if e.kind == "instance" else e.kind
            raise ApiError(404, "not_found", str(e), [s.FieldError(field=field, reason=str(e))]) from None
        except TimeoutError:
            raise ApiError(503, "unavailable",
                           f"the controller did not accept the event within {self.spec.submit_timeout_s} s; "
                           f"retry with the same {IDEMPOTENCY_HEADER}", headers={"Retry-After": "1"}) from None
        except ValueError as e:
            self.metrics.events.labels(kind, "rejected").inc()
            field, _, reason = str(e).partition(": ")
            fields = [s.FieldError(field=field, reason=reason)] if reason else []
            raise ApiError(409, "conflict", str(e), fields) from None
        for ev in checked:
            if isinstance(ev, TrainingStarted | TrainingFinished):
                self._training = (ev.step, isinstance(ev, TrainingStarted))
        if adm.duplicate:
            self.metrics.events.labels(kind, "duplicate").inc()
            log.info("event %s id=%s from %s: duplicate", kind, adm.event_id, remote)
        else:
            outcome = "applied" if adm.applied else "ignored"
            self.metrics.events.labels(kind, outcome).inc()
        body = s.EventAcceptedOut(applied=adm.applied, duplicate=adm.duplicate, event_id=adm.event_id, kind=kind,
                                  gpu_ids=list(adm.gpu_ids), detail=adm.detail)
        return json_response(body.model_dump(), 200 if adm.duplicate else 202)

    def _check_policy(self, event: ElasticEvent) -> None:
        """Rules on the event against what the API knows (409 naming the rule): training events
        belong to an internal trainer when there is one, and their steps never go back or overlap;
        grants stay within ``cluster.max_preemptible_gpus`` on known nodes."""
        if isinstance(event, TrainingStarted | TrainingFinished):
            if self.policy.training_owner is not None:
                raise ApiError(409, "training_owned",
                               f"training events come from {self.policy.training_owner}, which runs inside this "
                               "controller; outside training events are refused",
                               [s.FieldError(field="step", reason=f"owned by {self.policy.training_owner}")])
            last, running = self._training
            if isinstance(event, TrainingStarted) and last is not None and event.step < last:
                raise ApiError(409, "conflict", f"step {event.step} is behind the trainer's step {last}",
                               [s.FieldError(field="step", reason=f"must be >= {last}")])
            if isinstance(event, TrainingFinished) and last is not None:
                if running and event.step != last:
                    raise ApiError(409, "conflict", f"training step {last} is running: only its own "
                                   f"training-finished (step {last}) may lend its GPUs, not step {event.step}",
                                   [s.FieldError(field="step", reason=f"must be {last}")])
                if not running and event.step < last:
                    raise ApiError(409, "conflict", f"step {event.step} is behind the trainer's step {last}",
                                   [s.FieldError(field="step", reason=f"must be >= {last}")])
        if isinstance(event, GpusGranted):
            state = self.control.state_dict()
            nodes = self.policy.known_nodes() if self.policy.known_nodes is not None else (
                {str(g.get("node")) for g in state.get("gpus", [])} | _rank_nodes())
            for i, g in enumerate(event.gpus):
                if g.node not in nodes:
                    raise ApiError(409, "unknown_node",
                                   f"gpus[{i}].node: {g.node!r} is not a node of this cluster "
                                   f"(known: {', '.join(sorted(nodes)[:8])})",
                                   [s.FieldError(field=f"gpus.{i}.node", reason="unknown node")])
            cap = self.policy.max_preemptible_gpus
            if cap is not None:
                have = {str(g["gpu_id"]) for g in state.get("gpus", []) if g.get("zone") == "preemptible"}
                have |= self.control.door.pending_grant_gpus()
                new = {g.gpu_id for g in event.gpus} - have
                if len(have) + len(new) > cap:
                    raise ApiError(409, "over_capacity",
                                   f"granting {len(new)} GPU(s) to the {len(have)} preemptible GPU(s) held would "
                                   f"exceed cluster.max_preemptible_gpus={cap}",
                                   [s.FieldError(field="gpus", reason=f"at most {max(cap - len(have), 0)} more")])

    def settle(self) -> None:
        """Mark finished grants and notices ``done`` against the current table (``EventDoor.settle``)."""
        self.control.door.settle()

    async def replay(self) -> dict[str, int]:
        """Submit again the journaled grants and notices not yet finished (``EventDoor.replay``)."""
        return await self.control.door.replay()

    @staticmethod
    def _event_id(key: str | None, body_id: str | None) -> str:
        if key is not None and body_id is not None and key != body_id:
            raise ApiError(409, "idempotency_conflict",
                           f"event_id {body_id!r} differs from {IDEMPOTENCY_HEADER} {key!r}",
                           [s.FieldError(field="event_id", reason=f"differs from the {IDEMPOTENCY_HEADER} header")])
        return key or body_id or f"api:{uuid.uuid4().hex}"

    @staticmethod
    def _digest(request: web.Request, m: BaseModel) -> str:
        return IdempotencyLedger.digest(request.path, m.model_dump_json(exclude={"event_id"}).encode())

    async def _grant(self, request: web.Request, key: str | None) -> Arrival:
        m = await read_model(request, s.GpusGrantedIn, self.spec.read_timeout_s)
        assert isinstance(m, s.GpusGrantedIn)
        ev = GpusGranted(tuple(GrantedGpu(g.gpu_id, g.node, g.instance_id) for g in m.gpus),
                         event_id=self._event_id(key, m.event_id))
        return Arrival(ev.event_id, self._digest(request, m), ev.kind, lambda: ev)

    async def _reclaim(self, request: web.Request, key: str | None) -> Arrival:
        m = await read_model(request, s.ReclaimNoticeIn, self.spec.read_timeout_s)
        assert isinstance(m, s.ReclaimNoticeIn)
        event_id = self._event_id(key, m.event_id)
        now_c, now_w = self._clock_now(), self._wall_now()
        if m.deadline is not None and m.deadline.timestamp() - now_w > s.MAX_DEADLINE_S:
            raise ApiError(422, "validation", f"deadline is more than {s.MAX_DEADLINE_S:.0f} s away "
                           "(deadline_in_s has the same bound)",
                           [s.FieldError(field="deadline", reason=f"at most {s.MAX_DEADLINE_S:.0f} s from now")])
        digest = self._digest(request, m)

        def resolve() -> ElasticEvent:
            gpu_ids = tuple(m.gpu_ids) if m.gpu_ids is not None else self._instance(m.instance_id or "")
            if m.deadline_in_s is not None:
                deadline = now_c + m.deadline_in_s
            else:
                assert m.deadline is not None
                deadline = cloud.wall_to_clock(m.deadline.timestamp(), now_c, now_w)
            return ReclaimNotice(gpu_ids, deadline, notice_id=m.notice_id or "", event_id=event_id)

        return Arrival(event_id, digest, EventKind.RECLAIM_NOTICE, resolve, m.instance_id)

    async def _cancel(self, request: web.Request, key: str | None) -> Arrival:
        m = await read_model(request, s.NoticeCancelledIn, self.spec.read_timeout_s)
        assert isinstance(m, s.NoticeCancelledIn)
        ev = NoticeCancelled(m.notice_id, event_id=self._event_id(key, m.event_id))
        return Arrival(ev.event_id, self._digest(request, m), ev.kind, lambda: ev)

    async def _training_started(self, request: web.Request, key: str | None) -> Arrival:
        m = await read_model(request, s.TrainingStartedIn, self.spec.read_timeout_s)
        assert isinstance(m, s.TrainingStartedIn)
        ev = TrainingStarted(m.step, event_id=self._event_id(key, m.event_id))
        return Arrival(ev.event_id, self._digest(request, m), ev.kind, lambda: ev)

    async def _training_finished(self, request: web.Request, key: str | None) -> Arrival:
        m = await read_model(request, s.TrainingFinishedIn, self.spec.read_timeout_s)
        assert isinstance(m, s.TrainingFinishedIn)
        ev = TrainingFinished(m.step, m.weight_version, m.expected_idle_s, event_id=self._event_id(key, m.event_id))
        return Arrival(ev.event_id, self._digest(request, m), ev.kind, lambda: ev)

    async def _eventbridge(self, request: web.Request, key: str | None) -> Arrival:
        m = await read_model(request, s.AwsSpotInterruptionIn, self.spec.read_timeout_s)
        assert isinstance(m, s.AwsSpotInterruptionIn)
        return self._cloud_notice(cloud.from_eventbridge(m), key, self._digest(request, m))

    async def _instance_action(self, request: web.Request, key: str | None) -> Arrival:
        instance_id = request.query.get("instance_id")
        if instance_id is None or not _ident(instance_id):
            reason = "required" if instance_id is None else f"must match {s.IDENT_PATTERN}"
            raise ApiError(422, "validation", f"query parameter instance_id: {reason}",
                           [s.FieldError(field="instance_id", reason=reason)])
        m = await read_model(request, s.InstanceActionIn, self.spec.read_timeout_s)
        assert isinstance(m, s.InstanceActionIn)
        digest = IdempotencyLedger.digest(f"{request.path}?{instance_id}", m.model_dump_json().encode())
        return self._cloud_notice(cloud.from_instance_action(m, instance_id), key, digest)

    def _cloud_notice(self, n: cloud.CloudNotice, key: str | None, digest: str, node: str | None = None) -> Arrival:
        """A cloud notice names its instance: the notice id is the instance id, and every cloud notice
        for one instance (EventBridge warning, metadata document, a node watcher's) is one notice.
        ``node``: a watcher's node, whose preemptible GPUs are meant when the instance is unknown."""
        event_id = key or n.event_id
        now_c, now_w = self._clock_now(), self._wall_now()

        def resolve() -> ElasticEvent:
            try:
                gpu_ids = self._instance(n.instance_id)
            except UnknownResourceError:
                spot = [g["gpu_id"] for g in self.control.state_dict().get("gpus", [])
                        if node is not None and g.get("node") == node and g.get("zone") == "preemptible"]
                if not spot:
                    raise
                gpu_ids = tuple(sorted(spot))
            return ReclaimNotice(gpu_ids, cloud.wall_to_clock(n.deadline_wall, now_c, now_w), event_id=event_id)

        return Arrival(event_id, digest, EventKind.RECLAIM_NOTICE, resolve, n.instance_id)

    def _instance(self, instance_id: str) -> tuple[str, ...]:
        """The GPUs registered with a cloud instance (``UnknownResourceError``, 404, when none is)."""
        gpus = self.control.instance_gpus(instance_id)
        if not gpus:
            raise UnknownResourceError("instance", instance_id)
        return tuple(gpus)

    # ------------------------------------------------------------------ reads
    async def _get_state(self, request: web.Request) -> web.StreamResponse:
        return json_response(self.control.state_dict())

    async def _get_decision(self, request: web.Request) -> web.StreamResponse:
        return json_response({"decision": self.control.decision_dict()})

    async def _get_history(self, request: web.Request) -> web.StreamResponse:
        raw = request.query.get("limit", "100")
        try:
            limit = int(raw)
        except ValueError:
            limit = -1
        if not 1 <= limit <= 1000:
            raise ApiError(400, "bad_query", f"limit must be an integer in 1..1000, got {raw[:40]!r}",
                           [s.FieldError(field="limit", reason="must be an integer in 1..1000")])
        return json_response({"entries": self.control.history(limit)})

    async def _get_progress(self, request: web.Request) -> web.StreamResponse:
        p = self.control.progress()
        return json_response({f: getattr(p, f) for f in s.ProgressOut.model_fields})

    async def _get_nodes(self, request: web.Request) -> web.StreamResponse:
        nodes = await self._nodes() if self._nodes is not None else []
        return json_response({"nodes": nodes})

    async def _get_config(self, request: web.Request) -> web.StreamResponse:
        return json_response(redact(self.control.config_dict()))

    async def _get_openapi(self, request: web.Request) -> web.StreamResponse:
        return json_response(self.document)

    async def _get_metrics(self, request: web.Request) -> web.StreamResponse:
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def _get_health(self, request: web.Request) -> web.StreamResponse:
        fault = self.control.door.fault
        return json_response({"status": "ok"} if fault is None else {"status": "degraded", "journal": fault})


@dataclass(frozen=True, slots=True)
class EventPolicy:
    """What the API enforces on events beyond their schema (``AdminApp._check_policy``).

    ``training_owner``: the internal trainer (named in the 409), None when training events come from
    outside; ``max_preemptible_gpus``: ``cluster.max_preemptible_gpus`` (None: unbounded);
    ``known_nodes``: node names a grant may name (None: the nodes of the GPU table and ``node<r>``
    for every rank of the job, ``node0`` on one node)."""

    training_owner: str | None = None
    max_preemptible_gpus: int | None = None
    known_nodes: Callable[[], set[str]] | None = None


def _rank_nodes() -> set[str]:
    """``node<r>`` for every rank of this job (``WORLD_SIZE``, 1 outside torchrun): the nodes a
    grant may name besides those already in the GPU table."""
    try:
        world = max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        world = 1
    return {f"node{r}" for r in range(world)}


def build_app(
    control: ControlPlane,
    spec: AdminSpec,
    token: str | None,
    clock_now: Callable[[], float],
    wall_now: Callable[[], float] = time.time,
    monotonic: Callable[[], float] = time.monotonic,
    nodes: NodesProvider | None = None,
) -> web.Application:
    return AdminApp(control, spec, token, clock_now, wall_now, monotonic, nodes).build()


class AdminServer:
    """Serves the admin app on ``host:port`` (port 0: any free port; see ``.port`` after ``start``)."""

    def __init__(self, control: ControlPlane, spec: AdminSpec, clock_now: Callable[[], float],
                 host: str | None = None, port: int | None = None, env: dict[str, str] | None = None,
                 nodes: NodesProvider | None = None, policy: EventPolicy | None = None) -> None:
        self.host = host if host is not None else spec.host
        self.port = port if port is not None else spec.port
        self.token = resolve_token(spec.token, env)
        check_listen(self.host, self.token)
        self.admin = AdminApp(control, spec, self.token, clock_now, nodes=nodes, policy=policy)
        self._read_timeout_s = spec.read_timeout_s
        self.app = self.admin.build()
        self._runner: web.AppRunner | None = None

    async def replay(self) -> dict[str, int]:
        """Replay the journaled events the controller has not finished (``AdminApp.replay``)."""
        return await self.admin.replay()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        if self.token is None:
            log.warning("admin API on %s:%s has no token: open to every local process", self.host, self.port)
        self._runner = ProtocolRunner(self.app, self._read_timeout_s, access_log_format=ACCESS_LOG_FORMAT, handle_signals=False,
                               access_log_class=PathOnlyAccessLogger, keepalive_timeout=self._read_timeout_s)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        socks = getattr(site._server, "sockets", None)
        if self.port == 0 and socks:
            self.port = int(socks[0].getsockname()[1])
        log.info("admin API listening on %s (auth %s)", self.url, "on" if self.token else "off")

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self.admin.settle()  # what finished meanwhile is not replayed by the next start
