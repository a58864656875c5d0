"""API middleware: x-request-id (and Anthropic's request-id) and openai-processing-ms on every API response
(Django), and the ASGI guard around the whole app (request bodies over the limit refused early, every API answer
JSON in the route's error shape, every response ended)."""
from __future__ import annotations

import json
import logging
import re
import time
import uuid
from http import HTTPStatus

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.http import JsonResponse

from .cors import cors_headers
from .error_shapes import shape_for_path
from ..serving.errors import ApiError

log = logging.getLogger("metrale.api")

API_PREFIXES = ("/v1/", "/api/", "/tokenize", "/detokenize", "/health")
# Routes outside `openai_endpoint` (which answers other methods itself) and the methods they take.
METHODS = {"/health": ("GET", "HEAD"), "/health/live": ("GET", "HEAD")}
# A client's id is echoed only when it is short, printable ASCII (it goes into logs and headers).
# A Content-Length: up to 19 ASCII digits (int64; twisted and Django read no more).
_DIGITS = re.compile(r"[0-9]{1,19}")
_CLIENT_ID = re.compile(r"^[\x21-\x7e]{1,200}$")


def is_api_path(path: str) -> bool:
    """Whether `path` is one of the API's (/v1 and below, Ollama's /api and below, /tokenize, /detokenize,
    /health): answered in its route's error shape (error_shapes.shape_for_path), whatever fails."""
    return path in ("/v1", "/api") or path.startswith(API_PREFIXES)


# Multipart framing allowed around an upload to POST /v1/files, on top of METRALE["MAX_FILE_BYTES"].
UPLOAD_FRAMING_BYTES = 1 << 20


def body_limit_bytes(path: str) -> int:
    """The most body bytes a request to `path` may send: METRALE["MAX_FILE_BYTES"] (+ framing)
    on /v1/files, where uploads stream to disk, else METRALE["MAX_REQUEST_BYTES"]."""
    if path == "/v1/files":
        return settings.METRALE["MAX_FILE_BYTES"] + UPLOAD_FRAMING_BYTES
    return settings.METRALE["MAX_REQUEST_BYTES"]


def request_id_from(client_id: str | None) -> str:
    """The client's X-Request-Id when usable, else a new `req_<32 hex>` id."""
    return client_id if client_id and _CLIENT_ID.match(client_id) else f"req_{uuid.uuid4().hex}"


def request_id_for(request) -> str:
    """request_id_from the request's X-Request-Id header."""
    return request_id_from(request.headers.get("X-Request-Id"))


class ApiRequestMiddleware:
    """For API paths (is_api_path): sets `request.request_id`, answers a Host that ALLOWED_HOSTS refuses with a
    400 naming it (_host_error) and a method a route outside `openai_endpoint` does not take with a 405
    (METHODS), and adds `x-request-id`, `request-id` (the same
    id under Anthropic's name) and `openai-processing-ms` (the time until the response, or a stream's headers, was ready) to every
    response, and the same time as `app;dur=<ms>` to Server-Timing (after the views' own entries,
    e.g. `engine`). Bodies over the size limit never get here (ApiAsgiGuard).

    Source: OpenAI API reference, "Debugging requests" (x-request-id, openai-processing-ms); Anthropic's
    "Errors" page (every response has a request-id header).
    """

    async_capable = True
    sync_capable = False

    def __init__(self, get_response):
        self.get_response = get_response
        if iscoroutinefunction(self.get_response):
            markcoroutinefunction(self)

    async def __call__(self, request):
        if not is_api_path(request.path):
            return await self.get_response(request)
        started = time.perf_counter()
        request.request_id = request_id_for(request)
        allowed = METHODS.get(request.path)
        host_error = _host_error(request)
        if host_error is not None:
            status, body = shape_for_path(request.path).of(host_error, request.request_id)
            response = JsonResponse(body, status=status)
        elif allowed is not None and request.method not in allowed:
            err = ApiError(405, f"{request.method} is not allowed on {request.path}; use {' or '.join(allowed)}.",
                           code="method_not_allowed", headers={"Allow": ", ".join(allowed)})
            response = JsonResponse(err.body(), status=405, headers=err.headers)
        else:
            response = await self.get_response(request)
        elapsed_ms = (time.perf_counter() - started) * 1000
        response["x-request-id"] = request.request_id
        response["request-id"] = request.request_id
        response["openai-processing-ms"] = str(round(elapsed_ms))
        timing = f"app;dur={elapsed_ms:.2f}"
        response["Server-Timing"] = f"{response['Server-Timing']}, {timing}" if response.has_header(
            "Server-Timing") else timing
        return response

    def process_exception(self, request, exception):
        """An unexpected exception in an API view: a 500 in the route's error shape (logged), not HTML."""
        if not is_api_path(request.path):
            return None
        log.exception("unhandled error in %s %s", request.method, request.path, exc_info=exception)
        err = ApiError(500, "The server had an error while processing your request.", type="server_error")
        status, body = shape_for_path(request.path).of(err, getattr(request, "request_id", None))
        return JsonResponse(body, status=status)


def _host_error(request) -> ApiError | None:
    """A 400 naming the Host header when Django's host check (request.get_host: ALLOWED_HOSTS) refuses it, else
    None. Django would answer a bare 400 and log the refusal with a traceback; one line is logged here."""
    try:
        request.get_host()
    except DisallowedHost:
        host = request.META.get("HTTP_X_FORWARDED_HOST") if settings.USE_X_FORWARDED_HOST else None
        host = host or request.META.get("HTTP_HOST", "")
        log.warning("refused a request for host %r (not in ALLOWED_HOSTS)", host[:100])
        return ApiError(400, f"The Host header {host[:100]!r} names no host this server answers to (its "
                             "ALLOWED_HOSTS).", code="invalid_host")
    return None


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def _content_length(scope) -> int | None:
    """The Content-Length header in bytes, None when absent. Raises ValueError when it is not a number."""
    value = _header(scope, b"content-length")
    if value is None:
        return None
    if not _DIGITS.fullmatch(value.strip()):
        raise ValueError(value)
    return int(value)


class ApiAsgiGuard:
    """ASGI middleware around the Django application (metrale_site/asgi.py), for what Django cannot do
    soon enough or at all:

    - A body over METRALE["MAX_REQUEST_BYTES"] (body_limit_bytes: uploads to /v1/files have their own) is a 413 before the application reads it: by its
      Content-Length when sent (an unreadable one is a 400); a chunked body is counted as its
      `http.request` messages arrive and stopped at the limit (the application is told the client
      left, and nothing past the limit is kept). Under daphne such a body never gets this far:
      daphne would have spooled all of it and queued it in 8 KiB messages before the application
      starts, so metrale_site/asgi.py's LimitedRequest drops it as it arrives; this guard is the
      rule for any other ASGI server, and for the in-process tests.
    - On API paths a body sent with a Content-Encoding other than identity is a 415 naming it (RFC 9110
      15.5.16, with Accept-Encoding: identity): it was read as if uncompressed (a gzip body was "not valid
      UTF-8", a plain one labelled gzip was served).
    - On API paths (is_api_path) every error answer is JSON in the route's error shape
      (error_shapes.shape_for_path): one the stack made in another format (Django's HTML
      400/403/404/500) is replaced by the same status as JSON. The guard's own answers (413, 400,
      500) take the route's shape too, and the CORS headers of every answer of their path.
    - Every response ends: an exception from the application before its answer is a 500 in the
      route's shape; after the headers (a stream's frames), the body is closed (the client sees
      the stream end) instead of leaving the connection open. Either is logged.
    """

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        reply = _Reply(send, scope, request_id_from(_header(scope, b"x-request-id")))
        limit = body_limit_bytes(scope["path"])
        try:
            declared = _content_length(scope)
        except ValueError as exc:
            return await reply.error(400, f"The Content-Length header {str(exc)[:40]!r} is not a number of bytes.",
                                     code="invalid_content_length")
        if declared is not None and declared > limit:
            return await reply.too_large(declared, limit)
        encoding = (_header(scope, b"content-encoding") or "identity").strip().lower()
        if encoding != "identity" and is_api_path(scope["path"]):
            return await reply.error(415, f"The request's Content-Encoding {encoding[:40]!r} is not supported; send "
                                          "the body uncompressed.", code="unsupported_content_encoding",
                                     headers=[(b"accept-encoding", b"identity")])
        body = _CountedBody(receive, limit)
        try:
            await self.app(scope, body.receive, reply.send)
        except Exception:
            log.exception("unhandled error in %s %s", scope.get("method"), scope["path"])
            if not body.client_gone:
                await reply.end_after_error()
            return
        if body.over_limit and not reply.started:
            return await reply.too_large(body.received, limit, at_least=True)
        if reply.started and not reply.ended and not body.client_gone:
            await reply.end_after_error()


class _CountedBody:
    """The request's `receive`, counting body bytes; past `limit_bytes` it says the client left.
    client_gone: the client did leave (nothing more can be sent to it)."""

    def __init__(self, receive, limit_bytes: int):
        self._receive = receive
        self.limit_bytes = limit_bytes
        self.received = 0
        self.over_limit = False
        self.client_gone = False

    async def receive(self):
        if self.over_limit:
            return {"type": "http.disconnect"}
        message = await self._receive()
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if self.received > self.limit_bytes:
                self.over_limit = True
                return {"type": "http.disconnect"}
        elif message["type"] == "http.disconnect":
            self.client_gone = True
        return message


class _Reply:
    """The response side of one request: what has been sent, and answers the guard makes itself."""

    def __init__(self, send, scope, request_id: str):
        self._send = send
        self.scope = scope
        self.path = scope["path"]
        self.api = is_api_path(self.path)
        self.request_id = request_id
        self.started = False
        self.ended = False
        self._held: dict | None = None  # a non-JSON error answer on an API path, replaced at its end

    async def send(self, message):
        kind = message["type"]
        if kind == "http.response.start":
            if self.api and message["status"] >= 400 and not _is_json(message.get("headers", ())):
                self._held = message
                return
            self.started = True
        elif kind == "http.response.body" and self._held is not None:
            if not message.get("more_body", False):
                held, self._held = self._held, None
                await self.error(held["status"], _status_message(held["status"]),
                                 headers=[(k, v) for k, v in held.get("headers", ())
                                          if k.lower() not in (b"content-type", b"content-length")])
            return
        elif kind == "http.response.body" and not message.get("more_body", False):
            self.ended = True
        await self._send(message)

    async def too_large(self, size: int, limit: int, *, at_least: bool = False):
        what = f"more than {limit}" if at_least else str(size)
        await self.error(413, f"The request body is {what} bytes; this server accepts at most {limit} bytes.",
                         code="request_too_large")

    async def error(self, status: int, message: str, *, code: str | None = None, headers=()):
        """Answer `status` with the route's error body (on any path: the guard's own answers are JSON),
        with the request id and the CORS headers every answer of its path carries (cors.cors_headers)."""
        shape = shape_for_path(self.path)
        body = json.dumps(shape.body(status, message, code=code, request_id=self.request_id)).encode()
        own = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        ids = [(b"x-request-id", self.request_id.encode()), (b"request-id", self.request_id.encode())]
        cors = cors_headers(self.scope.get("method", "GET"), self.path, self.scope.get("headers", ()))
        for name, value in (*ids, *cors):
            if not any(k.lower() == name for k, _ in headers):
                own.append((name, value))
        self.started = self.ended = True
        await self._send({"type": "http.response.start", "status": shape.status(status),
                          "headers": [*own, *headers]})
        await self._send({"type": "http.response.body", "body": body, "more_body": False})

    async def end_after_error(self):
        """After an application error: a 500 if nothing was sent, else the end of the body sent so far."""
        try:
            if not self.started:
                await self.error(500, "The server had an error while processing your request.")
            elif not self.ended:
                self.ended = True
                await self._send({"type": "http.response.body", "body": b"", "more_body": False})
        except Exception:  # the client is gone: nothing is left to end
            log.debug("could not end the response", exc_info=True)


def _is_json(headers) -> bool:
    for key, value in headers:
        if key.lower() == b"content-type":
            return value.split(b";")[0].strip().lower() == b"application/json"
    return False


def _status_message(status: int) -> str:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Error"
    return f"{phrase}: the server could not serve this request as sent."
