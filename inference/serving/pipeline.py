"""One request through the engine: token events in, StreamDeltas out.

Detokenizes incrementally (never half a UTF-8 character), holds back possible
stop strings, and ends with Finish(reason, usage) or Error. The engine request is
aborted in `finally`, so a client that goes away frees its KV blocks at the next step.
"""
from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from inference.engine.outputs import Failed, Finished, TokenEvent
from inference.engine.detokenizer import IncrementalDetokenizer
from inference.engine.sampling_params import SamplingParams

from .deltas import Content, Error, Finish, StreamDelta, Usage
from .stop import StopStringMatcher


@dataclass(slots=True)
class GenerationInput:
    """Everything the pipeline needs for one choice. timeout_s in seconds (None: no deadline)."""

    prompt_token_ids: list[int]
    params: SamplingParams
    stop: list[str] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    timeout_s: float | None = None
    request_id: str | None = None
    cache_salt: str = ""


async def generate(engine, tokenizer, gen: GenerationInput) -> AsyncIterator[StreamDelta]:
    """Yield Content deltas as text becomes safe to send, then exactly one Finish or Error.

    `engine` is an AsyncEngine; `tokenizer` an inference.engine.tokenizer.Tokenizer.
    Raises RequestRejected (from submit) before anything is yielded when the request
    can never fit the context.
    """
    handle = engine.submit(gen.prompt_token_ids, gen.params, request_id=gen.request_id, timeout_s=gen.timeout_s,
                           cache_salt=gen.cache_salt)
    detok = IncrementalDetokenizer(tokenizer, prompt_ids=gen.prompt_token_ids, skip_special_tokens=True)
    stops = StopStringMatcher(gen.stop, gen.include_stop_str_in_output)
    completion_tokens = 0
    try:
        async for event in handle:
            if isinstance(event, TokenEvent):
                completion_tokens += 1
                text, matched = stops.feed(detok.add(event.token_id))
                if text:
                    yield Content(text, token_ids=[event.token_id])
                if matched:
                    handle.abort("stop")
                    yield Finish("stop", Usage(len(gen.prompt_token_ids), completion_tokens))
                    return
            elif isinstance(event, Finished):
                tail, matched = stops.feed(detok.flush())
                tail += stops.flush()
                if tail:
                    yield Content(tail)
                reason = "stop" if matched else event.reason
                yield Finish(reason, Usage(event.prompt_tokens, event.completion_tokens, event.cached_tokens))
                return
            elif isinstance(event, Failed):
                yield Error(event.message)
                return
    finally:
        handle.abort()
