"""Thin async views for Ollama's REST API (/api/*): parse, take the model from the registry, call the shared
pipeline, answer (errors in Ollama's shape); the model routes are model_views.py's.

Every view is an `openai_endpoint(error_shape=OLLAMA)` view: the same auth (`Authorization: Bearer`, which the
`ollama` client sends from OLLAMA_API_KEY), tenants, rate limits, lease settlement, request log and metrics as
the OpenAI routes, errors as `{"error": "..."}`. Generating
routes answer through `inference.http.views.respond` (NDJSON by default, one object with "stream": false); a
request with no messages / prompt / input only loads its model (done_reason "load", or "unload" with keep_alive
0: the registry lets the model go once idle, unless it is pinned).
"""
from __future__ import annotations

import time

from django.http import HttpResponse, JsonResponse
from django.views.decorators.http import require_safe

from console.views import front_door
from inference.http.api import admit, openai_endpoint
from inference.http.views import (allow, embedded_vectors, keep_alive_seconds, ready_model,
                                  request_ids, respond)
from inference.operations.model_specs import CHAT, EMBEDDING
from inference.operations.registry import process_registry
from inference.serving.errors import OLLAMA, ApiError, bad_request, not_found
from inference.serving.prepare import cpu_work, light_work, prepare
from inference.serving.sampling import check_token_ids

from . import embeddings, mapping, protocol
from .catalogue import capabilities
from .encoder import CHAT as CHAT_ANSWER
from .encoder import GENERATE, Timing, load_answer
from .names import resolve
from .wire import OllamaWire

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
    prepared = await prepare(mapping.chat_request(req, name), rt, **request_ids(request))
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
    prepared = await prepare(mapping.generate_request(req, name), rt, **request_ids(request))
    wire = OllamaWire(GENERATE, req["model"], req["stream"], prepared, timing, context=not req["raw"],
                      logprobs=mapping.logprobs_of(req))
    return await respond(request, rt, prepared, wire, param="prompt", started=started)


async def _embed(request, req: dict, texts: list[str], route: str, truncate: bool, dimensions: int | None = None):
    """(the vectors, the tokens embedded, the answer's Timing, the EmbeddingService) of an embedding request's texts
    (none: the model only loads). Raises ApiError."""
    started = time.perf_counter()
    service, name, timing = await _model(request, req["model"], route, EMBEDDING, req.get("keep_alive"), started)
    if not texts:
        await admit(request, reserve_tokens=0, used_tokens=lambda: 0)
        return [], 0, timing, service
    _, vectors, tokens = await embedded_vectors(request, embeddings.openai_request(name, texts, truncate, dimensions),
                                                service, len(request.body))
    timing.ended = time.perf_counter()
    return vectors, tokens, timing, service


@openai_endpoint(generates=True, error_shape=OLLAMA)
@allow("POST")
async def embed(request):
    """POST /api/embed: {model, embeddings (L2-normalized), total_duration, load_duration, prompt_eval_count}."""
    req = await light_work(protocol.parse_embed, len(request.body), request.body)
    vectors, tokens, timing, service = await _embed(request, req, req["input"], "embed", req["truncate"],
                                                    req.get("dimensions"))
    metrics = {"total_duration": int((time.perf_counter() - timing.started) * 1e9),
               "load_duration": int(timing.load_s * 1e9), "prompt_eval_count": tokens}
    body = await light_work(embeddings.embed_json, sum(map(len, vectors)) * 3, req["model"], vectors, metrics,
                            service.normalizes)
    return HttpResponse(body, content_type="application/json")


@openai_endpoint(generates=True, error_shape=OLLAMA)
@allow("POST")
async def embeddings_view(request):
    """POST /api/embeddings (the older route): {embedding} of one prompt."""
    req = await light_work(protocol.parse_embeddings, len(request.body), request.body)
    texts = [req["prompt"]] if req["prompt"] else []
    vectors, _, _, _ = await _embed(request, req, texts, "embed", truncate=True)
    return HttpResponse(embeddings.embeddings_json(vectors[0] if vectors else None), content_type="application/json")


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
