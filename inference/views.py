"""Thin async views: parse, authorize, call serving, stream."""
from __future__ import annotations

import logging
import time

from django.http import JsonResponse, StreamingHttpResponse
from django.views.decorators.http import require_GET, require_POST

from . import runtime
from .api import admit, openai_endpoint
from .serving import chat
from .serving.errors import ApiError

log = logging.getLogger("metrale.api")


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


@openai_endpoint
@require_GET
async def list_models(request):
    """GET /v1/models: the served model (OpenAI's list of Model objects)."""
    rt = runtime.get_runtime(wait=False)
    created = rt.created if rt else int(time.time())
    return JsonResponse({"object": "list", "data": [
        {"id": runtime.served_model_name(), "object": "model", "created": created, "owned_by": "metrale"}]})


@openai_endpoint(generates=True)
@require_POST
async def chat_completions(request):
    """POST /v1/chat/completions, blocking or streamed (SSE).

    The rate-limit lease reserves prompt + max_tokens and is settled with the real
    usage when generation ends, however it ends (see inference.api).
    """
    req = chat.parse(request.body)
    rt = _ready_runtime()
    prepared = chat.prepare(req, rt, cache_salt=request.principal.prefix_cache_salt)
    lease = await admit(request, reserve_tokens=prepared.reserve_tokens, timeout_s=prepared.gen.timeout_s)
    if not prepared.stream:
        try:
            return JsonResponse(await chat.complete(rt, prepared))
        finally:
            await lease.release(prepared.usage.total_tokens)
    frames = chat.stream(rt, prepared)
    try:
        # Pull the first frame now so a request the engine refuses is a 400, not a broken stream.
        first = await anext(frames)
    except BaseException:
        await lease.release(prepared.usage.total_tokens)
        raise

    async def body():
        try:
            yield first
            async for frame in frames:
                yield frame
        finally:
            await frames.aclose()
            await lease.release(prepared.usage.total_tokens)

    resp = StreamingHttpResponse(body(), content_type="text/event-stream")
    resp["Cache-Control"] = "no-cache"
    resp["X-Accel-Buffering"] = "no"
    return resp
