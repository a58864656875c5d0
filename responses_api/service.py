"""POST /v1/responses: a validated request -> context -> the shared preparation pipeline -> events and body.

`load_context` reads what comes before the input (a previous_response_id chain or a
conversation), `prepare` maps the request onto the shared pipeline (inference.serving.prepare),
and a `ResponseRun` turns the pipeline's
deltas into numbered events (encoder.py), stores them when the response is streamed or in
the background, and records the final response. `start_background` runs one as a task on
the server's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import contextvars
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.db import DatabaseError, close_old_connections

from inference.engine.outputs import EngineOverloaded, RequestRejected
from inference.engine.sampling_params import SamplingParams
from inference.models import Tenant
from inference.serving.deltas import Error
from inference.serving.errors import ApiError, bad_request
from inference.serving.choices import Choices
from inference.serving.prepare import GenerationRequest, Prepared
from inference.serving.prepare import prepare as prepare_generation
from inference.serving.structured import requested_grammar
from inference.serving.thinking import resolve_thinking

from . import live, store
from .encoder import (
    EncoderError,
    ResponsesEventEncoder,
    outcome,
    responses_usage,
    terminal_events,
)
from .items import items_to_messages
from .models import new_id
from .protocol import LOGPROBS_INCLUDE

log = logging.getLogger("metrale.responses")

# Streamed events are written to the database at least this often (and at the end).
EVENT_FLUSH_INTERVAL_S = 0.25
EVENT_FLUSH_BATCH = 64


@dataclass(slots=True)
class PreparedResponse:
    """A Responses request ready for the engine. `body` is the Response object as it starts."""

    response_id: str
    tenant: Tenant
    req: dict
    input_items: list[dict]
    prepared: Prepared
    body: dict

    @property
    def reserve_tokens(self) -> int:
        """Tokens to reserve against the rate limit: prompt + max output tokens."""
        return self.prepared.reserve_tokens


def load_context(tenant: Tenant, req: dict) -> list[dict]:
    """The items before this request's input: the previous_response_id chain's inputs and
    outputs, or the conversation's items (synchronous ORM). Raises ApiError 404 for an unknown
    or foreign id (response_not_found, conversation_not_found)."""
    if req["previous_response_id"] is not None:
        return store.chain_items(tenant, req["previous_response_id"])
    if req["conversation"] is not None:
        return store.conversation_items(tenant, req["conversation"])
    return []


def _chat_tools(tools: list[dict]) -> list[dict]:
    out = []
    for tool in tools:
        fn = {"name": tool["name"]}
        if tool["description"]:
            fn["description"] = tool["description"]
        fn["parameters"] = tool["parameters"] or {"type": "object", "properties": {}}
        out.append({"type": "function", "function": fn})
    return out


def _chat_tool_choice(choice):
    """tool_choice in the chat form the serving layer uses ({type, function: {name}} for a name)."""
    if isinstance(choice, dict):
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def generation_request(req: dict, messages: list[dict]) -> GenerationRequest:
    """The validated Responses request, after its context, in the preparation pipeline's terms:
    tools and tool_choice in the chat form, `reasoning.effort` among the thinking controls,
    max_output_tokens, truncation ("auto" drops the oldest turns to fit; "disabled", the default,
    answers 400 context_length_exceeded instead, OpenAI's rule); the output text's logprobs (top_logprobs
    alternatives each) when `include` asks for them (OpenAI's rule, and vLLM's)."""
    return GenerationRequest(
        param="input", model=req["model"], messages=messages, tools=_chat_tools(req["tools"]) or None,
        tool_choice=_chat_tool_choice(req["tool_choice"]), parallel_tool_calls=req["parallel_tool_calls"],
        max_tool_calls=req["max_tool_calls"],
        thinking=resolve_thinking(req, effort=(req["reasoning"] or {}).get("effort")),
        truncate=req["truncation"] == "auto", max_tokens=req["max_output_tokens"], sampling=req,
        logprobs=(req["top_logprobs"] or 0) if LOGPROBS_INCLUDE in req["include"] else None,
        stop=req.get("stop") or [], include_stop_str_in_output=req.get("include_stop_str_in_output", False),
        structured=requested_grammar(req, format_field="text"))


def _messages(req: dict, items: list[dict]) -> list[dict]:
    messages = items_to_messages(items)
    if req["instructions"]:
        messages.insert(0, {"role": "system", "content": req["instructions"]})
    return messages


async def prepare(req: dict, rt, tenant: Tenant, context: list[dict], cache_salt: str = "",
                  priority: int = 0) -> PreparedResponse:
    """Prepare a validated request after its context items through the shared pipeline
    (inference.serving.prepare). cache_salt keeps the tenant's prefix-cache blocks apart from
    other tenants' (see inference.tenancy.auth); priority: EngineRequest.priority (batch lines above 0).

    Raises ApiError 400 for an input item id already in the conversation, a function_call_output whose call_id no
    function_call of the context or the input has (OpenAI's words), an empty input, and what the pipeline raises
    (template, context length, grammar).
    """
    if req["conversation"] is not None:
        known = {item["id"] for item in context}
        for i, item in enumerate(req["input"]):
            if item["id"] in known:
                raise bad_request(f"An item with id '{item['id']}' is already in the "
                                  "conversation.", f"input[{i}].id", code="duplicate_item_id")
    calls = {item["call_id"] for item in context + req["input"] if item["type"] == "function_call"}
    for i, item in enumerate(req["input"]):
        if item["type"] == "function_call_output" and item["call_id"] not in calls:
            raise bad_request(f"No tool call found for function call output with call_id {item['call_id'][:64]}.",
                              f"input[{i}].call_id")
    messages = _messages(req, context + req["input"])
    if not messages:
        raise bad_request("'input' must not be empty when there is no earlier context.", "input")
    response_id = new_id("resp")
    greq = dataclasses.replace(generation_request(req, messages), priority=priority)
    prepared = await prepare_generation(greq, rt, request_id=response_id, cache_salt=cache_salt)
    body = response_object(response_id, req, req["model"] or rt.model_id,
                           "queued" if req["background"] else "in_progress", prepared.inputs[0].request.params)
    return PreparedResponse(response_id, tenant, req, req["input"], prepared, body)


def response_object(response_id: str, req: dict, model: str, status: str,
                    params: SamplingParams | None = None) -> dict:
    """The Response object as it starts (no output, no usage), echoing the request's settings with the
    defaults filled in: temperature and top_p those the turn samples with (`params`, its SamplingParams: the
    model's generation_config or card where the request set none, as vLLM's Responses object says; OpenAI's 1
    without `params`), truncation disabled, ..."""
    temperature = req["temperature"] if req["temperature"] is not None else params.temperature if params else 1.0
    top_p = req["top_p"] if req["top_p"] is not None else params.top_p if params else 1.0
    return {
        "id": response_id, "object": "response", "created_at": int(time.time()),
        "status": status, "background": req["background"], "error": None,
        "incomplete_details": None, "instructions": req["instructions"],
        "max_output_tokens": req["max_output_tokens"], "max_tool_calls": req["max_tool_calls"],
        "model": model, "output": [], "parallel_tool_calls": req["parallel_tool_calls"],
        "previous_response_id": req["previous_response_id"],
        "conversation": {"id": req["conversation"]} if req["conversation"] else None,
        "reasoning": req["reasoning"] or {"effort": None, "summary": None},
        "service_tier": req["service_tier"] or "default", "store": req["store"],
        "temperature": temperature,
        "text": req["text"], "tool_choice": req["tool_choice"], "tools": req["tools"],
        "top_logprobs": req["top_logprobs"] or 0,
        "top_p": top_p,
        "truncation": req["truncation"], "usage": None, "user": req["user"],
        "safety_identifier": req["safety_identifier"],
        "prompt_cache_key": req["prompt_cache_key"], "metadata": req["metadata"],
        "completed_at": None,
    }


def stored_request(req: dict) -> dict:
    """The request parameters kept with a stored response (the input is kept as items)."""
    return {k: v for k, v in req.items() if k != "input"}


class ResponseRun:
    """One response's generation: deltas -> numbered events -> the final Response object.

    `events()` yields response.created, response.in_progress, the encoder's item events and one
    terminal event (response.completed, response.incomplete, or `error` then response.failed).
    When the consumer goes away (a stream's client disconnects, a background task is
    cancelled) generation stops, the open item closes as incomplete and the response is
    recorded as cancelled. With `store`, streamed events (`record_events`) are written in
    batches and the final body, usage and output items are stored; with a conversation the
    turn's input and output items are appended to it once it completed. on_event, if given,
    sees every event as it is made (the live copy followers read).
    """

    def __init__(self, p: PreparedResponse, rt, *, record_events: bool,
                 on_event: Callable[[dict], None] | None = None):
        self.p = p
        self.rt = rt
        self.store = p.req["store"]
        self.record_events = record_events and self.store
        self.on_event = on_event
        self.encoder = ResponsesEventEncoder()
        self.body = dict(p.body)
        self.final: dict | None = None
        self._seq = 0
        self.choices: Choices | None = None
        self._unwritten: list[dict] = []
        self._last_write = time.monotonic()

    def _emit(self, event: dict) -> dict:
        event = {"type": event["type"], "sequence_number": self._seq,
                 **{k: v for k, v in event.items() if k != "type"}}
        self._seq += 1
        if self.record_events:
            self._unwritten.append(event)
        if self.on_event is not None:
            self.on_event(event)
        return event

    async def _write_events(self, force: bool = False) -> None:
        if not self._unwritten:
            return
        now = time.monotonic()
        if force or len(self._unwritten) >= EVENT_FLUSH_BATCH or \
                now - self._last_write >= EVENT_FLUSH_INTERVAL_S:
            batch, self._unwritten = self._unwritten, []
            self._last_write = now
            try:
                await sync_to_async(store.append_events)(self.p.response_id, batch)
            except DatabaseError as exc:  # e.g. the response was deleted meanwhile
                log.warning("response %s: events no longer recorded: %s", self.p.response_id, exc)
                self.record_events = False

    def submit(self) -> None:
        """Submit the engine request now (idempotent; `events()` does it if nobody did), so a
        request the engine refuses is an HTTP error before the response starts. Raises
        RequestRejected or EngineOverloaded."""
        if self.choices is None:
            self.choices = Choices(self.rt.engine, self.rt.tokenizer, self.p.prepared)

    def abort(self) -> None:
        """Drop the engine request, if submitted (its response will not be generated)."""
        if self.choices is not None:
            self.choices.abort()

    async def events(self) -> AsyncIterator[dict]:
        yield self._emit({"type": "response.created", "response": dict(self.body)})
        if self.p.req["background"]:
            await sync_to_async(store.mark_in_progress)(self.p.response_id)
        self.body["status"] = "in_progress"
        yield self._emit({"type": "response.in_progress", "response": dict(self.body)})
        try:
            self.submit()
            async with contextlib.aclosing(self.choices.merged()) as deltas:
                async for _, delta in deltas:
                    try:
                        produced = self.encoder.feed(delta)
                    except EncoderError as exc:
                        log.error("response %s: %s", self.p.response_id, exc)
                        self.encoder.error = Error(f"internal error: {exc}")
                        break
                    for event in produced:
                        yield self._emit(event)
                    await self._write_events()
        except RequestRejected as exc:
            self.encoder.error = Error(str(exc), code="context_length_exceeded")
        except EngineOverloaded as exc:
            self.encoder.error = Error(f"The server is overloaded: {exc}. Retry shortly.", code="overloaded")
        except (asyncio.CancelledError, GeneratorExit):
            await self._end("cancelled", None, None)
            raise
        for event in await self._end(*outcome(self.encoder.finish, self.encoder.error)):
            yield event

    async def _end(self, status: str, incomplete: dict | None, error: dict | None) -> list[dict]:
        """Close the open item, make the terminal events, and store the outcome."""
        closing = [self._emit(e) for e in
                   self.encoder.close("completed" if status == "completed" else "incomplete")]
        finish = self.encoder.finish
        self.final = {**self.body, "status": status, "output": self.encoder.output,
                      "error": error, "incomplete_details": incomplete,
                      "usage": responses_usage(finish.usage) if finish else None,
                      "completed_at": int(time.time()) if status == "completed" else None}
        closing += [self._emit(e) for e in terminal_events(self.final)]
        try:
            await self._record()
        except Exception:  # the client already has its answer; the store must not hide it
            log.exception("response %s: storing the outcome failed", self.p.response_id)
        return closing

    async def _record(self) -> None:
        if self.store:
            await self._write_events(force=True)
            self.final["status"] = await sync_to_async(store.finish_response)(
                self.p.response_id, self.final, self.encoder.output)
        conversation = self.p.req["conversation"]
        if conversation is not None and self.final["status"] in ("completed", "incomplete"):
            try:
                await sync_to_async(store.add_conversation_items)(
                    self.p.tenant, conversation, self.p.input_items + self.encoder.output)
            except ApiError as exc:
                log.warning("response %s: not appended to conversation %s: %s",
                            self.p.response_id, conversation, exc.message)

    @property
    def used_tokens(self) -> int:
        """Prompt + completion tokens processed so far (what the rate limiter charges)."""
        if self.choices is None:
            return self.p.prepared.prompt_tokens
        return self.choices.usage.total_tokens

    async def complete(self) -> dict:
        """Run to the end without streaming; the final Response object."""
        async for _ in self.events():
            pass
        return self.final


async def submit_and_store(p: PreparedResponse, rt) -> ResponseRun | None:
    """A created response's run, submitted first unless it is a background one (so a request the
    engine refuses is stored nowhere), then, with `store`, the response stored. Returns the run
    (events recorded when streamed), None for a background response (live_run and
    start_background run it). Raises RequestRejected / EngineOverloaded from the submit, and what
    storing raises (the run is aborted then)."""
    req, run = p.req, None
    if not req["background"]:
        run = ResponseRun(p, rt, record_events=req["stream"])
        run.submit()
    if req["store"]:
        try:
            await sync_to_async(store.create_response)(
                tenant=p.tenant, response_id=p.response_id, model=p.body["model"], body=p.body,
                request=stored_request(req), input_items=p.input_items,
                previous_response_id=req["previous_response_id"], conversation_id=req["conversation"],
                background=req["background"], streamed=req["stream"] or req["background"])
        except BaseException:
            if run is not None:
                run.abort()
            raise
    return run


def succeeded(body: dict) -> dict:
    """A blocking response's final body; raises ApiError 500 server_error (its error's message
    and code) when it failed."""
    if body["status"] == "failed":
        raise ApiError(500, body["error"]["message"], type="server_error", code=body["error"]["code"])
    return body


async def responses_call(req: dict, rt, *, tenant: Tenant, request_id: str | None, cache_salt: str,
                         priority: int = 0) -> BlockingResponse:
    """A validated Create response body (protocol.parse_create) prepared after its context, for a
    blocking answer (the Batch API's lines: a background request is a 400 there). Raises what
    load_context and prepare raise."""
    if req["background"]:
        raise bad_request("A batch line cannot create a background response.", "background")
    context = await sync_to_async(load_context)(tenant, req)
    return BlockingResponse(await prepare(req, rt, tenant, context, cache_salt=cache_salt, priority=priority))


@dataclass(slots=True)
class BlockingResponse:
    """A prepared response answered as a blocking request would be (inference.http.surfaces.Call's shape)."""

    p: PreparedResponse
    param: str = "input"

    async def blocking_run(self, rt):
        """Submit, store (with `store`) and run to the end: (the Response object, its usage).
        Raises RequestRejected / EngineOverloaded, ApiError 500 when the response failed."""
        run = await submit_and_store(self.p, rt)
        body = succeeded(await run.complete())
        return body, run.choices.usage


def start_background(p: PreparedResponse, run: ResponseRun, lease=None) -> live.LiveResponse:
    """Run a stored, queued response's `run` (made with record_events and the live entry's
    publish, see live_run) as a task on the running event loop (daphne's); returns its live
    entry, which followers tail and POST .../cancel cancels. lease: the request's
    inference.http.api.GenerationLease, handed off to the task, which settles it when it ends.

    The task runs in a fresh context with its own ThreadSensitiveContext, so its database work
    happens on a thread of its own that ends with it, not on the creating request's.
    """
    entry = live.get(p.response_id)

    async def main():
        try:
            async with ThreadSensitiveContext():
                try:
                    await run.complete()
                finally:
                    await sync_to_async(close_old_connections)()
        except asyncio.CancelledError:
            pass
        except Exception as exc:
            log.exception("background response %s failed", p.response_id)
            with contextlib.suppress(Exception):
                await sync_to_async(store.fail_response)(p.response_id, f"internal error: {exc}")
        finally:
            entry.finish()
            live.unregister(p.response_id)
            if lease is not None:
                try:
                    await lease.settle()
                except Exception:
                    log.exception("background response %s: releasing its rate-limit lease "
                                  "failed", p.response_id)

    entry.task = asyncio.get_running_loop().create_task(main(), context=contextvars.Context())
    if lease is not None:  # a task cancelled before it ever ran never reaches its `finally`
        entry.task.add_done_callback(lambda task: task.cancelled() and asyncio.ensure_future(lease.settle()))
    return entry


def live_run(p: PreparedResponse, rt) -> ResponseRun:
    """The run of a background response: its events recorded and published to a new live entry."""
    entry = live.register(p.response_id)
    return ResponseRun(p, rt, record_events=True, on_event=entry.publish)
