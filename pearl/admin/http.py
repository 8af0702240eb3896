"""The admin API's HTTP layer under the handlers: JSON bodies in and out, client errors as values,
access logs without query strings, and aiohttp's connection handler with a head timeout.

``read_model`` reads one request body as a pydantic model (content type, size, encoding, JSON,
validation: each failure an ``ApiError`` the app's middleware renders as ``ErrorOut``);
``json_response`` writes one (non-finite floats as null). ``ProtocolRunner`` is the ``AppRunner``
whose connection handler (``_Protocol``) closes a connection whose request head does not arrive
within ``admin.read_timeout_s`` and answers a request the HTTP parser rejects with the API's JSON
``ErrorOut`` and one log line without the offending bytes.

Public names: ``ACCESS_LOG_FORMAT``, ``PathOnlyAccessLogger``, ``ApiError``, ``json_response``,
``field_errors``, ``read_model``, ``ProtocolRunner``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import sys
from typing import Any

from aiohttp import ClientPayloadError, web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.http_exceptions import BadHttpMessage, ContentEncodingError
from aiohttp.web_protocol import RequestHandler, RequestPayloadError
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse
from pydantic import BaseModel, ValidationError

from pearl.admin import schemas as s

log = logging.getLogger("pearl.admin")

ACCESS_LOG_FORMAT = '%a "%r" %s %b %Tfs'  # no headers: the Authorization header never reaches a log


class PathOnlyAccessLogger(AbstractAccessLogger):
    """Access log lines with the path but never the query string: a client that puts a token in
    the URL by mistake must not leak it into the logs (found by pearl/reliability/security.py)."""

    def log(self, request: BaseRequest, response: StreamResponse, time: float) -> None:
        self.logger.info('%s "%s %s HTTP/%d.%d" %s %s %.6fs', request.remote, request.method, request.path,
                         request.version.major, request.version.minor, response.status, response.body_length, time)


#: Content types read as JSON. ``curl -d`` sends form-urlencoded and some webhook senders text/plain;
#: the bearer token (not the content type) is what protects the routes, so these are accepted too.
_JSON_TYPES = frozenset({"application/json", "text/plain", "application/x-www-form-urlencoded"})

class ApiError(Exception):
    """A client error the middleware renders as ``ErrorOut``."""

    def __init__(self, status: int, code: str, message: str, fields: list[s.FieldError] | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.fields = fields or []
        self.headers = headers or {}


def _clean(x: Any) -> Any:
    """JSON-safe copy: non-finite floats -> None, tuples -> lists, other objects -> str."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    if x is None or isinstance(x, str | int | bool):
        return x
    return str(x)


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    text = json.dumps(_clean(obj), allow_nan=False, separators=(",", ":"))
    return web.Response(text=text, status=status, content_type="application/json", headers=headers)


def field_errors(err: ValidationError) -> list[s.FieldError]:
    out = []
    for e in err.errors(include_url=False):
        loc = ".".join(str(p) for p in e["loc"]) or "body"
        out.append(s.FieldError(field=loc, reason=str(e["msg"]).removeprefix("Value error, ")))
    return out


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


async def read_model(request: web.Request, model: type[BaseModel], read_timeout_s: float = 30.0) -> BaseModel:
    ctype = request.content_type if request.headers.get("Content-Type") is not None else "application/json"
    if ctype not in _JSON_TYPES and not ctype.endswith("+json"):
        raise ApiError(415, "unsupported_media_type", f"send the body as application/json, not {ctype!r}")
    try:
        async with asyncio.timeout(read_timeout_s):
            raw = await request.read()  # aiohttp raises 413 past client_max_size
    except TimeoutError:
        raise ApiError(408, "request_timeout", f"the body did not arrive within {read_timeout_s} s "
                       "(admin.read_timeout_s)") from None
    except (ClientPayloadError, BadHttpMessage, RequestPayloadError, ConnectionError) as e:  # a broken body
        if request.headers.get("Content-Encoding", "identity") != "identity":
            enc = request.headers.get("Content-Encoding", "?")[:20]
            raise ApiError(400, "bad_encoding", f"the request body is not valid {enc} data "
                           "(Content-Encoding); send it compressed whole, or uncompressed",
                           headers={"Connection": "close"}) from None  # the stream is unusable now
        raise ApiError(400, "incomplete_body", f"the request body ended early: {type(e).__name__}") from None
    try:
        data = json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:
        reason = "too deeply nested" if isinstance(e, RecursionError) else str(e)[:200]
        raise ApiError(400, "bad_json", f"body is not valid JSON: {reason}",
                       [s.FieldError(field="body", reason=reason)]) from None
    try:
        return model.model_validate(data)
    except ValidationError as e:
        fields = field_errors(e)
        names = ", ".join(f"{f.field}: {f.reason}" for f in fields[:5])
        raise ApiError(422, "validation", f"invalid {model.__name__}: {names}", fields) from None


class _Protocol(RequestHandler):
    """aiohttp's connection handler with two changes: a request line + headers must arrive within
    ``head_timeout_s`` of the connection opening (a slow client is disconnected), and a request
    the HTTP parser rejects (bad header byte, line over 8 KiB, ...) is answered with the API's JSON
    ``ErrorOut`` and logged as one line without the offending bytes (they may hold the token)."""

    head_timeout_s = 30.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = asyncio.get_running_loop().call_later(
            self.head_timeout_s, self._head_overdue)

    def _head_overdue(self) -> None:
        self._head_timer = None
        if self._request_count == 0 and self.transport is not None:
            log.info("admin API: no request head within %.0f s (admin.read_timeout_s): connection closed",
                     self.head_timeout_s)
            self.force_close()
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._request_count and self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)

    def log_exception(self, *args: Any, **kw: Any) -> None:
        """A body the decoder rejects (a corrupt gzip stream) is answered 400 by the handler; here it
        is one warning line, not a second traceback."""
        exc = sys.exc_info()[1]
        if isinstance(exc, ContentEncodingError):
            log.warning("admin API: a request body could not be decoded (%s)", type(exc).__name__)
            return
        super().log_exception(*args, **kw)

    def handle_error(self, request: BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> StreamResponse:
        if status >= 500:
            return super().handle_error(request, status, exc, message)
        reason = type(exc).__name__ if exc is not None else "bad request"
        log.warning("admin API: %d from %s: the HTTP parser rejected the request (%s)", status, request.remote, reason)
        if request.writer.output_size > 0:
            raise ConnectionError("response already started")
        body = s.ErrorOut(error="bad_request", message=f"malformed HTTP request ({reason})").model_dump()
        resp = json_response(body, status)
        resp.force_close()
        return resp


class _Server(web.Server):
    head_timeout_s = 30.0

    def __call__(self) -> RequestHandler:
        proto = _Protocol(self, loop=self._loop, **self._kwargs)
        proto.head_timeout_s = self.head_timeout_s
        return proto


class ProtocolRunner(web.AppRunner):
    """``AppRunner`` whose server makes ``_Protocol`` connection handlers."""

    def __init__(self, app: web.Application, head_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._head_timeout_s = head_timeout_s

    async def _make_server(self) -> web.Server:
        srv = await super()._make_server()
        srv.__class__ = _Server  # same state, our connection handler
        assert isinstance(srv, _Server)
        srv.head_timeout_s = self._head_timeout_s
        return srv
