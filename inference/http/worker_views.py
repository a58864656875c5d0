"""What routers read from a worker, answered as vLLM and SGLang answer it (contracts-wave4 section 3;
vllm-router 0.1.17, sglang-router 0.3.2).

- GET /get_server_info: the served model's identity and KV block size (kv_aware discovery: replicas
  share one index when model_id and kv_block_size agree; instance_id tells processes apart).
- GET /server_info: SGLang's newer name (sglang-router reads it): /get_server_info's body and the
  SGLang keys true of this server (served_model_name, tokenizer_path, dp_size 1, tp_size 1,
  max_running_requests).
- GET /get_model_info and GET /model_info (SGLang's names; vllm-router passes a client's
  /get_model_info through to its first worker): the default chat model's folder, is_generation, and the
  other keys of SGLang's body that hold here.
- GET /kv_event_sources: vLLM's map of data-parallel rank -> the ZMQ endpoints of its KV events
  (operations/kv_events.py), a wildcard host replaced by the one the router reached this replica at;
  {} when METRALE_KV_EVENTS is off.
- GET /get_load: {"load": requests running or waiting} (power_of_two's poll).
- GET /health_generate: SGLang's deep health check: 200 once the default chat model has generated one
  token (greedy, through the same preparation and submission as /v1/completions), 503 when it cannot
  within HEALTH_GENERATE_TIMEOUT_S.
- POST /flush_cache: SGLang's cache flush (a router's own /flush_cache fans out to every worker):
  each loaded chat model forgets the prefix-cache blocks no running request holds, between engine
  steps, and the KV event subscribers hear of it. It changes state, so with METRALE_REQUIRE_AUTH on
  it takes an operator's credentials (an admin key or a staff session); open with auth off.
- POST /v1/chat/completions/render and POST /v1/completions/render: vLLM's render routes, which
  vllm-router calls on every worker, with the client's headers, to score a request against the KV
  events: the ids of the prompt the same body would run, after the caller's namespace block
  (operations/kv_wire.py: how tenants stay apart in a router's index). Authenticated, never debited:
  the request they precede is.

The GET routes are open, like /health (a router probes them without a key); they name the model, its
folder, this process and its event ports, nothing a tenant stored. Errors are vLLM's {"error": message}.
"""
from __future__ import annotations

import asyncio
import functools
import json
import logging

from django.conf import settings
from django.http import JsonResponse
from django.http.request import split_domain_port
from django.views.decorators.csrf import csrf_exempt

from ..engine.model_folder import ModelFolder
from ..engine.outputs import EngineOverloaded, RequestRejected
from ..operations.heartbeat import process_id
from ..operations.kv_wire import routing_token_ids
from ..operations.model_specs import CHAT
from ..operations.registry import process_registry
from ..operations.runtime import engine_config
from ..serving import chat
from ..serving import completions as legacy_completions
from ..serving.choices import Choices
from ..serving.deltas import Error, Finish
from ..serving.errors import ApiError
from ..serving.prepare import completion_ids, cpu_work, prompt_ids
from ..tenancy.auth import authenticate_operator
from .api import error_response, openai_endpoint
from .surfaces import completions_call
from .views import allow, cache_salt_of, ready_runtime

log = logging.getLogger("metrale.api")

# How long GET /health_generate waits for its token, in seconds: SGLang waits up to 20 (its
# HEALTH_CHECK_TIMEOUT), but a router gives up on a health check after 5 (vllm-router's and
# sglang-router's --health-check-timeout-secs).
HEALTH_GENERATE_TIMEOUT_S = 4.0
# The prefix-cache salt of /health_generate's request: no tenant's, so its blocks serve no tenant.
HEALTH_GENERATE_SALT = "metrale:health_generate"


def only(method: str):
    """A worker route answering `method` alone (GET admits HEAD too): any other method gets 405 with Allow, in
    vLLM's {"error": message} shape."""
    accepted = ("GET", "HEAD") if method == "GET" else (method,)

    def decorate(view):
        @functools.wraps(view)
        async def checked(request):
            if request.method not in accepted:
                return JsonResponse({"error": f"{request.method} is not allowed on {request.path}; use {method}."},
                                    status=405, headers={"Allow": method})
            return await view(request)
        return checked
    return decorate


probe = only("GET")  # an open GET route a router probes


def _no_chat_model() -> JsonResponse:
    return JsonResponse({"error": "no chat model is configured"}, status=404)


def _server_info(entry) -> dict:
    block_size = engine_config().block_size
    return {"model_id": entry.name, "model_path": str(entry.spec.folder), "instance_id": process_id(),
            "kv_block_size": block_size, "effective_attention_block_size": block_size}


@probe
async def get_server_info(request):
    """GET /get_server_info: {model_id, model_path, instance_id, kv_block_size, effective_attention_block_size}
    of the default chat model; 404 (vLLM's error body) when no chat model is configured."""
    entry = process_registry().default(CHAT)
    if entry is None:
        return _no_chat_model()
    return JsonResponse(_server_info(entry))


@probe
async def server_info(request):
    """GET /server_info (SGLang's newer name, which sglang-router reads): /get_server_info's body plus SGLang's
    keys that hold for this server: served_model_name (the served name), tokenizer_path (the model's folder:
    its tokenizer is there), dp_size 1 and tp_size 1 (one engine per process, on one device: sglang-router
    expands no data-parallel ranks), max_running_requests (METRALE_MAX_NUM_SEQS: the most sequences a step
    runs). 404 as /get_server_info's."""
    entry = process_registry().default(CHAT)
    if entry is None:
        return _no_chat_model()
    return JsonResponse(_server_info(entry) | {
        "served_model_name": entry.name, "tokenizer_path": str(entry.spec.folder), "dp_size": 1, "tp_size": 1,
        "max_running_requests": engine_config().max_num_seqs})


@probe
async def get_model_info(request):
    """GET /get_model_info and GET /model_info: SGLang's body for the default chat model: {model_path,
    tokenizer_path (both its folder), is_generation (true), preferred_sampling_params (null: there is no
    such setting; requests default to generation_config.json's values), weight_version (null: weights are
    never updated in place), has_image_understanding and has_audio_understanding (false: text only),
    model_type and architectures (config.json's; null when it lacks them)}. 404 as /get_server_info's."""
    entry = process_registry().default(CHAT)
    if entry is None:
        return _no_chat_model()
    folder = ModelFolder.read(entry.spec.folder)
    architectures = (folder.config or {}).get("architectures")
    if not (isinstance(architectures, list) and all(isinstance(a, str) for a in architectures)):
        architectures = None
    path = str(entry.spec.folder)
    return JsonResponse({"model_path": path, "tokenizer_path": path, "is_generation": True,
                         "preferred_sampling_params": None, "weight_version": None,
                         "has_image_understanding": False, "has_audio_understanding": False,
                         "model_type": folder.model_type or None, "architectures": architectures})


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


def _unavailable(message: str) -> JsonResponse:
    return JsonResponse({"error": message}, status=503)


async def _one_token(request, rt) -> str | None:
    """Run a one-token greedy completion of a one-token prompt on `rt` through /v1/completions' preparation
    and submission (surfaces.completions_call, serving/choices.Choices), without a tenant's admission: None
    once a token came, else why not. Raises what completions_call and Choices raise (ApiError,
    RequestRejected, EngineOverloaded)."""
    bos = rt.tokenizer.bos_token_id
    body = {"model": rt.model_id, "prompt": [bos if bos is not None else 0], "max_tokens": 1, "temperature": 0,
            "timeout": HEALTH_GENERATE_TIMEOUT_S}
    req = legacy_completions.parse(json.dumps(body).encode())
    call = await completions_call(req, rt, tenant=None, request_id=getattr(request, "request_id", None),
                                  cache_salt=HEALTH_GENERATE_SALT)
    run = Choices(rt.engine, rt.tokenizer, call.prepared)
    async for _, delta in run.merged():
        if isinstance(delta, Error):
            return delta.message
        if isinstance(delta, Finish):  # stop (the token was EOS) or length (the one token asked for)
            return None if delta.reason in ("stop", "length") else f"the generation ended: {delta.reason}"
    return "the generation ended without a token"


@probe
async def health_generate(request):
    """GET /health_generate: 200 {} once the default chat model has generated one token (SGLang's check that the
    engine really steps, not only that the process answers); 503 {"error": why} when the model is not loaded
    (never loaded for a probe), the engine refuses or fails the request, or no token comes within
    HEALTH_GENERATE_TIMEOUT_S (the request is then aborted)."""
    rt = process_registry().runtime()
    if rt is None:
        return _unavailable("the default chat model is not loaded")
    try:
        async with asyncio.timeout(HEALTH_GENERATE_TIMEOUT_S):
            failure = await _one_token(request, rt)
    except TimeoutError:
        failure = f"no token within {HEALTH_GENERATE_TIMEOUT_S:g} s"
    except (ApiError, RequestRejected, EngineOverloaded) as exc:
        failure = str(exc)
    if failure is not None:
        log.warning("health_generate: the default chat model %s did not generate: %s", rt.model_id, failure)
        return _unavailable(f"the default chat model {rt.model_id} did not generate: {failure}")
    return JsonResponse({})


@csrf_exempt  # an operator's session call is CSRF-checked by authenticate_operator; a bearer call has no cookie
@only("POST")
async def flush_cache(request):
    """POST /flush_cache: 200 {} once every loaded chat model has forgotten its prefix-cache blocks that no
    running request holds (AsyncEngine.reset_prefix_cache: on the engine's thread, between steps; SGLang's
    flush_cache and vLLM's reset_prefix_cache, which refuse while requests run, where this flushes what they
    do not hold). KV event subscribers hear AllBlocksCleared when nothing stays cached, else BlockRemoved for
    each forgotten block (block_manager.BlockManager.reset_prefix_cache), at once. With
    METRALE["REQUIRE_AUTH"] on only an operator may flush (auth.authenticate_operator: 401/403 in OpenAI's
    error shape); 404 {"error"} when no chat model is configured; 503 {"error"} when an engine has stopped;
    405 for another method."""
    operator = None
    if settings.METRALE["REQUIRE_AUTH"]:
        try:
            operator = await authenticate_operator(request)
        except ApiError as error:
            return error_response(error)
    registry = process_registry()
    if registry.default(CHAT) is None:
        return _no_chat_model()
    for entry, model in registry.loaded_models(CHAT):
        try:
            dropped = await asyncio.wrap_future(model.engine.reset_prefix_cache())
        except RuntimeError as exc:
            return _unavailable(f"the prefix cache of {entry.name} was not flushed: {exc}")
        log.info("prefix cache of %s flushed%s: %d cached blocks forgotten", entry.name,
                 f" by {operator.name}" if operator is not None else "", dropped)
    return JsonResponse({})


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
