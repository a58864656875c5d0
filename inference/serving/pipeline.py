"""One request through the engine: token events in, StreamDeltas out.

Detokenizes incrementally (never half a UTF-8 character), holds back possible
stop strings, and ends with Finish(reason, usage) or Error. Every generated
token's id (and logprob entry, when asked) rides on the Content delta whose text
it completed; tokens whose text never shows (a cut stop string, special tokens)
ride on the last one. The engine request is aborted in `finally`, so a client
that goes away frees its KV blocks at the next step.
"""
from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from inference.engine.detokenizer import IncrementalDetokenizer
from inference.engine.outputs import Failed, Finished, TokenEvent
from inference.engine.sampling_params import SamplingParams

from .deltas import Content, Error, Finish, StreamDelta, Usage
from .logprobs import chat_entry, prompt_entries, spelling_for
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
    # Prefix-cache blocks are shared only between requests with the same salt (the tenant).
    cache_salt: str = ""


class Generation:
    """One submitted engine request. Construction submits it, so RequestRejected (the request can never
    fit) is raised before any response starts; `deltas()` then yields its StreamDeltas once."""

    def __init__(self, engine, tokenizer, gen: GenerationInput):
        self.gen = gen
        self.tokenizer = tokenizer
        self.submitted_at = time.perf_counter()
        self.finished_at: float | None = None
        self.handle = engine.submit(gen.prompt_token_ids, gen.params, request_id=gen.request_id,
                                    timeout_s=gen.timeout_s, cache_salt=gen.cache_salt)

    def abort(self, reason: str = "cancelled") -> None:
        """Drop the engine request (no-op once it has ended)."""
        self.handle.abort(reason)

    async def deltas(self) -> AsyncIterator[StreamDelta]:
        """Content deltas as text becomes safe to send, then exactly one Finish or Error."""
        gen, params = self.gen, self.gen.params
        detok = IncrementalDetokenizer(self.tokenizer, prompt_ids=gen.prompt_token_ids, skip_special_tokens=True)
        stops = StopStringMatcher(gen.stop, gen.include_stop_str_in_output)
        spell = spelling_for(self.tokenizer) if params.logprobs is not None else None
        pending_ids: list[int] = []
        pending_lps: list[dict] = []
        completion_tokens = 0

        def content(text: str) -> Content:
            delta = Content(text, logprobs=list(pending_lps) if spell else None, token_ids=list(pending_ids))
            pending_ids.clear()
            pending_lps.clear()
            return delta

        try:
            async for event in self.handle:
                if isinstance(event, TokenEvent):
                    completion_tokens += 1
                    pending_ids.append(event.token_id)
                    if spell:
                        pending_lps.append(chat_entry(spell, event.token_id, event.logprobs))
                    text, matched = stops.feed(detok.add(event.token_id))
                    if text or (matched and pending_ids):
                        yield content(text)
                    if matched:
                        self.abort("stop")
                        self.finished_at = time.perf_counter()
                        yield Finish("stop", Usage(len(gen.prompt_token_ids), completion_tokens))
                        return
                elif isinstance(event, Finished):
                    self.finished_at = time.perf_counter()
                    tail, matched = stops.feed(detok.flush())
                    tail += stops.flush()
                    if tail or pending_ids:
                        yield content(tail)
                    reason = "stop" if matched else event.reason
                    prompt_lps = None
                    if params.prompt_logprobs is not None:
                        prompt_lps = prompt_entries(spelling_for(self.tokenizer), gen.prompt_token_ids,
                                                    event.prompt_logprobs)
                    yield Finish(reason, Usage(event.prompt_tokens, event.completion_tokens, event.cached_tokens),
                                 prompt_logprobs=prompt_lps)
                    return
                elif isinstance(event, Failed):
                    yield Error(event.message)
                    return
        finally:
            self.abort()


async def generate(engine, tokenizer, gen: GenerationInput) -> AsyncIterator[StreamDelta]:
    """Submit one request and yield its deltas (see Generation.deltas).

    `engine` is an AsyncEngine; `tokenizer` an inference.engine.tokenizer.Tokenizer. Raises
    RequestRejected (from submit) before anything is yielded when the request can never fit.
    """
    async for delta in Generation(engine, tokenizer, gen).deltas():
        yield delta
