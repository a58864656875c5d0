"""Thin async views for Ollama's REST API (/api/*): parse, take the model from the registry, call the shared
pipeline, answer (errors in Ollama's shape).

Every view is an `openai_endpoint(error_shape=OLLAMA)` view: the same auth (`Authorization: Bearer`, which the
`ollama` client sends from OLLAMA_API_KEY), tenants, rate limits, lease settlement, request log and metrics as
the OpenAI routes, errors as `{"error": "..."}`. Model management (pull, delete, copy) needs an operator (an
admin key or a staff session: tenancy/auth.authenticate_operator) when METRALE_REQUIRE_AUTH is on. Generating
routes answer through `inference.http.views.respond` (NDJSON by default, one object with "stream": false); a
request with no messages / prompt / input only loads its model (done_reason "load", or "unload" with keep_alive
0: the registry lets the model go once idle, unless it is pinned).
"""
from __future__ import annotations

import time

from django.conf import settings
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.http import require_safe

from console.views import front_door
from inference.http.api import admit, openai_endpoint
from inference.http.request_context import current_record
from inference.http.surfaces import embeddings_call
from inference.http.views import allow, cache_salt_of, keep_alive_seconds, ready_model, respond
from inference.operations.model_specs import CHAT, EMBEDDING
from inference.operations.registry import process_registry
from inference.serving.errors import OLLAMA, ApiError, bad_request, not_found
from inference.serving.prepare import cpu_work, light_work, prepare
from inference.serving.sampling import check_token_ids
from inference.stored.objects import tenant_of
from inference.tenancy.auth import authenticate_operator

from . import embeddings, mapping, protocol
from .catalogue import capabilities
from .encoder import CHAT as CHAT_ANSWER
from .encoder import GENERATE, Timing, load_answer
from .listing import ps_body, show_body, tag_entries
from .names import check_new_name, resolve, untagged
from .pull import check_known, progress
from .wire import OllamaWire, ndjson_line

# The Ollama release whose API this server speaks (contracts-wave4 §1.7; clients gate features on it).
OLLAMA_VERSION = "0.32.15"


def _ids(request) -> dict:
    return {"request_id": getattr(request, "request_id", None), "cache_salt": cache_salt_of(request)}


async def _model(request, requested: str, route: str, kind: str, keep_alive, started: float):
    """(the loaded model, the name the pipeline takes, the answer's Timing) of a request's `model`; raises
    names.resolve's and ready_model's ApiErrors."""
    _, name = resolve(process_registry(), requested, route, kind)
    loading = time.perf_counter()
    model = await ready_model(request, name, keep_alive, kind)
    return model, name, Timing(started, load_s=time.perf_counter() - loading)


def _no_vision(model: str) -> ApiError:
    return bad_request(f'"{model}" does not support vision: it has no image input', "images",
                       code="unsupported_content_type")


def _check_capabilities(rt, req: dict, *, insert: bool = False) -> None:
    """400 (Ollama's words) for `think`, `tools` or a suffix the model cannot take."""
    found = capabilities(CHAT, rt.folder.model_type, rt.tokenizer)
    if req.get("think") not in (None, False) and "thinking" not in found:
        raise bad_request(f'"{req["model"]}" does not support thinking', "think")
    if req.get("tools") and "tools" not in found:
        raise bad_request(f'{req["model"]} does not support tools', "tools")
    if insert and "insert" not in found:
        raise bad_request(f'"{req["model"]}" does not support insert: its vocabulary has no fill-in-the-middle '
                          "tokens", "suffix")


async def _load_only(request, kind: str, req: dict, timing: Timing) -> JsonResponse:
    await admit(request, reserve_tokens=0, used_tokens=lambda: 0)
    reason = "unload" if keep_alive_seconds(req.get("keep_alive")) == 0 else "load"
    return JsonResponse(load_answer(kind, req["model"], reason, timing))


@openai_endpoint(generates=True, error_shape=OLLAMA)
@allow("POST")
async def chat(request):
    """POST /api/chat: NDJSON lines, or one object with "stream": false."""
    started = time.perf_counter()
    req = await cpu_work(protocol.parse_chat, request.body)
    rt, name, timing = await _model(request, req["model"], "chat", CHAT, req.get("keep_alive"), started)
    if any(m["images"] for m in req["messages"]):
        raise _no_vision(req["model"])
    if not req["messages"]:
        return await _load_only(request, CHAT_ANSWER, req, timing)
    _check_capabilities(rt, req)
    prepared = await prepare(mapping.chat_request(req, name), rt, **_ids(request))
    wire = OllamaWire(CHAT_ANSWER, req["model"], req["stream"], prepared, timing, logprobs=mapping.logprobs_of(req))
    return await respond(request, rt, prepared, wire, param="messages", started=started)


@openai_endpoint(generates=True, error_shape=OLLAMA)
@allow("POST")
async def generate(request):
    """POST /api/generate: NDJSON lines, or one object with "stream": false."""
    started = time.perf_counter()
    req = await cpu_work(protocol.parse_generate, request.body)
    rt, name, timing = await _model(request, req["model"], "generate", CHAT, req.get("keep_alive"), started)
    if req.get("images"):
        raise _no_vision(req["model"])
    if not req["prompt"] and not req.get("suffix"):
        return await _load_only(request, GENERATE, req, timing)
    _check_capabilities(rt, req, insert=bool(req.get("suffix")) and not req.get("template"))
    if req.get("context"):
        check_token_ids(req["context"], rt.tokenizer.vocab_size, "context")
    prepared = await prepare(mapping.generate_request(req, name), rt, **_ids(request))
    wire = OllamaWire(GENERATE, req["model"], req["stream"], prepared, timing, context=not req["raw"],
                      logprobs=mapping.logprobs_of(req))
    return await respond(request, rt, prepared, wire, param="prompt", started=started)


async def _embed(request, req: dict, texts: list[str], route: str, truncate: bool, dimensions: int | None = None):
    """(the vectors, the tokens embedded, the answer's Timing) of an embedding request's texts (none: the model
    only loads). Raises ApiError."""
    started = time.perf_counter()
    service, name, timing = await _model(request, req["model"], route, EMBEDDING, req.get("keep_alive"), started)
    if not texts:
        await admit(request, reserve_tokens=0, used_tokens=lambda: 0)
        return [], 0, timing
    run = await embeddings_call(embeddings.openai_request(name, texts, truncate, dimensions), service,
                                tenant=tenant_of(request), size=len(request.body), **_ids(request))
    tokens = run.call.prompt_tokens
    await admit(request, reserve_tokens=tokens, used_tokens=lambda: tokens)
    record = current_record.get()
    if record is not None:
        record.embedded(run.service.name, tokens)
    vectors = await run.vectors()
    timing.ended = time.perf_counter()
    return vectors, tokens, timing


@openai_endpoint(generates=True, error_shape=OLLAMA)
@allow("POST")
async def embed(request):
    """POST /api/embed: {model, embeddings (L2-normalized), total_duration, load_duration, prompt_eval_count}."""
    req = await light_work(protocol.parse_embed, len(request.body), request.body)
    vectors, tokens, timing = await _embed(request, req, req["input"], "embed", req["truncate"], req.get("dimensions"))
    metrics = {"total_duration": int((time.perf_counter() - timing.started) * 1e9),
               "load_duration": int(timing.load_s * 1e9), "prompt_eval_count": tokens}
    body = await light_work(embeddings.embed_json, sum(map(len, vectors)) * 3, req["model"], vectors, metrics)
    return HttpResponse(body, content_type="application/json")


@openai_endpoint(generates=True, error_shape=OLLAMA)
@allow("POST")
async def embeddings_view(request):
    """POST /api/embeddings (the older route): {embedding} of one prompt."""
    req = await light_work(protocol.parse_embeddings, len(request.body), request.body)
    texts = [req["prompt"]] if req["prompt"] else []
    vectors, _, _ = await _embed(request, req, texts, "embed", truncate=True)
    return HttpResponse(embeddings.embeddings_json(vectors[0] if vectors else None), content_type="application/json")


@openai_endpoint(error_shape=OLLAMA)
@allow("GET", "HEAD")
async def tags(request):
    """GET /api/tags: every served model (and copy), with its size, digest and details."""
    return JsonResponse({"models": await cpu_work(tag_entries, process_registry())})


@openai_endpoint(error_shape=OLLAMA)
@allow("POST")
async def show(request):
    """POST /api/show: a model's parameters, template, details, model_info and capabilities."""
    req = await cpu_work(protocol.parse_model, request.body)
    registry = process_registry()
    entry, _ = resolve(registry, req["model"], "show")
    return JsonResponse(await cpu_work(show_body, entry, registry.runtime(entry.name)))


@openai_endpoint(error_shape=OLLAMA)
@allow("GET", "HEAD")
async def ps(request):
    """GET /api/ps: the loaded models, longest time left first, with their size and expiry."""
    return JsonResponse({"models": await cpu_work(ps_body, process_registry(), time.time())})


@openai_endpoint(error_shape=OLLAMA)
@allow("GET", "HEAD")
async def version(request):
    """GET /api/version: the Ollama release whose API this server speaks."""
    return JsonResponse({"version": OLLAMA_VERSION})


async def _operator(request) -> None:
    """Model management needs an admin key or a staff session when auth is on (raises ApiError 401 / 403)."""
    if settings.METRALE["REQUIRE_AUTH"]:
        await authenticate_operator(request)


async def _ndjson(lines):
    try:
        async for obj in lines:
            yield ndjson_line(obj)
    except ApiError as exc:
        yield ndjson_line({"error": exc.message})


@openai_endpoint(error_shape=OLLAMA)
@allow("POST")
async def pull(request):
    """POST /api/pull: a catalogue model fetched and served, with progress lines (only the last with "stream": false)."""
    await _operator(request)
    req = await cpu_work(protocol.parse_pull, request.body)
    name = untagged(req["model"])
    check_known(name)
    lines = progress(process_registry(), name)
    if req["stream"]:
        return StreamingHttpResponse(_ndjson(lines), content_type="application/x-ndjson")
    last = {}
    async for obj in lines:
        last = obj
    return JsonResponse(last)


@openai_endpoint(error_shape=OLLAMA)
@allow("DELETE")
async def delete(request):
    """DELETE /api/delete: a copy, or a model pulled while the server runs, no longer served (200, no body)."""
    await _operator(request)
    req = await cpu_work(protocol.parse_model, request.body)
    registry = process_registry()
    _, name = resolve(registry, req["model"], "delete")
    try:
        registry.remove(name)
    except KeyError:
        raise not_found(f"model '{req['model']}' not found", code="model_not_found") from None
    except ValueError as exc:
        raise bad_request(f"model '{req['model']}' cannot be deleted: {exc}", "model") from None
    return HttpResponse(status=200, content_type="text/plain")


@openai_endpoint(error_shape=OLLAMA)
@allow("POST")
async def copy(request):
    """POST /api/copy: `destination` becomes another name of `source`'s model (200, no body)."""
    await _operator(request)
    req = await cpu_work(protocol.parse_copy, request.body)
    registry = process_registry()
    check_new_name(req["source"], "source")
    destination = check_new_name(req["destination"], "destination")
    _, source = resolve(registry, req["source"], "copy")
    try:
        registry.alias(destination, source)
    except KeyError:
        raise not_found(f'model "{req["source"]}" not found', code="model_not_found") from None
    except ValueError:
        raise bad_request(f'destination "{req["destination"]}" is invalid: it is a served model\'s own name',
                          "destination") from None
    return HttpResponse(status=200, content_type="text/plain")


@openai_endpoint(error_shape=OLLAMA)
async def not_implemented(request, **kwargs):
    """Ollama's routes that make models from uploads (create, push, blobs): 501 in Ollama's shape."""
    raise ApiError(501, f"{request.method} {request.path} is not supported by this server: its models come from its "
                        "catalogue (POST /api/pull) and its configuration (METRALE_MODELS)", type="server_error",
                   code="not_implemented", headers={"x-should-retry": "false"})


@openai_endpoint(error_shape=OLLAMA)
async def unknown_route(request, rest: str = ""):
    """Any other path under /api: 404 in Ollama's shape."""
    raise not_found(f"Unknown request URL: {request.method} {request.path}.", code="unknown_url")


def wants_html(request) -> bool:
    """Whether a request to / comes from a browser (it asks for text/html), not a client probing for Ollama."""
    return "text/html" in request.headers.get("Accept", "")


@require_safe
async def root(request):
    """GET / and HEAD /: "Ollama is running" (text/plain) to a client probing for Ollama; a browser (asking for
    HTML) gets the console's front door."""
    if wants_html(request):
        return await front_door(request)
    return HttpResponse("Ollama is running", content_type="text/plain; charset=utf-8")
