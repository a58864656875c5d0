"""One request through the engine: token events in, StreamDeltas out.

Detokenizes incrementally (never half a UTF-8 character), holds back possible
stop strings, passes the text through the request's TextPipeline (reasoning
parser, tool-call parser, sanitizer) when it has one, and ends with
Finish(reason, usage) or Error. Every generated token's id (and logprob entry,
when asked; reasoning tokens have none) rides on the Content delta whose text
it completed, or the Reasoning delta when no content came with it; tokens
whose text never shows (a cut stop string, special tokens, a held tool call)
ride on the next one, and at the end on the last one. The finish reason is
timeout, then tool_calls (the turn made calls), then stop for a matched stop
string, then the engine's reason (tool_calls does not win when generation
ended inside a call: max_tokens cut it, the finish reason is length); the
tool-call limit ends the request like a stop string.
The engine request is aborted in `finally`, so a client that goes away frees
its KV blocks at the next step.
"""
from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from inference.engine.detokenizer import IncrementalDetokenizer
from inference.engine.outputs import Failed, Finished, TokenEvent
from inference.engine.request import EngineRequest
from inference.engine.speculative import PredictionMatch
from inference.operations.metrics import count_tool_calls

from .assembly import resolve_finish_reason
from .deltas import Content, Error, Finish, Reasoning, StreamDelta, TokenLogprob, Usage
from .logprobs import prompt_logprobs, spelling_for, token_logprob
from .stop import StopStringMatcher
from .text_pipeline import TextPipeline, TextSpec


@dataclass(slots=True)
class GenerationInput:
    """Everything the pipeline needs for one choice: the engine request it submits, and what is
    done with the text (stop strings, and how it is parsed into reasoning, content and tool calls;
    text None: all content)."""

    request: EngineRequest
    stop: list[str] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    text: TextSpec | None = None


class Generation:
    """One submitted engine request. Construction submits it, so RequestRejected (the request can never
    fit) is raised before any response starts; `deltas()` then yields its StreamDeltas once."""

    def __init__(self, engine, tokenizer, gen: GenerationInput):
        self.gen = gen
        self.tokenizer = tokenizer
        self.submitted_at = time.perf_counter()
        self.finished_at: float | None = None
        self.handle = engine.submit(gen.request)

    def abort(self, reason: str = "cancelled") -> None:
        """Drop the engine request (no-op once it has ended)."""
        self.handle.abort(reason)

    async def deltas(self) -> AsyncIterator[StreamDelta]:
        """Reasoning, Content and tool-call deltas as text becomes safe to send, then exactly one
        Finish or Error."""
        gen, params, prompt_ids = self.gen, self.gen.request.params, self.gen.request.prompt_token_ids
        detok = IncrementalDetokenizer(self.tokenizer, prompt_ids=prompt_ids, skip_special_tokens=True)
        stops = StopStringMatcher(gen.stop, gen.include_stop_str_in_output)
        spell = spelling_for(self.tokenizer) if params.logprobs is not None else None
        parse = gen.text.pipeline() if gen.text is not None and gen.text.active else None
        carry = _TokenCarry()
        completion_tokens = 0
        generated = 0  # characters of text the tokens so far decoded to (where the next token's text starts)
        prediction = gen.request.prediction_token_ids
        predicted = PredictionMatch(prediction) if prediction else None  # usage's prediction tokens
        try:
            async for event in self.handle:
                if isinstance(event, TokenEvent):
                    completion_tokens += 1
                    if predicted is not None:
                        predicted.feed(event.token_id)
                    piece = detok.add(event.token_id)
                    text, matched = stops.feed(piece)
                    was_reasoning = parse is not None and parse.in_reasoning
                    out = _parsed(parse, text)
                    in_reasoning = was_reasoning or (parse is not None and parse.in_reasoning)
                    # Logprobs cover content tokens only; reasoning tokens' ids still ride along.
                    carry.add(event.token_id,
                              token_logprob(spell, event.token_id, event.logprobs) if spell and not in_reasoning
                              else None, generated)
                    generated += len(piece)
                    if matched:  # the stop string's own tokens are not the output's (their ids still ride)
                        carry.drop_logprobs_from(stops.emitted)
                    stop_now = matched or (parse is not None and parse.should_stop)
                    if stop_now:
                        self.abort("stop")
                        self.finished_at = time.perf_counter()
                        out += parse.finish() if parse is not None else []
                    for delta in carry.attach(out, final=stop_now, want_logprobs=spell is not None):
                        yield delta
                    if stop_now:
                        _count_tool_calls(parse)
                        yield Finish(_finish_reason("stop", parse),
                                     _usage(len(prompt_ids), completion_tokens, 0, parse, predicted),
                                     stop_string=stops.matched, engine_reason="stop")
                        return
                elif isinstance(event, Finished):
                    self.finished_at = time.perf_counter()
                    tail, matched = stops.feed(detok.flush())
                    tail += stops.flush()
                    if matched:
                        carry.drop_logprobs_from(stops.emitted)
                    out = _parsed(parse, tail) + (parse.finish() if parse is not None else [])
                    for delta in carry.attach(out, final=True, want_logprobs=spell is not None):
                        yield delta
                    base = "stop" if matched and event.reason != "timeout" else event.reason
                    prompt_lps = None
                    if params.prompt_logprobs is not None:
                        prompt_lps = prompt_logprobs(spelling_for(self.tokenizer), prompt_ids,
                                                     event.prompt_logprobs)
                    _count_tool_calls(parse)
                    yield Finish(_finish_reason(base, parse),
                                 _usage(event.prompt_tokens, event.completion_tokens, event.cached_tokens, parse,
                                        predicted),
                                 prompt_logprobs=prompt_lps, stop_string=stops.matched, engine_reason=base)
                    return
                elif isinstance(event, Failed):
                    yield Error(event.message)
                    return
        finally:
            self.abort()


def _parsed(parse: TextPipeline | None, text: str) -> list[StreamDelta]:
    """Deltas for newly decoded text: through the text pipeline, or as content when there is none."""
    if parse is not None:
        return parse.feed(text) if text else []
    return [Content(text)] if text else []


def _count_tool_calls(parse: TextPipeline | None) -> None:
    """The generation's delivered and rejected tool calls, into metrale:tool_calls_total."""
    if parse is not None:
        count_tool_calls(len(parse.tool_calls), len(parse.rejected_tool_calls))


def _finish_reason(base: str, parse: TextPipeline | None) -> str:
    """The wire finish_reason: timeout, then tool_calls, then a stop string / the engine's reason
    (base already prefers a matched stop string over the engine's reason). A call left open by the
    end (max_tokens in the middle of it) makes no tool_calls finish: the client was sent a call it
    cannot complete (or none for that region), and the engine's reason (length) says why."""
    made_calls = parse is not None and bool(parse.tool_calls) and not parse.tool_call_cut_off
    return resolve_finish_reason(base, made_calls)


class _TokenCarry:
    """Token ids (and content TokenLogprob entries) waiting for a delta to ride on.

    They go on the last Content of a batch of deltas, else (ids only) on the last Reasoning;
    with `final`, leftovers ride on an empty Content, so every generated token's id is sent once.
    A stop string's cut drops the logprobs of the tokens wholly past it (drop_logprobs_from): the text
    their logprobs describe is not sent (a token the cut splits keeps its entry).
    """

    def __init__(self):
        self.ids: list[int] = []
        self.logprobs: list[TokenLogprob] = []
        self._starts: list[int] = []  # where each logprob entry's token text starts, in characters of output

    def add(self, token_id: int, logprob_entry: TokenLogprob | None, start: int = 0) -> None:
        self.ids.append(token_id)
        if logprob_entry is not None:
            self.logprobs.append(logprob_entry)
            self._starts.append(start)

    def drop_logprobs_from(self, cut: int) -> None:
        """Forget the logprob entries of tokens whose text starts at or past character `cut` of the output."""
        keep = [i for i, start in enumerate(self._starts) if start < cut]
        self.logprobs = [self.logprobs[i] for i in keep]
        self._starts = [self._starts[i] for i in keep]

    def attach(self, deltas: list[StreamDelta], final: bool, want_logprobs: bool) -> list[StreamDelta]:
        content = next((d for d in reversed(deltas) if isinstance(d, Content)), None)
        if content is None and final and (self.ids or self.logprobs):
            content = Content("")
            deltas = [*deltas, content]
        if content is not None:
            content.token_ids = self.ids
            content.logprobs = self.logprobs if want_logprobs else None
            self.ids, self.logprobs, self._starts = [], [], []
            return deltas
        reasoning = next((d for d in reversed(deltas) if isinstance(d, Reasoning)), None)
        if reasoning is not None:
            reasoning.token_ids, self.ids = self.ids, []
        return deltas


def _usage(prompt: int, completion: int, cached: int, parse, predicted: PredictionMatch | None) -> Usage:
    """One choice's Usage (token counts): its reasoning tokens from the text pipeline `parse` (None: 0) and
    its prediction tokens from `predicted` (None, no prediction: 0 and 0)."""
    return Usage(prompt, completion, cached, reasoning_tokens=parse.reasoning_tokens if parse else 0,
                 accepted_prediction_tokens=predicted.accepted if predicted else 0,
                 rejected_prediction_tokens=predicted.rejected if predicted else 0)
