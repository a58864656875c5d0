"""Thin async views: parse, authorize, call serving, stream.

Every /v1/*, /tokenize and /detokenize view is wrapped by `openai_endpoint` (auth, rate
limits, ApiError -> OpenAI's error JSON); `allow` answers other methods with a 405 in
that shape. Generating views admit a rate-limit lease once the prompt's size is known
and settle it with the real usage when generation ends, however it ends.
"""
from __future__ import annotations

import functools
import logging
import time

from django.http import JsonResponse, StreamingHttpResponse

from . import runtime
from .api import admit, openai_endpoint
from .engine.outputs import RequestRejected
from .serving import chat, structured, tokenize
from .serving import completions as legacy_completions
from .serving.errors import ApiError, not_found
from .serving.model_names import find_model, model_object
from .stored_completions import delete_chat_completion, get_chat_completion, save_chat_completion

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


def _ready_runtime():
    rt = runtime.get_runtime(wait=False)
    if rt is None:
        state, error = runtime.status()
        msg = "The model is still loading; retry shortly." if state != "failed" else f"The model failed to load: {error}"
        raise ApiError(503, msg, type="server_error", code="model_not_ready", headers={"Retry-After": "5"})
    return rt


def _rejected(exc: RequestRejected, param: str) -> ApiError:
    return ApiError(400, f"The request cannot be served: {exc}.", param=param, code="context_length_exceeded")


def _server_timing(prepared, started: float, prepared_at: float) -> str:
    """Server-Timing (W3C) of a blocking request, in ms: `prep` (parse, validate, template, tokenize,
    admit), `engine` (submit to the last engine event) and `view` (all of the view)."""
    total_ms = (time.perf_counter() - started) * 1000
    prep_ms = (prepared_at - started) * 1000
    engine_ms = (prepared.engine_s or 0.0) * 1000
    return f"prep;dur={prep_ms:.2f}, engine;dur={engine_ms:.2f}, view;dur={total_ms:.2f}"


async def _generate(request, module, param: str):
    """The shared body of the generating views: `module` is serving.chat or serving.completions."""
    started = time.perf_counter()
    req = module.parse(request.body)
    rt = _ready_runtime()
    salt = request.principal.prefix_cache_salt if getattr(request, "principal", None) else ""
    prepared = module.prepare(req, rt, request_id=getattr(request, "request_id", None), cache_salt=salt)
    await structured.constrain(req, rt, prepared.inputs)
    lease = await admit(request, reserve_tokens=prepared.reserve_tokens, timeout_s=prepared.timeout_s)
    prepared_at = time.perf_counter()
    extra = {"save": save_chat_completion} if module is chat else {}
    if not prepared.stream:
        try:
            body = await module.complete(rt, prepared, **extra)
        except RequestRejected as exc:
            raise _rejected(exc, param) from exc
        finally:
            await lease.release(prepared.usage.total_tokens)
        resp = JsonResponse(body)
        resp["Server-Timing"] = _server_timing(prepared, started, prepared_at)
        return resp
    frames = module.stream(rt, prepared, **extra)
    try:
        # Pull the first frame now: it submits the engine requests, so one the engine refuses is a
        # 400, not a broken stream.
        first = await anext(frames)
    except RequestRejected as exc:
        await lease.release(prepared.usage.total_tokens)
        raise _rejected(exc, param) from exc
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


async def health(request):
    """GET /health: 200 {"status": "ready", "model"} once loaded, else 503 {"status": "loading"}."""
    state, error = runtime.status()
    if state == "ready":
        return JsonResponse({"status": "ready", "model": runtime.served_model_name()})
    body = {"status": "failed", "error": error} if state == "failed" else {"status": "loading"}
    return JsonResponse(body, status=503)


@openai_endpoint
@allow("GET")
async def list_models(request):
    """GET /v1/models: the served model (OpenAI's list of Model objects)."""
    rt = runtime.get_runtime(wait=False)
    created = rt.created if rt else int(time.time())
    return JsonResponse({"object": "list", "data": [model_object(runtime.served_model_name(), created)]})


@openai_endpoint
@allow("GET")
async def retrieve_model(request, model_id: str):
    """GET /v1/models/{id} (ids may contain '/'): the served model or an alias, else 404."""
    rt = runtime.get_runtime(wait=False)
    created = rt.created if rt else int(time.time())
    return JsonResponse(find_model(model_id, runtime.served_model_name(), created))


@openai_endpoint(generates=True)
@allow("POST")
async def chat_completions(request):
    """POST /v1/chat/completions, blocking or streamed (SSE)."""
    return await _generate(request, chat, "messages")


@openai_endpoint(generates=True)
@allow("POST")
async def completions(request):
    """POST /v1/completions (legacy), blocking or streamed (SSE)."""
    return await _generate(request, legacy_completions, "prompt")


@openai_endpoint
@allow("GET", "DELETE")
async def stored_chat_completion(request, completion_id: str):
    """GET /v1/chat/completions/{id}: a completion made with `store: true` (404 otherwise); DELETE removes it."""
    if request.method == "DELETE":
        return JsonResponse(await delete_chat_completion(completion_id))
    return JsonResponse(await get_chat_completion(completion_id))


@openai_endpoint
@allow("POST")
async def tokenize_view(request):
    """POST /tokenize: {prompt} or {messages} -> {tokens, count, max_model_len}."""
    return JsonResponse(tokenize.tokenize(request.body, _ready_runtime()))


@openai_endpoint
@allow("POST")
async def detokenize_view(request):
    """POST /detokenize: {tokens} -> {prompt}."""
    return JsonResponse(tokenize.detokenize(request.body, _ready_runtime()))


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

