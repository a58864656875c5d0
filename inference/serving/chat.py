"""POST /v1/chat/completions: a validated request -> prompt tokens -> n engine requests -> chunks or a body.

Source: OpenAI API reference, "Create chat completion"; ../shared/reference/openai-contract.md
section 3 (chunk rules). With n > 1 every choice is its own engine request; with a
seed, choice i uses seed + i, so each choice is reproducible on its own.
"""
from __future__ import annotations

import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field

from .chat_encoder import DONE, ChatChunkEncoder, ChatCompletionAssembler, chat_completion_body, sse
from .choices import Choices, total_usage
from .deltas import Content, Error, Finish, Usage
from .errors import ApiError
from .model_names import check_model
from .pipeline import GenerationInput
from .prompts import echo_text, render_chat
from .protocol import ChatCompletionRequest, parse_json_body, validate
from .sampling import context_limit, defaults_for, resolve_max_tokens, sampling_params, timeout_for
from .text_setup import text_setup
from .thinking import resolve_thinking

log = logging.getLogger("metrale.api")

SaveFn = Callable[[dict, dict], Awaitable[None]]


@dataclass(slots=True)
class PreparedChat:
    """A chat request ready for the engine: one GenerationInput per choice, and what the wire needs."""

    completion_id: str
    model: str
    created: int
    stream: bool
    include_usage: bool
    continuous_usage: bool
    return_token_ids: bool
    want_token_details: bool
    service_tier: str | None
    echo: str
    prompt_token_ids: list[int]
    inputs: list[GenerationInput]
    store: bool
    stored_request: dict = field(default_factory=dict)
    # Updated as generation runs: what the rate limiter charges when it ends.
    usage: Usage = field(default_factory=Usage)
    # Seconds from submit to the last choice's end (blocking requests; for Server-Timing).
    engine_s: float | None = None

    @property
    def reserve_tokens(self) -> int:
        """Tokens to reserve against the rate limit: prompt + every choice's max_tokens."""
        return len(self.prompt_token_ids) + sum(g.params.max_tokens for g in self.inputs)

    @property
    def timeout_s(self) -> float | None:
        """The request's deadline in seconds."""
        return self.inputs[0].timeout_s


def parse(raw_body: bytes) -> dict:
    """Parse and validate the body (no model needed). Raises ApiError (400) on bad input."""
    return validate(ChatCompletionRequest, parse_json_body(raw_body))


def prepare(req: dict, rt, request_id: str | None = None, cache_salt: str = "") -> PreparedChat:
    """Template and tokenize a validated request and build its engine inputs.

    request_id: the engine requests' ids are `<request_id>-<choice>`. cache_salt: the tenant's
    prefix-cache salt. Each input carries how its text is parsed (reasoning and tool-call parsers,
    text_setup.py) and the engine's reasoning cap from the thinking controls (thinking.py).

    Raises ApiError: 404 for an unknown model name, 400 when the template fails, a token id is out
    of the vocabulary, or prompt + max_tokens exceed the context (with the numbers).
    """
    check_model(req.get("model", ""), rt.model_id)
    setup = text_setup(rt, req.get("tools"), req.get("tool_choice"), req.get("parallel_tool_calls"),
                       resolve_thinking(req))
    prompt_text = render_chat(rt.tokenizer, req)
    prompt_ids = rt.tokenizer.encode(prompt_text)
    text_spec = setup.spec(prompt_text)
    budget = setup.reasoning_budget(rt.tokenizer, prompt_text)
    defaults = defaults_for(rt.model_path)
    max_tokens = resolve_max_tokens(ChatCompletionRequest.max_tokens_of(req), defaults.get("max_tokens"),
                                    len(prompt_ids), context_limit(rt.engine))
    logprobs = (req.get("top_logprobs") or 0) if req.get("logprobs") else None
    n = req.get("n") or 1
    inputs = [
        GenerationInput(prompt_ids, sampling_params(req, max_tokens=max_tokens, tokenizer=rt.tokenizer,
                                                    defaults=defaults, logprobs=logprobs, seed_offset=i,
                                                    reasoning_budget=budget),
                        stop=req["stop"], include_stop_str_in_output=req["include_stop_str_in_output"],
                        timeout_s=timeout_for(req), request_id=f"{request_id}-{i}" if request_id else None,
                        cache_salt=cache_salt, text=text_spec)
        for i in range(n)
    ]
    opts = req.get("stream_options") or {}
    return PreparedChat(
        completion_id=f"chatcmpl-{secrets.token_hex(12)}",
        model=rt.model_id,
        created=int(time.time()),
        stream=req["stream"],
        include_usage=bool(opts.get("include_usage")),
        continuous_usage=bool(opts.get("continuous_usage_stats")),
        return_token_ids=req["return_token_ids"],
        want_token_details=logprobs is not None or req["return_token_ids"],
        service_tier=req.get("service_tier"),
        echo=echo_text(req),
        prompt_token_ids=prompt_ids,
        inputs=inputs,
        store=req["store"],
        stored_request={"messages": req["messages"], "metadata": req.get("metadata") or {}},
        usage=Usage(len(prompt_ids), 0),
    )


def _carries_nothing(p: PreparedChat, delta) -> bool:
    # An empty Content only carries token ids and logprobs; without those it is no chunk.
    return isinstance(delta, Content) and not delta.text and not p.want_token_details


async def stream(rt, p: PreparedChat, save: SaveFn | None = None) -> AsyncIterator[bytes]:
    """SSE frames: each choice's role chunk (and echo), content chunks, each choice's finish chunk, the
    usage chunk if asked, [DONE]. Submits the engine requests before the first frame, so RequestRejected
    is raised by the first `anext`. An error after that is sent in-band as data: {"error": ...} then
    [DONE]. `save(request, body)` stores the assembled completion when p.store."""
    choices = Choices(rt.engine, rt.tokenizer, p.inputs)
    enc = ChatChunkEncoder(p.completion_id, p.model, include_usage=p.include_usage,
                           continuous_usage=p.continuous_usage, created=p.created, service_tier=p.service_tier,
                           return_token_ids=p.return_token_ids)
    n = len(choices)
    assemblers = [ChatCompletionAssembler(i) for i in range(n)]
    for i in range(n):
        yield sse(enc.role_chunk(i, p.prompt_token_ids if p.return_token_ids and i == 0 else None))
    if p.echo:
        for i in range(n):
            assemblers[i].add(Content(p.echo))
            yield sse(enc.encode(Content(p.echo, token_ids=[]), i))
    running = p.usage
    finishes: list[Finish] = []
    failed = False
    try:
        async with aclosing(choices.merged()) as merged:
            async for i, delta in merged:
                assemblers[i].add(delta)
                if isinstance(delta, Finish):
                    finishes.append(delta)
                    yield sse(enc.finish_chunk(Finish(delta.reason, running), i))
                elif isinstance(delta, Error):
                    failed = True
                    yield sse(enc.error_frame(delta))
                    break
                else:
                    running.completion_tokens += len(getattr(delta, "token_ids", None) or [])
                    chunk = None if _carries_nothing(p, delta) else enc.encode(delta, i, running_usage=running)
                    if chunk is not None:
                        yield sse(chunk)
    except Exception as exc:  # a bug must still end the stream in OpenAI's shape
        log.exception("chat stream failed")
        failed = True
        yield sse(enc.error_frame(Error(f"internal error: {exc}")))
    if not failed:
        usage = p.usage = total_usage(finishes)
        if p.include_usage:
            yield sse(enc.usage_chunk(usage))
        if p.store and save is not None:
            await save(p.stored_request, _body(p, assemblers, usage))
    yield DONE


def _body(p: PreparedChat, assemblers: list[ChatCompletionAssembler], usage: Usage,
          token_ids: list[list[int]] | None = None) -> dict:
    body = chat_completion_body(p.completion_id, p.model, p.created, [a.choice() for a in assemblers], usage)
    if p.service_tier is not None:
        body["service_tier"] = p.service_tier
    if token_ids is not None:
        body["prompt_token_ids"] = p.prompt_token_ids
        for choice, ids in zip(body["choices"], token_ids):
            choice["token_ids"] = ids
    return body


async def complete(rt, p: PreparedChat, save: SaveFn | None = None) -> dict:
    """The blocking chat.completion body (choices in index order). Sets p.engine_s.

    Raises RequestRejected (from submit) and ApiError 500 when the engine fails."""
    choices = Choices(rt.engine, rt.tokenizer, p.inputs)
    assemblers = [ChatCompletionAssembler(i) for i in range(len(choices))]
    token_ids: list[list[int]] = [[] for _ in assemblers]
    if p.echo:
        for a in assemblers:
            a.add(Content(p.echo))
    async with aclosing(choices.merged()) as merged:
        async for i, delta in merged:
            assemblers[i].add(delta)
            if isinstance(delta, Content) and delta.token_ids:
                token_ids[i].extend(delta.token_ids)
                p.usage.completion_tokens += len(delta.token_ids)
            elif isinstance(delta, Error):
                raise ApiError(500, delta.message, type="server_error")
    p.engine_s = choices.engine_s
    p.usage = total_usage([a.finish for a in assemblers if a.finish])
    body = _body(p, assemblers, p.usage, token_ids if p.return_token_ids else None)
    if p.store and save is not None:
        await save(p.stored_request, body)
    return body
