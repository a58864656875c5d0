"""Thin async views of Ollama's model routes: /api/tags, /api/show, /api/ps, /api/version, and the model management
routes /api/pull, /api/delete, /api/copy (an admin key or a staff session when METRALE_REQUIRE_AUTH is on:
tenancy/auth.authenticate_operator). Errors in Ollama's shape (openai_endpoint(error_shape=OLLAMA)); the bodies are
listing.py's and pull.py's.
"""
from __future__ import annotations

import time

from django.conf import settings
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse

from inference.http.api import openai_endpoint
from inference.http.views import allow
from inference.operations.registry import process_registry
from inference.serving.errors import OLLAMA, ApiError, bad_request, not_found
from inference.serving.prepare import cpu_work
from inference.tenancy.auth import authenticate_operator

from . import protocol
from .listing import ps_body, show_body, tag_entries
from .names import check_new_name, resolve, untagged
from .pull import check_known, progress
from .wire import ndjson_line

# The Ollama release whose API this server speaks (contracts-wave4 §1.7; clients gate features on it).
OLLAMA_VERSION = "0.32.15"


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
