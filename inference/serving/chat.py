"""POST /v1/chat/completions: a validated request -> prompt tokens -> pipeline -> chunks or a body."""
from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from django.conf import settings

from inference.engine.chat_template import ChatTemplateError
from inference.engine.outputs import RequestRejected
from inference.engine.sampling_params import SamplingParams

from .chat_encoder import DONE, ChatChunkEncoder, ChatCompletionAssembler, chat_completion_body, sse
from .deltas import Error, Finish, Usage
from .errors import ApiError, bad_request
from .pipeline import GenerationInput, generate
from .protocol import ChatCompletionRequest, parse_json_body, validate


@dataclass(slots=True)
class PreparedChat:
    """A chat request ready for the engine."""

    completion_id: str
    model: str
    created: int
    stream: bool
    include_usage: bool
    continuous_usage: bool
    gen: GenerationInput
    # Updated as generation runs: what the rate limiter charges when it ends.
    usage: Usage

    @property
    def reserve_tokens(self) -> int:
        """Tokens to reserve against the rate limit: prompt + max_tokens."""
        return len(self.gen.prompt_token_ids) + self.gen.params.max_tokens


def sampling_params(req: dict, prompt_len: int, max_model_len: int) -> SamplingParams:
    """SamplingParams from validated fields. A missing max_tokens means "up to the context"."""
    max_tokens = req.get("max_completion_tokens") or req.get("max_tokens")
    if max_tokens is None:
        max_tokens = max(1, max_model_len - prompt_len)
    temperature = req.get("temperature")
    return SamplingParams(
        temperature=1.0 if temperature is None else temperature,
        top_p=req.get("top_p") or 1.0,
        top_k=req.get("top_k") or 0,
        min_p=req.get("min_p") or 0.0,
        seed=req.get("seed"),
        max_tokens=max_tokens,
        ignore_eos=req.get("ignore_eos", False),
    )


def parse(raw_body: bytes) -> dict:
    """Parse and validate the body (no model needed). Raises ApiError (400) on bad input."""
    return validate(ChatCompletionRequest, parse_json_body(raw_body))


def prepare(req: dict, rt, cache_salt: str = "") -> PreparedChat:
    """Template and tokenize a validated request. Raises ApiError (400) when it cannot be served."""
    try:
        prompt = rt.tokenizer.apply_chat_template(req["messages"], add_generation_prompt=True)
    except ChatTemplateError as exc:
        raise bad_request(f"The chat template could not render these messages: {exc}", param="messages") from exc
    prompt_ids = rt.tokenizer.encode(prompt)
    max_len = rt.engine.max_model_len
    max_tokens = req.get("max_completion_tokens") or req.get("max_tokens")
    if len(prompt_ids) + (max_tokens or 1) > max_len:
        raise ApiError(
            400, f"This model's maximum context length is {max_len} tokens. However, you requested "
                 f"{len(prompt_ids) + (max_tokens or 0)} tokens ({len(prompt_ids)} in the messages, "
                 f"{max_tokens or 0} in the completion). Please reduce the length of the messages or completion.",
            param="messages", code="context_length_exceeded")
    opts = req.get("stream_options") or {}
    timeout_s = settings.METRALE["REQUEST_TIMEOUT_S"]
    return PreparedChat(
        completion_id=f"chatcmpl-{secrets.token_hex(12)}",
        model=req.get("model") or rt.model_id,
        created=int(time.time()),
        stream=req["stream"],
        include_usage=bool(opts.get("include_usage")),
        continuous_usage=bool(opts.get("continuous_usage_stats")),
        gen=GenerationInput(prompt_ids, sampling_params(req, len(prompt_ids), max_len), stop=req["stop"],
                            include_stop_str_in_output=req["include_stop_str_in_output"], timeout_s=timeout_s,
                            cache_salt=cache_salt),
        usage=Usage(len(prompt_ids), 0),
    )


async def stream(rt, p: PreparedChat) -> AsyncIterator[bytes]:
    """SSE frames: role chunk, content chunks, the finish chunk, the usage chunk if asked, [DONE].

    An error after the first frame is sent in-band as data: {"error": ...} then [DONE].
    """
    enc = ChatChunkEncoder(p.completion_id, p.model, include_usage=p.include_usage,
                           continuous_usage=p.continuous_usage, created=p.created)
    deltas = generate(rt.engine, rt.tokenizer, p.gen)
    try:
        first = await anext(deltas)
    except RequestRejected as exc:
        raise ApiError(400, str(exc), param="messages", code="context_length_exceeded") from exc
    yield sse(enc.role_chunk())
    running = p.usage
    async for delta in _chain(first, deltas):
        if isinstance(delta, Finish):
            p.usage = delta.usage
            yield sse(enc.finish_chunk(delta))
            if p.include_usage:
                yield sse(enc.usage_chunk(delta.usage))
        elif isinstance(delta, Error):
            yield sse(enc.error_frame(delta))
        else:
            if delta.token_ids:
                running.completion_tokens += len(delta.token_ids)
            chunk = enc.encode(delta, running_usage=running)
            if chunk is not None:
                yield sse(chunk)
    yield DONE


async def _chain(first, rest):
    yield first
    async for item in rest:
        yield item


async def complete(rt, p: PreparedChat) -> dict:
    """The blocking chat.completion body. Raises ApiError 400 when the engine refuses the
    request, 500 when it fails."""
    asm = ChatCompletionAssembler()
    try:
        async for delta in generate(rt.engine, rt.tokenizer, p.gen):
            asm.add(delta)
            if isinstance(delta, Finish):
                p.usage = delta.usage
    except RequestRejected as exc:
        raise ApiError(400, str(exc), param="messages", code="context_length_exceeded") from exc
    if asm.error is not None:
        raise ApiError(500, asm.error.message, type="server_error")
    usage = asm.finish.usage if asm.finish else Usage(len(p.gen.prompt_token_ids), 0)
    return chat_completion_body(p.completion_id, p.model, p.created, [asm.choice()], usage)
