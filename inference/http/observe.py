"""ObservedRequests: the ASGI middleware that gives every HTTP request its id, its log record and its metrics.

Outermost around the HTTP application (metrale_site/asgi.py). For each request it decides the
request id once (the client's usable X-Request-Id, else a new one: middleware.request_id_from)
and writes it into the scope's `x-request-id` header, so every layer below
(ApiAsgiGuard, ApiRequestMiddleware, the x-request-id response header) names the same id;
sets the request-id context variable that every log line carries (request_context); counts
metrale:http_requests_total{route, method, status} when the response ends; and for API
paths keeps a RequestRecord (request_context.current_record; request_log.live_records while
it runs, for the dashboard and cancels) whose line goes to the request log's writer once the
response ends, however it ends, when the request log is on (request_log.enabled). /metrics scrapes are never recorded in the request log (nor in daphne's
access log: QuietScrapesAccessLog).
"""
from __future__ import annotations

import functools

import logging
import time

from daphne.access import AccessLogGenerator
from django.conf import settings
from django.urls import Resolver404, resolve

from ..operations import heartbeat, request_log
from . import request_context
from ..operations.metrics import HTTP_REQUESTS
from .middleware import is_api_path, request_id_from
from ..operations.request_log import RequestRecord

log = logging.getLogger("metrale")

METRICS_PATH = "/metrics"


@functools.lru_cache(maxsize=4096)
def route_of(path: str) -> str:
    """The URL pattern that serves `path` (e.g. `v1/chat/completions/<str:completion_id>`), so the
    metric's label set stays bounded; "unmatched" when none does. Remembered per path (the URLconf does
    not change while the process serves)."""
    try:
        match = resolve(path)
    except Resolver404:
        return "unmatched"
    except Exception:  # an undecodable path: never let the metric fail the request
        return "unmatched"
    return match.route or "unmatched"


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


class ObservedRequests:
    """ASGI middleware (see the module docstring). Non-HTTP scopes pass through untouched."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        rid = request_id_from(_header(scope, b"x-request-id"))
        headers = [(k, v) for k, v in scope.get("headers", ()) if k.lower() != b"x-request-id"]
        scope = {**scope, "headers": [*headers, (b"x-request-id", rid.encode("latin-1"))]}
        path = scope["path"]
        route = route_of(path)
        record = None
        if is_api_path(path) and path != "/health":
            record = RequestRecord(rid, scope.get("method", ""), path, time.time(), route=route,
                                   bodies=request_log.enabled() and settings.METRALE["REQUEST_LOG_BODIES"])
            request_log.live_records[rid] = record
        token_id = request_context.request_id.set(rid)
        token_record = request_context.current_record.set(record)
        status = {"code": None}

        async def observed_receive():
            message = await receive()
            if record is not None and record.bodies and message["type"] == "http.request":
                record.add_body(record.request_body, message.get("body", b""))
            return message

        async def observed_send(message):
            kind = message["type"]
            if kind == "http.response.start":
                status["code"] = message["status"]
                if record is not None:
                    content_type = dict((k.lower(), v) for k, v in message.get("headers", ())).get(b"content-type", b"")
                    record.response_is_json = content_type.startswith(b"application/json")
            elif kind == "http.response.body":
                if record is not None and record.bodies and record.response_is_json:
                    record.add_body(record.response_body, message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, observed_receive, observed_send)
        finally:
            code = status["code"] or 500
            HTTP_REQUESTS.labels(route, scope.get("method", ""), str(code)).inc()
            if record is not None:
                record.retire()
                record.status = code
                if request_log.enabled():
                    _submit(record)
            request_context.current_record.reset(token_record)
            request_context.request_id.reset(token_id)


def _submit(record) -> None:
    try:
        request_log.writer().submit(record.line(heartbeat.process_id()))
    except Exception:  # a broken record must never fail the response
        log.exception("could not build the request log record")


class QuietScrapesAccessLog(AccessLogGenerator):
    """daphne's access log without the lines of /metrics scrapes (a scraper every few seconds
    would drown the log; vLLM issue #21001)."""

    def __call__(self, protocol, action, details):
        if protocol == "http" and action == "complete" and details.get("path") == METRICS_PATH:
            return
        super().__call__(protocol, action, details)
