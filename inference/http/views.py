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
from ..operations.model_settings import SettingError, parse_keep_alive
from ..operations.model_specs import CHAT, EMBEDDING
from ..operations.registry import ModelBudgetBusy, ModelLoadFailed, process_registry
from .api import admit, openai_endpoint
from .surfaces import chat_call, completions_call, embeddings_call
from ..engine.outputs import EngineOverloaded, RequestRejected
from .request_context import current_record
from ..serving import chat, tokenize
from ..serving import embeddings as embeddings_api
from ..serving import completions as legacy_completions
from ..serving.choices import Choices
from ..serving.errors import ApiError, not_found
from ..serving.model_names import find_model, model_cards, model_object, unknown_model, wrong_kind
from ..serving.prepare import Prepared, cpu_work, light_work
from ..stored.objects import tenant_of

log = logging.getLogger("metrale.api")


def allow(*methods: str):
    """Answer any other HTTP method with 405 in OpenAI's error shape (and an Allow header). GET admits HEAD too
    (RFC 9110 9.3.2: the GET answer's headers; the server sends no body)."""
    accepted = (*methods, "HEAD") if "GET" in methods else methods

    def wrap(view):
        @functools.wraps(view)
        async def checked(request, *args, **kwargs):
            if request.method not in accepted:
                raise ApiError(405, f"{request.method} is not allowed on {request.path}; use "
                                    f"{' or '.join(methods)}.", code="method_not_allowed",
                               headers={"Allow": ", ".join(methods)})
            return await view(request, *args, **kwargs)
        return checked
    return wrap


async def ready_model(request, model: str = "", keep_alive=None, kind: str = CHAT):
    """The loaded model a request's `model` names on a route serving `kind` (CHAT: a Runtime;
    EMBEDDING: an EmbeddingService), loaded first if it is not (operations/registry.py), and held
    until the request's answer ends (http/api.openai_endpoint releases `request.model_holds`).

    keep_alive: the request's `keep_alive` field (Ollama's meaning; None: the model's own). While a
    swap that drains the old model first has none installed, the request waits for the new one: up to
    METRALE["SWAP_WAIT_S"] seconds, at most METRALE["SWAP_WAIT_MAX"] requests at once.
    Raises ApiError: 404 model_not_found naming the model (serving/model_names.unknown_model); 400
    model_not_embedding / model_not_chat for a model of the other kind; 503 with Retry-After:
    model_load_failed (the model and the cause), model_budget_busy, model_not_loaded past a swap's wait.
    """
    hold = await hold_model(process_registry(), model, kind, keep_alive, cache_salt_of(request))
    holds = getattr(request, "model_holds", None)
    if holds is None:
        holds = request.model_holds = []
    holds.append(hold)
    return hold.model


async def hold_model(registry, model: str, kind: str = CHAT, keep_alive=None, cache_salt: str = ""):
    """A Hold (operations/registry.Hold) on the model `model` names in `registry`, loaded first if needed;
    the caller releases it. What ready_model raises (ApiError)."""
    entry = registry.find(model, kind)
    if entry is None:
        raise unknown_model(model, registry, cache_salt, kind)
    if entry.kind != kind:
        raise wrong_kind(entry.name, kind, registry)
    if entry.unavailable is not None:
        entry = await _wait_for_swap(registry, entry) or entry
        if entry.unavailable is not None or entry.name not in registry.entries:
            raise ApiError(503, f"The model is not loaded: {entry.unavailable or 'it was swapped'}; retry shortly.",
                           type="server_error", code="model_not_loaded", headers={"Retry-After": "5"})
    seconds = keep_alive_seconds(keep_alive)
    try:
        return await registry.acquire(entry, seconds)
    except ModelLoadFailed as exc:
        code = "model_budget_busy" if isinstance(exc, ModelBudgetBusy) else "model_load_failed"
        raise ApiError(503, str(exc), type="server_error", code=code, param="model",
                       headers={"Retry-After": "5"}) from exc


async def ready_runtime(request, model: str = "", keep_alive=None):
    """The chat model (a Runtime) a request names: ready_model with kind CHAT."""
    return await ready_model(request, model, keep_alive, CHAT)


def keep_alive_seconds(value) -> float | None:
    """A request's `keep_alive` in seconds (None when absent). Raises ApiError 400 naming the field."""
    if value is None:
        return None
    try:
        return parse_keep_alive(value)
    except SettingError as exc:
        raise ApiError(400, str(exc), param="keep_alive", code="invalid_keep_alive") from exc


_swap_waiters = 0


async def _wait_for_swap(registry, entry):
    """The entry a drain-first swap installs in `entry`'s place, polled every 50 ms; None past
    SWAP_WAIT_S or when SWAP_WAIT_MAX requests already wait."""
    global _swap_waiters
    limits = settings.METRALE
    if _swap_waiters >= limits["SWAP_WAIT_MAX"]:
        return None
    _swap_waiters += 1
    try:
        deadline = time.monotonic() + limits["SWAP_WAIT_S"]
        current = entry
        while current.unavailable is not None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            current = registry.default(entry.kind) if entry.name not in registry.entries else registry.entries[entry.name]
        return current
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


def sse_response(frames, content_type: str = "text/event-stream") -> StreamingHttpResponse:
    """A Server-Sent Events response over async `frames` (bytes), unbuffered by proxies (`content_type`: another
    streamed format's, e.g. Ollama's application/x-ndjson)."""
    resp = StreamingHttpResponse(frames, content_type=content_type)
    resp["Cache-Control"] = "no-cache"
    resp["X-Accel-Buffering"] = "no"
    return resp


async def respond(request, rt, prepared: Prepared, wire, *, param: str, started: float):
    """Admit, submit and answer one prepared generating request: the flow every generating route
    shares. wire: the surface's encoder (`stream`, `frames(run)`, `body(run)`, and `media_type` when its
    stream is not Server-Sent Events); param: the field a refused submission names. Raises ApiError (429 from admission, 400/503 from the engine's
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
        return sse_response(wire.frames(run), getattr(wire, "media_type", "text/event-stream"))
    resp = JsonResponse(await wire.body(run))
    resp["Server-Timing"] = _server_timing(run, started, prepared_at)
    return resp


def request_ids(request) -> dict:
    """The engine's names for `request`'s work: {"request_id": its id (request_context) or None, "cache_salt": its
    tenant's prefix-cache salt}, as prepare / the surfaces' calls take them."""
    return {"request_id": getattr(request, "request_id", None), "cache_salt": cache_salt_of(request)}


async def health(request):
    """GET /health: 200 {"status": "ready", "model", "system_fingerprint", "adapters", "swap", "models"} once the
    default model is loaded ("models": each configured model's state); 503 {"status": "swapping"} (Retry-After)
    while a swap drains it first, else {"status": "loading"} or {"status": "failed", "error"}."""
    state, error = runtime.status()
    registry = process_registry()
    rt = registry.runtime()
    models = {e["id"]: e["state"] for e in registry.states()}
    if state == "ready":
        if rt is None:  # the default model is an embedding model, or loads on demand
            default = registry.default() or registry.default(EMBEDDING)
            return JsonResponse({"status": "ready", "model": default.name, "models": models})
        return JsonResponse({"status": "ready", "model": rt.model_id, "system_fingerprint": rt.fingerprint or None,
                             "adapters": sorted(rt.adapters), "swap": swap.status(registry), "models": models})
    if state == "swapping":
        return JsonResponse({"status": "swapping", "error": error, "swap": swap.status(registry)}, status=503,
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
    """GET /v1/models: every configured model (OpenAI's Model objects, with vLLM's root and parent, and the
    registry's extra fields: kind, state, error, pinned, keep_alive, resident_bytes, ...), then the LoRA
    adapters of each loaded chat model that this tenant may use."""
    registry = process_registry()
    salt = cache_salt_of(request)
    cards = []
    for state in registry.states():
        loaded = registry.runtime(state["id"])
        cards += model_entry_cards(state, loaded, salt)
    return JsonResponse({"object": "list", "data": cards})


def model_entry_cards(state: dict, loaded, cache_salt: str) -> list[dict]:
    """The Model objects of one registry entry: the model (its state in extra fields) and, for a loaded
    chat model, its adapters this tenant may use."""
    extra = {k: state[k] for k in ("kind", "state", "error", "pinned", "keep_alive", "resident_bytes",
                                   "kv_cache_bytes", "requests_running")}
    if loaded is None:
        return [model_object(state["id"], state["loaded_at"] or 0, root=state["source"]) | extra]
    if state["kind"] == EMBEDDING:
        return [embedding_card(loaded) | extra]
    cards = model_cards(loaded.model_id, loaded.created, str(loaded.model_path), loaded.adapters, cache_salt,
                        loaded.engine.max_model_len)
    cards[0] |= extra
    return cards


def embedding_card(service) -> dict:
    """The embedding model's Model object (max_model_len: its most tokens an input)."""
    return model_object(service.name, service.created, root=str(service.path), max_model_len=service.max_input_tokens)


@openai_endpoint
@allow("GET")
async def retrieve_model(request, model_id: str):
    """GET /v1/models/{id} (ids may contain '/'): a configured model (its state in extra fields), an alias
    or an adapter, else 404."""
    registry = process_registry()
    entry = registry.find(model_id, CHAT) or registry.find(model_id, EMBEDDING)
    if entry is None:
        raise not_found(f"The model '{model_id}' does not exist.", code="model_not_found", param="model")
    loaded = registry.runtime(entry.name)
    if loaded is not None and entry.kind == CHAT:
        card = find_model(model_id, loaded.model_id, loaded.created, str(loaded.model_path), loaded.adapters,
                          cache_salt_of(request))
        if card["id"] != entry.name:
            return JsonResponse(card)
    cards = model_entry_cards(registry.state_of(entry), loaded, cache_salt_of(request))
    return JsonResponse(cards[0] | {"id": model_id} if model_id != entry.name else cards[0])


@openai_endpoint(generates=True)
@allow("POST")
async def chat_completions(request):
    """POST /v1/chat/completions, blocking or streamed (SSE)."""
    started = time.perf_counter()
    size = len(request.body)
    req = await light_work(chat.parse, size, request.body)
    rt = await ready_runtime(request, req["model"], req.get("keep_alive"))
    call = await chat_call(req, rt, tenant=tenant_of(request), size=size, **request_ids(request))
    return await respond(request, rt, call.prepared, call.wire, param=call.param, started=started)


@openai_endpoint(generates=True)
@allow("POST")
async def completions(request):
    """POST /v1/completions (legacy), blocking or streamed (SSE)."""
    started = time.perf_counter()
    size = len(request.body)
    req = await light_work(legacy_completions.parse, size, request.body)
    rt = await ready_runtime(request, req["model"], req.get("keep_alive"))
    call = await completions_call(req, rt, tenant=tenant_of(request), size=size, **request_ids(request))
    return await respond(request, rt, call.prepared, call.wire, param=call.param, started=started)


async def embedded_vectors(request, req: dict, service, size: int) -> tuple[object, list, int]:
    """An embeddings request `req` (OpenAI's validated body, serving/embeddings.py) run on `service` for the
    generating view of `request` (`size`: its body's bytes): the rate limit debited the inputs' tokens, the request
    log told them. Returns (the run (surfaces.embeddings_call), its vectors: one list of floats an input, the tokens
    embedded). Raises ApiError (the inputs' faults, the rate limit). Every embedding route's one way in."""
    run = await embeddings_call(req, service, tenant=tenant_of(request), size=size, **request_ids(request))
    tokens = run.call.prompt_tokens
    await admit(request, reserve_tokens=tokens, used_tokens=lambda: tokens)
    record = current_record.get()
    if record is not None:
        record.embedded(run.service.name, tokens)
    return run, await run.vectors(), tokens


@openai_endpoint(generates=True)
@allow("POST")
async def embeddings_view(request):
    """POST /v1/embeddings: the embedding model's vectors (OpenAI's shape: serving/embeddings.py); the
    rate limit is charged the inputs' tokens."""
    size = len(request.body)
    req = await light_work(embeddings_api.parse, size, request.body)
    service = await ready_model(request, req["model"], req.get("keep_alive"), EMBEDDING)
    run, vectors, _ = await embedded_vectors(request, req, service, size)
    # The JSON's size: a float32's 4 bytes become about 12 characters as a float list (base64 less).
    body = await light_work(embeddings_api.response_json, sum(map(len, vectors)) * 3, run.call, run.service.name,
                            vectors)
    return HttpResponse(body, content_type="application/json")


@openai_endpoint
@allow("POST")
async def tokenize_view(request):
    """POST /tokenize: {prompt} or {messages} -> {tokens, count, max_model_len}."""
    req = await cpu_work(tokenize.parse_tokenize, request.body)
    return JsonResponse(await cpu_work(tokenize.tokenize, req, await ready_runtime(request, req["model"])))


@openai_endpoint
@allow("POST")
async def detokenize_view(request):
    """POST /detokenize: {tokens} -> {prompt}."""
    req = await cpu_work(tokenize.parse_detokenize, request.body)
    return JsonResponse(await cpu_work(tokenize.detokenize, req, await ready_runtime(request, req["model"])))


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

