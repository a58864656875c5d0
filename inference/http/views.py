"""Thin async views: parse, authorize, call serving, stream.

Every /v1/*, /tokenize and /detokenize view is wrapped by `openai_endpoint` (auth, rate
limits, ApiError -> OpenAI's error JSON); `allow` answers other methods with a 405 in
that shape. A generating view parses its body, hands the surface's GenerationRequest to the
one preparation pipeline (serving.prepare), and answers through `respond`, which admits the
rate-limit lease, submits the choices and streams or assembles the surface's wire form; the
wrapper settles the lease with the real usage however the request ends.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import time

from django.conf import settings
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse

from ..operations import runtime, swap
from .api import admit, openai_endpoint
from .surfaces import chat_call, completions_call, embeddings_call
from ..engine.outputs import EngineOverloaded, RequestRejected
from .request_context import current_record
from ..serving import chat, tokenize
from ..serving import embeddings as embeddings_api
from ..serving import completions as legacy_completions
from ..serving.choices import Choices
from ..serving.errors import ApiError, not_found
from ..serving.model_names import find_model, model_cards, model_object
from ..serving.prepare import Prepared, cpu_work, light_work
from ..stored.objects import tenant_of

log = logging.getLogger("metrale.api")


def allow(*methods: str):
    """Answer any other HTTP method with 405 in OpenAI's error shape (and an Allow header)."""

    def wrap(view):
        @functools.wraps(view)
        async def checked(request, *args, **kwargs):
            if request.method not in methods:
                raise ApiError(405, f"{request.method} is not allowed on {request.path}; use "
                                    f"{' or '.join(methods)}.", code="method_not_allowed",
                               headers={"Allow": ", ".join(methods)})
            return await view(request, *args, **kwargs)
        return checked
    return wrap


async def ready_runtime():
    """The runtime that serves this request.

    While a swap that drains the old model first has none installed, the request waits for the new
    one: up to METRALE["SWAP_WAIT_S"] seconds, at most METRALE["SWAP_WAIT_MAX"] requests at once
    (issue: "wait, with a bounded queue and a 503 model_not_loaded with Retry-After past it").
    Raises ApiError 503 with Retry-After: model_not_loaded past that wait, model_not_ready while the
    model loads or after it failed.
    """
    rt = runtime.get_runtime(wait=False)
    if rt is None and runtime.status()[0] == "swapping":
        rt = await _wait_for_swap()
    if rt is None:
        state, error = runtime.status()
        if state == "swapping":
            raise ApiError(503, f"The model is not loaded: {error}; retry shortly.", type="server_error",
                           code="model_not_loaded", headers={"Retry-After": "5"})
        msg = "The model is still loading; retry shortly." if state != "failed" else f"The model failed to load: {error}"
        raise ApiError(503, msg, type="server_error", code="model_not_ready", headers={"Retry-After": "5"})
    return rt


_swap_waiters = 0


async def _wait_for_swap():
    """The runtime a drain-first swap installs, polled every 50 ms; None past SWAP_WAIT_S, when
    SWAP_WAIT_MAX requests already wait, or when the swap ends without a model."""
    global _swap_waiters
    limits = settings.METRALE
    if _swap_waiters >= limits["SWAP_WAIT_MAX"]:
        return None
    _swap_waiters += 1
    try:
        deadline = time.monotonic() + limits["SWAP_WAIT_S"]
        while (rt := runtime.get_runtime(wait=False)) is None and runtime.status()[0] == "swapping" \
                and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return rt
    finally:
        _swap_waiters -= 1


def engine_refusal(exc: RequestRejected | EngineOverloaded, param: str) -> ApiError:
    """The HTTP error for a submission the engine refused: 400 context_length_exceeded naming
    `param` for a request that can never fit, 503 with Retry-After when the waiting queue is full."""
    if isinstance(exc, EngineOverloaded):
        return ApiError(503, f"The server is overloaded: {exc}. Retry shortly.", type="server_error",
                        code="overloaded", headers={"Retry-After": str(exc.retry_after_s)})
    return ApiError(400, f"The request cannot be served: {exc}.", param=param, code="context_length_exceeded")


def cache_salt_of(request) -> str:
    """The caller's prefix-cache salt (its tenant's), "" before authentication."""
    principal = getattr(request, "principal", None)
    return principal.prefix_cache_salt if principal is not None else ""


def _server_timing(run: Choices, started: float, prepared_at: float) -> str:
    """Server-Timing (W3C) of a blocking request, in ms: `prep` (parse, validate, template, tokenize,
    admit), `engine` (submit to the last engine event) and `view` (all of the view)."""
    total_ms = (time.perf_counter() - started) * 1000
    prep_ms = (prepared_at - started) * 1000
    engine_ms = (run.engine_s or 0.0) * 1000
    return f"prep;dur={prep_ms:.2f}, engine;dur={engine_ms:.2f}, view;dur={total_ms:.2f}"


def sse_response(frames) -> StreamingHttpResponse:
    """A Server-Sent Events response over async `frames` (bytes), unbuffered by proxies."""
    resp = StreamingHttpResponse(frames, content_type="text/event-stream")
    resp["Cache-Control"] = "no-cache"
    resp["X-Accel-Buffering"] = "no"
    return resp


async def respond(request, rt, prepared: Prepared, wire, *, param: str, started: float):
    """Admit, submit and answer one prepared generating request: the flow every generating route
    shares. wire: the surface's encoder (`stream`, `frames(run)`, `body(run)`); param: the field a
    refused submission names. Raises ApiError (429 from admission, 400/503 from the engine's
    refusal, what `wire.body` raises); the caller's openai_endpoint settles the lease."""
    run: Choices | None = None
    await admit(request, reserve_tokens=prepared.reserve_tokens, timeout_s=prepared.timeout_s,
                used_tokens=lambda: run.usage.total_tokens if run is not None else prepared.prompt_tokens)
    prepared_at = time.perf_counter()
    try:
        run = Choices(rt.engine, rt.tokenizer, prepared)
    except (RequestRejected, EngineOverloaded) as exc:
        raise engine_refusal(exc, param) from exc
    if wire.stream:
        return sse_response(wire.frames(run))
    resp = JsonResponse(await wire.body(run))
    resp["Server-Timing"] = _server_timing(run, started, prepared_at)
    return resp


def _ids(request) -> dict:
    return {"request_id": getattr(request, "request_id", None), "cache_salt": cache_salt_of(request)}


async def health(request):
    """GET /health: 200 {"status": "ready", "model", "system_fingerprint", "adapters", "swap"} once loaded; 503
    {"status": "swapping"} (Retry-After) while a swap drains the old model first, else {"status": "loading"}."""
    state, error = runtime.status()
    rt = runtime.current()
    if state == "ready" and rt is not None:
        return JsonResponse({"status": "ready", "model": rt.model_id, "system_fingerprint": rt.fingerprint or None,
                             "adapters": sorted(rt.adapters), "swap": swap.status()})
    if state == "swapping":
        return JsonResponse({"status": "swapping", "error": error, "swap": swap.status()}, status=503,
                            headers={"Retry-After": "5"})
    body = {"status": "failed", "error": error} if state == "failed" else {"status": "loading"}
    return JsonResponse(body, status=503)


async def health_live(request):
    """GET /health/live: 200 {"status": "live"} whenever this process answers HTTP (a liveness probe:
    loading, draining or a failed load are /health's business, not a reason to restart it)."""
    return JsonResponse({"status": "live"})


@openai_endpoint
@allow("GET")
async def list_models(request):
    """GET /v1/models: the served model and the LoRA adapters this tenant may use (OpenAI's list of
    Model objects, with vLLM's root and parent)."""
    rt = runtime.get_runtime(wait=False)
    if rt is None:
        return JsonResponse({"object": "list", "data": [model_object(runtime.served_model_name(), int(time.time()))]})
    cards = model_cards(rt.model_id, rt.created, str(rt.model_path), rt.adapters, cache_salt_of(request),
                        rt.engine.max_model_len)
    if rt.embeddings is not None:
        cards.append(embedding_card(rt.embeddings))
    return JsonResponse({"object": "list", "data": cards})


def embedding_card(service) -> dict:
    """The embedding model's Model object (max_model_len: its most tokens an input)."""
    return model_object(service.name, service.created, root=str(service.path), max_model_len=service.max_input_tokens)


@openai_endpoint
@allow("GET")
async def retrieve_model(request, model_id: str):
    """GET /v1/models/{id} (ids may contain '/'): the served model, an alias or an adapter, else 404."""
    rt = runtime.get_runtime(wait=False)
    if rt is None:
        return JsonResponse(find_model(model_id, runtime.served_model_name(), int(time.time())))
    if rt.embeddings is not None and model_id == rt.embeddings.name:
        return JsonResponse(embedding_card(rt.embeddings))
    return JsonResponse(find_model(model_id, rt.model_id, rt.created, str(rt.model_path), rt.adapters,
                                   cache_salt_of(request)))


@openai_endpoint(generates=True)
@allow("POST")
async def chat_completions(request):
    """POST /v1/chat/completions, blocking or streamed (SSE)."""
    started = time.perf_counter()
    req = await cpu_work(chat.parse, request.body)
    rt = await ready_runtime()
    call = await chat_call(req, rt, tenant=tenant_of(request), **_ids(request))
    return await respond(request, rt, call.prepared, call.wire, param=call.param, started=started)


@openai_endpoint(generates=True)
@allow("POST")
async def completions(request):
    """POST /v1/completions (legacy), blocking or streamed (SSE)."""
    started = time.perf_counter()
    req = await cpu_work(legacy_completions.parse, request.body)
    rt = await ready_runtime()
    call = await completions_call(req, rt, tenant=tenant_of(request), **_ids(request))
    return await respond(request, rt, call.prepared, call.wire, param=call.param, started=started)


@openai_endpoint(generates=True)
@allow("POST")
async def embeddings_view(request):
    """POST /v1/embeddings: the embedding model's vectors (OpenAI's shape: serving/embeddings.py); the
    rate limit is charged the inputs' tokens."""
    size = len(request.body)
    req = await light_work(embeddings_api.parse, size, request.body)
    rt = await ready_runtime()
    run = await embeddings_call(req, rt, tenant=tenant_of(request), size=size, **_ids(request))
    tokens = run.call.prompt_tokens
    await admit(request, reserve_tokens=tokens, used_tokens=lambda: tokens)
    record = current_record.get()
    if record is not None:
        record.embedded(run.service.name, tokens)
    vectors = await run.vectors()
    # The JSON's size: a float32's 4 bytes become about 12 characters as a float list (base64 less).
    body = await light_work(embeddings_api.response_json, sum(map(len, vectors)) * 3, run.call, run.service.name,
                            vectors)
    return HttpResponse(body, content_type="application/json")


@openai_endpoint
@allow("POST")
async def tokenize_view(request):
    """POST /tokenize: {prompt} or {messages} -> {tokens, count, max_model_len}."""
    return JsonResponse(await cpu_work(tokenize.tokenize, request.body, await ready_runtime()))


@openai_endpoint
@allow("POST")
async def detokenize_view(request):
    """POST /detokenize: {tokens} -> {prompt}."""
    return JsonResponse(await cpu_work(tokenize.detokenize, request.body, await ready_runtime()))


@openai_endpoint
async def not_implemented(request, **kwargs):
    """An OpenAI endpoint this server does not implement: 501 in the error shape, not to be retried."""
    raise ApiError(501, f"{request.method} {request.path} is an OpenAI endpoint this server does not "
                        "implement.", type="server_error", code="not_implemented",
                   headers={"x-should-retry": "false"})


@openai_endpoint
async def unknown_route(request, rest: str = ""):
    """Any other /v1/* path: 404 in OpenAI's error shape."""
    raise not_found(f"Unknown request URL: {request.method} {request.path}.", code="unknown_url")

