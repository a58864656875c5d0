"""API middleware: x-request-id and openai-processing-ms on every API response, 413 for oversized bodies."""
from __future__ import annotations

import logging
import re
import time
import uuid

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.http import JsonResponse

from .serving.errors import ApiError

log = logging.getLogger("metrale.api")

API_PREFIXES = ("/v1/", "/tokenize", "/detokenize")
# A client's id is echoed only when it is short, printable ASCII (it goes into logs and headers).
_CLIENT_ID = re.compile(r"^[\x21-\x7e]{1,200}$")


def request_id_for(request) -> str:
    """The client's X-Request-Id when usable, else a new `req_<32 hex>` id."""
    client_id = request.headers.get("X-Request-Id", "")
    return client_id if _CLIENT_ID.match(client_id) else f"req_{uuid.uuid4().hex}"


def body_too_large(request, limit_bytes: int) -> int | None:
    """The body's size in bytes when it exceeds `limit_bytes`, else None.

    Uses Content-Length when sent; a chunked body (no Content-Length) is measured.
    """
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or -1)
    except ValueError:
        declared = -1
    if declared < 0 and request.method in ("POST", "PUT", "PATCH"):
        declared = len(request.body)
    return declared if declared > limit_bytes else None


class ApiRequestMiddleware:
    """For /v1/*, /tokenize and /detokenize: sets `request.request_id`, answers 413 when the body is
    over METRALE["MAX_REQUEST_BYTES"], and adds `x-request-id` and `openai-processing-ms` (the
    time until the response, or a stream's headers, was ready) to every response, and the same
    time as `app;dur=<ms>` to Server-Timing (after the views' own entries, e.g. `engine`).

    Source: OpenAI API reference, "Debugging requests" (x-request-id, openai-processing-ms).
    """

    async_capable = True
    sync_capable = False

    def __init__(self, get_response):
        self.get_response = get_response
        if iscoroutinefunction(self.get_response):
            markcoroutinefunction(self)

    async def __call__(self, request):
        if not request.path.startswith(API_PREFIXES):
            return await self.get_response(request)
        started = time.perf_counter()
        request.request_id = request_id_for(request)
        limit = settings.METRALE["MAX_REQUEST_BYTES"]
        size = body_too_large(request, limit)
        if size is not None:
            err = ApiError(413, f"The request body is {size} bytes; this server accepts at most {limit} bytes.",
                           code="request_too_large")
            response = JsonResponse(err.body(), status=413)
        else:
            response = await self.get_response(request)
        elapsed_ms = (time.perf_counter() - started) * 1000
        response["x-request-id"] = request.request_id
        response["openai-processing-ms"] = str(round(elapsed_ms))
        timing = f"app;dur={elapsed_ms:.2f}"
        response["Server-Timing"] = f"{response['Server-Timing']}, {timing}" if response.has_header(
            "Server-Timing") else timing
        return response

    def process_exception(self, request, exception):
        """An unexpected exception in an API view: a 500 in OpenAI's error shape (logged), not HTML."""
        if not request.path.startswith(API_PREFIXES):
            return None
        log.exception("unhandled error in %s %s", request.method, request.path, exc_info=exception)
        err = ApiError(500, "The server had an error while processing your request.", type="server_error")
        return JsonResponse(err.body(), status=500)
