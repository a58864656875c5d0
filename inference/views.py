"""Thin async views: parse, authorize, call serving, stream."""
from __future__ import annotations

import json
import logging
import time
import uuid

from django.http import JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from . import runtime
from .engine.outputs import RequestRejected
from .serving import chat
from .serving.errors import ApiError

log = logging.getLogger("metrale.api")


def error_response(err: ApiError) -> JsonResponse:
    resp = JsonResponse(err.body(), status=err.status)
    for k, v in err.headers.items():
        resp[k] = v
    return resp


def _ready_runtime():
    rt = runtime.get_runtime(wait=False)
    if rt is None:
        state, error = runtime.status()
        msg = "The model is still loading; retry shortly." if state != "failed" else f"The model failed to load: {error}"
        raise ApiError(503, msg, type="server_error", code="model_not_ready", headers={"Retry-After": "5"})
    return rt


@require_GET
async def health(request):
    """GET /health: 200 {"status": "ready", "model"} once loaded, else 503 {"status": "loading"}."""
    state, error = runtime.status()
    if state == "ready":
        return JsonResponse({"status": "ready", "model": runtime.served_model_name()})
    body = {"status": "failed", "error": error} if state == "failed" else {"status": "loading"}
    return JsonResponse(body, status=503)


@require_GET
async def list_models(request):
    """GET /v1/models: the served model (OpenAI's list of Model objects)."""
    rt = runtime.get_runtime(wait=False)
    created = rt.created if rt else int(time.time())
    return JsonResponse({"object": "list", "data": [
        {"id": runtime.served_model_name(), "object": "model", "created": created, "owned_by": "metrale"}]})


@csrf_exempt
@require_POST
async def chat_completions(request):
    """POST /v1/chat/completions, blocking or streamed (SSE)."""
    try:
        req = chat.parse(request.body)
        rt = _ready_runtime()
        prepared = chat.prepare(req, rt)
        if prepared.stream:
            stream = chat.stream(rt, prepared)
            # Pull the first frame now so a request that cannot fit is a 400, not a broken stream.
            first = await anext(stream)
            resp = StreamingHttpResponse(_prepend(first, stream), content_type="text/event-stream")
            resp["Cache-Control"] = "no-cache"
            resp["X-Accel-Buffering"] = "no"
            return resp
        return JsonResponse(await chat.complete(rt, prepared))
    except ApiError as err:
        return error_response(err)
    except RequestRejected as exc:
        return error_response(ApiError(400, str(exc), param="messages", code="context_length_exceeded"))


async def _prepend(first, rest):
    yield first
    async for frame in rest:
        yield frame
