"""POST /v1/chat/completions: the wire fields -> a GenerationRequest, and the deltas -> chunks or a body.

Source: OpenAI API reference, "Create chat completion"; ../shared/reference/openai-contract.md
section 3 (chunk rules). With n > 1 every choice is its own engine request; with a
seed, choice i uses seed + i, so each choice is reproducible on its own.
"""
from __future__ import annotations

import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing

from .chat_encoder import DONE, ChatChunkEncoder, ChatCompletionAssembler, chat_completion_body, sse
from .choices import Choices
from .deltas import Content, Error, Finish, cancelled_as_error
from .errors import engine_error
from .prepare import GenerationRequest, Prepared
from .prompts import echo_text
from .protocol import ChatCompletionRequest, parse_json_body, validate
from .structured import requested_grammar
from .thinking import resolve_thinking

log = logging.getLogger("metrale.api")

SaveFn = Callable[[dict, dict], Awaitable[None]]


def parse(raw_body: bytes) -> dict:
    """Parse and validate the body (no model needed). Raises ApiError (400) on bad input."""
    return validate(ChatCompletionRequest, parse_json_body(raw_body))


def generation_request(req: dict) -> GenerationRequest:
    """The validated chat request in the preparation pipeline's terms (thinking resolved once)."""
    return GenerationRequest(
        param="messages", model=req.get("model", ""), messages=req["messages"],
        chat_template_kwargs=req.get("chat_template_kwargs"),
        add_generation_prompt=req.get("add_generation_prompt", True),
        continue_final_message=req.get("continue_final_message", False),
        tools=req.get("tools"), tool_choice=req.get("tool_choice") or "auto",
        parallel_tool_calls=req.get("parallel_tool_calls") is not False, thinking=resolve_thinking(req),
        n=req.get("n") or 1, max_tokens=ChatCompletionRequest.max_tokens_of(req), sampling=req,
        logprobs=(req.get("top_logprobs") or 0) if req.get("logprobs") else None,
        stop=req["stop"], include_stop_str_in_output=req["include_stop_str_in_output"],
        structured=requested_grammar(req), timeout_s=req.get("timeout"), prediction=req.get("prediction"),
        beam=req.get("beam"))


class ChatWire:
    """One chat request's answer: `frames(run)` for a stream, `body(run)` for a blocking request.

    save(request, body), when given and the request has `store`, stores the assembled completion.
    """

    def __init__(self, req: dict, prepared: Prepared, save: SaveFn | None = None):
        opts = req.get("stream_options") or {}
        self.prepared = prepared
        self.stream = req["stream"]
        self.completion_id = f"chatcmpl-{secrets.token_hex(12)}"
        self.include_usage = bool(opts.get("include_usage"))
        self.continuous_usage = bool(opts.get("continuous_usage_stats"))
        self.return_token_ids = req["return_token_ids"]
        self.want_token_details = bool(req.get("logprobs")) or req["return_token_ids"]
        self.service_tier = req.get("service_tier")
        self.echo = echo_text(req)
        self.save = save if req["store"] else None
        self.stored_request = {"messages": req["messages"], "metadata": req.get("metadata") or {}}

    def _carries_nothing(self, delta) -> bool:
        # An empty Content only carries token ids and logprobs; without those it is no chunk.
        return isinstance(delta, Content) and not delta.text and not self.want_token_details

    async def frames(self, run: Choices) -> AsyncIterator[bytes]:
        """SSE frames: each choice's role chunk (and echo), content chunks, each choice's finish chunk,
        the usage chunk if asked, [DONE]. An engine error is sent in-band as data: {"error": ...} then
        [DONE]."""
        p = self.prepared
        enc = ChatChunkEncoder(self.completion_id, p.model, include_usage=self.include_usage,
                               continuous_usage=self.continuous_usage, created=p.created,
                               service_tier=self.service_tier, return_token_ids=self.return_token_ids,
                               fingerprint=p.fingerprint)
        assemblers = [ChatCompletionAssembler(i) for i in range(len(run))]
        for i in range(len(run)):
            yield sse(enc.role_chunk(i, p.prompt_ids[0] if self.return_token_ids and i == 0 else None))
        if self.echo:
            for i in range(len(run)):
                assemblers[i].add(Content(self.echo))
                yield sse(enc.encode(Content(self.echo, token_ids=[]), i))
        failed = False
        try:
            async with aclosing(run.merged()) as merged:
                async for i, delta in merged:
                    delta = cancelled_as_error(delta)
                    assemblers[i].add(delta)
                    if isinstance(delta, Finish):
                        yield sse(enc.finish_chunk(Finish(delta.reason, run.usage), i))
                    elif isinstance(delta, Error):
                        failed = True
                        yield sse(enc.error_frame(delta))
                        break
                    elif not self._carries_nothing(delta):
                        chunk = enc.encode(delta, i, running_usage=run.usage if self.continuous_usage else None)
                        if chunk is not None:
                            yield sse(chunk)
        except Exception as exc:  # a bug must still end the stream in OpenAI's shape
            log.exception("chat stream failed")
            failed = True
            yield sse(enc.error_frame(Error(f"internal error: {exc}")))
        if not failed:
            if self.include_usage:
                yield sse(enc.usage_chunk(run.usage))
            if self.save is not None:
                await self.save(self.stored_request, self._body(run, assemblers))
        yield DONE

    def _body(self, run: Choices, assemblers: list[ChatCompletionAssembler],
              token_ids: list[list[int]] | None = None) -> dict:
        p = self.prepared
        body = chat_completion_body(self.completion_id, p.model, p.created, [a.choice() for a in assemblers],
                                    run.usage, p.fingerprint)
        if self.service_tier is not None:
            body["service_tier"] = self.service_tier
        if token_ids is not None:
            body["prompt_token_ids"] = p.prompt_ids[0]
            for choice, ids in zip(body["choices"], token_ids):
                choice["token_ids"] = ids
        return body

    async def body(self, run: Choices) -> dict:
        """The blocking chat.completion body (choices in index order).

        Raises ApiError 500 when the engine fails."""
        assemblers = [ChatCompletionAssembler(i) for i in range(len(run))]
        token_ids: list[list[int]] = [[] for _ in assemblers]
        if self.echo:
            for a in assemblers:
                a.add(Content(self.echo))
        async with aclosing(run.merged()) as merged:
            async for i, delta in merged:
                delta = cancelled_as_error(delta)
                assemblers[i].add(delta)
                if isinstance(delta, Content) and delta.token_ids:
                    token_ids[i].extend(delta.token_ids)
                elif isinstance(delta, Error):
                    raise engine_error(delta)
        body = self._body(run, assemblers, token_ids if self.return_token_ids else None)
        if self.save is not None:
            await self.save(self.stored_request, body)
        return body
