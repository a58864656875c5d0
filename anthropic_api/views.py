"""Thin async views for Anthropic's Messages API: parse, call the shared pipeline, answer (errors in Anthropic's shape).

Every view is an `openai_endpoint(error_shape=ANTHROPIC)` view: the same auth (`x-api-key` or
`Authorization: Bearer`), tenants, rate limits and lease settlement as the OpenAI routes; the
`anthropic-version` header is accepted whatever it says.
"""
from __future__ import annotations

import time

from django.http import JsonResponse

from inference.http.api import openai_endpoint
from inference.serving.errors import ANTHROPIC, not_found
from inference.serving.prepare import cpu_work, light_work, prepare, prompt_ids
from inference.http.views import allow, cache_salt_of, ready_runtime, respond

from . import protocol
from .mapping import generation_request
from .wire import MessagesWire


@openai_endpoint(generates=True, error_shape=ANTHROPIC)
@allow("POST")
async def messages(request):
    """POST /v1/messages, blocking or streamed (SSE)."""
    started = time.perf_counter()
    size = len(request.body)
    req = await light_work(protocol.parse_messages, size, request.body)
    rt = await ready_runtime(request, req["model"], req.get("keep_alive"))
    prepared = await prepare(generation_request(req), rt, request_id=getattr(request, "request_id", None),
                             cache_salt=cache_salt_of(request), size=size)
    return await respond(request, rt, prepared, MessagesWire(req, prepared), param="messages", started=started)


@openai_endpoint(error_shape=ANTHROPIC)
@allow("POST")
async def count_tokens(request):
    """POST /v1/messages/count_tokens: {"input_tokens": N} of exactly the prompt /v1/messages would run."""
    req = await cpu_work(protocol.parse_count_tokens, request.body)
    ids = await prompt_ids(generation_request(req), await ready_runtime(request, req["model"]))
    return JsonResponse({"input_tokens": len(ids)})


@openai_endpoint(error_shape=ANTHROPIC)
async def unknown_route(request, rest: str = ""):
    """Any other path under /v1/messages: 404 not_found_error in Anthropic's shape."""
    raise not_found(f"Unknown request URL: {request.method} {request.path}.", code="unknown_url")
