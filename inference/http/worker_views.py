"""What routers read from a worker, answered as vLLM answers it (contracts-wave4 section 3; vllm-router 0.1.17).

- GET /get_server_info: the served model's identity and KV block size (kv_aware discovery: replicas
  share one index when model_id and kv_block_size agree; instance_id tells processes apart).
- GET /kv_event_sources: vLLM's map of data-parallel rank -> the ZMQ endpoints of its KV events
  (operations/kv_events.py), a wildcard host replaced by the one the router reached this replica at;
  {} when METRALE_KV_EVENTS is off.
- GET /get_load: {"load": requests running or waiting} (power_of_two's poll).
- POST /v1/chat/completions/render and POST /v1/completions/render: vLLM's render routes, which
  vllm-router calls on every worker, with the client's headers, to score a request against the KV
  events: the ids of the prompt the same body would run, after the caller's namespace block
  (operations/kv_wire.py: how tenants stay apart in a router's index). Authenticated, never debited:
  the request they precede is.

The first three are open, like /health (a router probes them without a key); they name the model, its
folder, this process and its event ports, nothing a tenant stored.
"""
from __future__ import annotations

import functools

from django.http import JsonResponse
from django.http.request import split_domain_port

from ..operations.heartbeat import process_id
from ..operations.kv_wire import routing_token_ids
from ..operations.model_specs import CHAT
from ..operations.registry import process_registry
from ..operations.runtime import engine_config
from ..serving import chat
from ..serving import completions as legacy_completions
from ..serving.prepare import completion_ids, cpu_work, prompt_ids
from .api import openai_endpoint
from .views import allow, cache_salt_of, ready_runtime


def probe(view):
    """An open GET route a router probes: any other method is answered 405 (with Allow), as JSON."""

    @functools.wraps(view)
    async def checked(request):
        if request.method not in ("GET", "HEAD"):
            return JsonResponse({"error": f"{request.method} is not allowed on {request.path}; use GET."},
                                status=405, headers={"Allow": "GET"})
        return await view(request)
    return checked


@probe
async def get_server_info(request):
    """GET /get_server_info: {model_id, model_path, instance_id, kv_block_size, effective_attention_block_size}
    of the default chat model; 404 (vLLM's error body) when no chat model is configured."""
    entry = process_registry().default(CHAT)
    if entry is None:
        return JsonResponse({"error": "no chat model is configured"}, status=404)
    block_size = engine_config().block_size
    return JsonResponse({"model_id": entry.name, "model_path": str(entry.spec.folder), "instance_id": process_id(),
                         "kv_block_size": block_size, "effective_attention_block_size": block_size})


@probe
async def kv_event_sources(request):
    """GET /kv_event_sources: {"0": {endpoint, replay_endpoint?, topic, hwm, buffer_steps, publisher, encoding,
    schema_version, enable_kv_cache_events}}, or {} without KV events."""
    publisher = process_registry().loader.kv_events
    if publisher is None:
        return JsonResponse({})
    host, _ = split_domain_port(request.get_host())
    return JsonResponse(publisher.sources(host.strip("[]")))


@probe
async def get_load(request):
    """GET /get_load: {"load": the chat models' requests running or waiting}."""
    load = 0
    for _, model in process_registry().loaded_models(CHAT):
        load += model.engine.num_running + model.engine.num_waiting
    return JsonResponse({"load": load})


def _rendered(request, rt, ids: list[int]) -> dict:
    return {"request_id": getattr(request, "request_id", None), "model": rt.model_id,
            "token_ids": routing_token_ids(cache_salt_of(request), ids, rt.block_size, rt.tokenizer.vocab_size),
            "features": None}


@openai_endpoint(debits=False)
@allow("POST")
async def render_chat(request):
    """POST /v1/chat/completions/render: {request_id, model, token_ids, features}. Errors as the chat route's."""
    req = await cpu_work(chat.parse, request.body)
    rt = await ready_runtime(request, req["model"])
    return JsonResponse(_rendered(request, rt, await prompt_ids(chat.generation_request(req), rt)))


@openai_endpoint(debits=False)
@allow("POST")
async def render_completions(request):
    """POST /v1/completions/render: one {request_id, model, token_ids, features} per prompt (vLLM's list).
    Errors as the completions route's."""
    req = await cpu_work(legacy_completions.parse, request.body)
    rt = await ready_runtime(request, req["model"])
    ids = await completion_ids(legacy_completions.generation_request(req), rt)
    return JsonResponse([_rendered(request, rt, one) for one in ids], safe=False)
