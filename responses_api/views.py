"""Thin async views for /v1/responses and /v1/conversations: parse, scope to the tenant, call
service/store, answer JSON or stream Server-Sent Events (`event: TYPE` + `data: JSON`, no
[DONE], as OpenAI's Responses streams are framed)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import JsonResponse

from inference.http.api import admit, by_method, openai_endpoint
from inference.engine.outputs import EngineOverloaded, RequestRejected
from inference.serving.errors import bad_request
from inference.serving.prepare import cpu_work
from inference.stored.objects import tenant_of
from inference.http.views import cache_salt_of, engine_refusal, ready_runtime, sse_response

from . import live, protocol, service, store

log = logging.getLogger("metrale.responses")

# How often a replay of a response running in another process looks for new events.
REPLAY_POLL_S = 0.25


def db(fn, *args, **kwargs):
    """Run a store function on Django's thread for synchronous ORM work."""
    return sync_to_async(fn)(*args, **kwargs)


def sse_frame(event: dict) -> bytes:
    """One Responses event as an SSE frame: `event: <type>` then `data: <json>`."""
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {data}\n\n".encode()


async def _frames(events: AsyncIterator[dict]) -> AsyncIterator[bytes]:
    """The events as SSE frames. An exception while producing one (from the events or their encoding)
    ends the stream with an `error` event, logged, so the client always sees an end."""
    next_sequence = 0
    # Closing the frames (the client went away) closes the events at once, so a run records
    # that it was cancelled now rather than whenever the generator is collected.
    async with contextlib.aclosing(events):
        try:
            async for event in events:
                frame = sse_frame(event)
                next_sequence = event.get("sequence_number", next_sequence) + 1
                yield frame
        except Exception:
            log.exception("a Responses stream failed while producing its events")
            yield sse_frame({"type": "error", "sequence_number": next_sequence, "code": "server_error",
                             "message": "The server had an error while streaming this response.",
                             "param": None})


# --- /v1/responses -----------------------------------------------------------------------------


async def create_response(request):
    """Create a response: blocking, streamed, or in the background (OpenAI "Create a model
    response"). 500 server_error when a blocking response fails in the engine.

    The rate-limit lease reserves prompt + max output tokens; openai_endpoint settles it with
    the tokens actually used when the answer or its stream ends, and a background response's
    task, to which the lease is handed off, when it ends (holding the concurrency slot while
    it runs).
    """
    req = await cpu_work(protocol.parse_create, request.body)
    rt = await ready_runtime(request, req["model"] or "", req.get("keep_alive"))
    tenant = tenant_of(request)
    context = await db(service.load_context, tenant, req)
    p = await service.prepare(req, rt, tenant, context, cache_salt=cache_salt_of(request))
    run = None
    lease = await admit(request, reserve_tokens=p.reserve_tokens, timeout_s=p.prepared.timeout_s,
                        used_tokens=lambda: run.used_tokens if run is not None else p.prepared.prompt_tokens)
    try:
        run = await service.submit_and_store(p, rt)
    except (RequestRejected, EngineOverloaded) as exc:
        raise engine_refusal(exc, "input") from exc
    if req["background"]:
        run = service.live_run(p, rt)
        entry = service.start_background(p, run, lease=lease.hand_off())
        if req["stream"]:
            return sse_response(_frames(entry.follow(-1)))
        return JsonResponse(p.body)
    if req["stream"]:
        return sse_response(_frames(run.events()))
    body = service.succeeded(await run.complete())
    return JsonResponse(body)


async def retrieve_response(request, response_id: str):
    """Retrieve a stored response; with ?stream=true replay its events (after
    `starting_after`, to resume), following it live while it runs."""
    stream, starting_after = protocol.parse_stream_query(request.GET)
    tenant = tenant_of(request)
    row = await db(store.get_response, tenant, response_id)
    if not stream:
        return JsonResponse(row.to_dict())
    if not row.streamed:
        raise bad_request("This response was created without stream or background, so it has "
                          "no events to stream; retrieve it without 'stream'.", "stream",
                          code="response_not_streamed")
    return sse_response(_frames(_replay(row.pk, -1 if starting_after is None else starting_after)))


async def _replay(response_id: str, starting_after: int) -> AsyncIterator[dict]:
    """The response's events after `starting_after`: from the live copy while it runs here,
    else from the database, polling while another process is still writing them."""
    entry = live.get(response_id)
    if entry is not None:
        async for event in entry.follow(starting_after):
            yield event
        return
    deadline = asyncio.get_running_loop().time() + settings.METRALE["REQUEST_TIMEOUT_S"] + 60
    after = starting_after
    while True:
        status, _ = await db(store.response_state, response_id)
        for event in await db(store.events_after, response_id, after):
            after = event["sequence_number"]
            yield event
        if status not in ("queued", "in_progress") or asyncio.get_running_loop().time() > deadline:
            return
        entry = live.get(response_id)
        if entry is not None:  # it started running here meanwhile
            async for event in entry.follow(after):
                yield event
            return
        await asyncio.sleep(REPLAY_POLL_S)


async def delete_response(request, response_id: str):
    """Delete a stored response: {id, object: "response", deleted: true}. One still running in
    the background here is cancelled first."""
    tenant = tenant_of(request)
    await db(store.get_response, tenant, response_id)
    await _stop_live(response_id)
    return JsonResponse(await db(store.delete_response, tenant, response_id))


async def cancel_response(request, response_id: str):
    """Cancel a background response; others are a 400 saying why."""
    tenant = tenant_of(request)
    row = await db(store.cancel_response, tenant, response_id)
    if await _stop_live(response_id):
        row = await db(store.get_response, tenant, response_id)
    return JsonResponse(row.to_dict())


async def _stop_live(response_id: str, timeout_s: float = 5.0) -> bool:
    """Cancel the background task running `response_id` in this process, and give it up to
    timeout_s seconds to record where it stopped. False when none runs here."""
    entry = live.get(response_id)
    if entry is None or entry.task is None or entry.task.done():
        return False
    entry.task.cancel()
    await asyncio.wait({entry.task}, timeout=timeout_s)
    return True


async def list_input_items(request, response_id: str):
    """A page of a stored response's input items (limit, order, after)."""
    limit, order, after = protocol.parse_list_query(request.GET)
    return JsonResponse(await db(store.list_input_items, tenant_of(request), response_id,
                                 limit, order, after))


# --- /v1/conversations -------------------------------------------------------------------------


async def create_conversation(request):
    """Create a conversation with up to 20 items and metadata."""
    items, metadata = await cpu_work(protocol.parse_conversation_create, request.body)
    conv = await db(store.create_conversation, tenant_of(request), items, metadata)
    return JsonResponse(conv.to_dict())


async def retrieve_conversation(request, conversation_id: str):
    """Retrieve a conversation."""
    conv = await db(store.get_conversation, tenant_of(request), conversation_id)
    return JsonResponse(conv.to_dict())


async def update_conversation(request, conversation_id: str):
    """Replace a conversation's metadata."""
    metadata = protocol.parse_conversation_update(request.body)
    conv = await db(store.update_conversation, tenant_of(request), conversation_id, metadata)
    return JsonResponse(conv.to_dict())


async def delete_conversation(request, conversation_id: str):
    """Delete a conversation: {id, object: "conversation.deleted", deleted: true}."""
    return JsonResponse(await db(store.delete_conversation, tenant_of(request),
                                 conversation_id))


async def create_items(request, conversation_id: str):
    """Append up to 20 items; answers the list of them."""
    items = await cpu_work(protocol.parse_items_create, request.body)
    added = await db(store.add_conversation_items, tenant_of(request), conversation_id,
                     items)
    return JsonResponse({"object": "list", "data": added, "first_id": added[0]["id"],
                         "last_id": added[-1]["id"], "has_more": False})


async def list_items(request, conversation_id: str):
    """A page of a conversation's items (limit, order, after)."""
    limit, order, after = protocol.parse_list_query(request.GET)
    return JsonResponse(await db(store.list_conversation_items, tenant_of(request),
                                 conversation_id, limit, order, after))


async def retrieve_item(request, conversation_id: str, item_id: str):
    """One conversation item."""
    return JsonResponse(await db(store.get_conversation_item, tenant_of(request),
                                 conversation_id, item_id))


async def delete_item(request, conversation_id: str, item_id: str):
    """Delete one item; answers the conversation."""
    return JsonResponse(await db(store.delete_conversation_item, tenant_of(request),
                                 conversation_id, item_id))


# One view per URL, each HTTP method through openai_endpoint (api.by_method: others are a 405).
responses = by_method(POST=openai_endpoint(create_response, generates=True))
response_detail = by_method(GET=openai_endpoint(retrieve_response), DELETE=openai_endpoint(delete_response))
response_cancel = by_method(POST=openai_endpoint(cancel_response))
response_input_items = by_method(GET=openai_endpoint(list_input_items))
conversations = by_method(POST=openai_endpoint(create_conversation))
conversation_detail = by_method(GET=openai_endpoint(retrieve_conversation), POST=openai_endpoint(update_conversation),
                                DELETE=openai_endpoint(delete_conversation))
conversation_items = by_method(GET=openai_endpoint(list_items), POST=openai_endpoint(create_items))
conversation_item = by_method(GET=openai_endpoint(retrieve_item), DELETE=openai_endpoint(delete_item))
