"""POST /v1/completions: the wire fields -> a GenerationRequest, and the deltas -> text_completion chunks or a body.

Source: OpenAI API reference, "Create completion": choice index = prompt index * n + i;
`echo` puts the prompt before the completion; `logprobs` (0-20 here, OpenAI allows 5,
vLLM 20) in the legacy shape, covering the prompt too when echoed; max_tokens defaults
to 16. With a seed, choice i of each prompt uses seed + i. Streaming with echo and
logprobs holds a choice's chunks until its prompt logprobs exist (at its end), so the
echoed prompt still comes first.
"""
from __future__ import annotations

import logging
import secrets
from collections.abc import AsyncIterator
from contextlib import aclosing

from .chat_encoder import DONE, ChatChunkEncoder, sse
from .choices import Choices
from .completion_encoder import CompletionChunkEncoder, completion_body
from .deltas import Content, Error, Finish, cancelled_as_error
from .errors import engine_error
from .logprobs import LegacyLogprobs, merge_legacy, prompt_logprobs, spelling_for
from .prepare import GenerationRequest, Prepared
from .protocol import CompletionRequest, parse_json_body, validate
from .structured import requested_grammar

log = logging.getLogger("metrale.api")

OPENAI_DEFAULT_MAX_TOKENS = 16


def parse(raw_body: bytes) -> dict:
    """Parse and validate the body (no model needed). Raises ApiError (400) on bad input."""
    return validate(CompletionRequest, parse_json_body(raw_body))


def generation_request(req: dict) -> GenerationRequest:
    """The validated completions request in the preparation pipeline's terms."""
    logprobs = req.get("logprobs")
    return GenerationRequest(
        param="prompt", model=req.get("model", ""), prompts=req["prompt"], suffix=req.get("suffix"),
        n=req.get("n") or 1, max_tokens=req.get("max_tokens"), default_max_tokens=OPENAI_DEFAULT_MAX_TOKENS,
        sampling=req, logprobs=logprobs,
        prompt_logprobs=logprobs if req["echo"] and logprobs is not None else None,
        stop=req["stop"], include_stop_str_in_output=req["include_stop_str_in_output"],
        structured=requested_grammar(req), timeout_s=req.get("timeout"), beam=req.get("beam"))


class CompletionWire:
    """One completions request's answer: `frames(run)` for a stream, `body(run)` for a blocking one."""

    def __init__(self, req: dict, prepared: Prepared, tokenizer):
        opts = req.get("stream_options") or {}
        self.prepared = prepared
        self.tokenizer = tokenizer
        self.stream = req["stream"]
        self.completion_id = f"cmpl-{secrets.token_hex(12)}"
        self.include_usage = bool(opts.get("include_usage"))
        self.continuous_usage = bool(opts.get("continuous_usage_stats"))
        self.return_token_ids = req["return_token_ids"]
        self.logprobs = req.get("logprobs") is not None
        self.echo = req["echo"]

    def _prompt_text(self, j: int) -> str:
        return self.prepared.prompt_texts[self.prepared.prompt_of(j)]

    def _prompt_logprobs(self, j: int, finish: Finish | None) -> dict:
        """The echoed prompt's legacy logprobs (offsets from 0); null logprobs while the engine gives none."""
        ids = self.prepared.prompt_ids[self.prepared.prompt_of(j)]
        entries = (finish.prompt_logprobs if finish is not None and finish.prompt_logprobs is not None
                   else prompt_logprobs(spelling_for(self.tokenizer), ids, None))
        return LegacyLogprobs(0).extend(entries)

    async def frames(self, run: Choices) -> AsyncIterator[bytes]:
        """SSE frames: per choice its echo (if asked), text chunks and a finish chunk; then the usage chunk
        if asked and [DONE]. An engine error is sent in-band as data: {"error": ...} then [DONE]."""
        p = self.prepared
        enc = CompletionChunkEncoder(self.completion_id, p.model, p.created, continuous_usage=self.continuous_usage,
                                     fingerprint=p.fingerprint)
        defer = self.echo and self.logprobs
        held: dict[int, list[bytes]] = {j: [] for j in range(len(run))}
        legacy = [LegacyLogprobs(len(self._prompt_text(j)) if self.echo else 0) for j in range(len(run))]
        failed = False
        yield b": metrale\n\n"  # an SSE comment: the stream is open and the requests are submitted
        if self.echo and not defer:
            for j in range(len(run)):
                ids = p.prompt_ids[p.prompt_of(j)] if self.return_token_ids else None
                yield sse(enc.chunk(j, self._prompt_text(j), token_ids=ids, usage=run.usage))
        try:
            async with aclosing(run.merged()) as merged:
                async for j, delta in merged:
                    delta = cancelled_as_error(delta)
                    if isinstance(delta, Error):
                        failed = True
                        yield sse(ChatChunkEncoder.error_frame(delta))
                        break
                    if isinstance(delta, Finish):
                        frame = sse(enc.chunk(j, "", finish_reason=delta.reason, usage=run.usage))
                    elif isinstance(delta, Content) and (delta.text or self.logprobs or self.return_token_ids):
                        lps = legacy[j].extend(delta.logprobs or []) if self.logprobs else None
                        ids = delta.token_ids if self.return_token_ids else None
                        frame = sse(enc.chunk(j, delta.text, logprobs=lps, token_ids=ids, usage=run.usage))
                    else:
                        continue
                    if not defer:
                        yield frame
                        continue
                    held[j].append(frame)
                    if isinstance(delta, Finish):
                        echo = enc.chunk(j, self._prompt_text(j), logprobs=self._prompt_logprobs(j, delta),
                                         usage=run.usage)
                        yield sse(echo)
                        for frame in held.pop(j):
                            yield frame
        except Exception as exc:  # a bug must still end the stream in OpenAI's shape
            log.exception("completions stream failed")
            failed = True
            yield sse(ChatChunkEncoder.error_frame(Error(f"internal error: {exc}")))
        if not failed and self.include_usage:
            yield sse(enc.usage_chunk(run.usage))
        yield DONE

    async def body(self, run: Choices) -> dict:
        """The blocking text_completion body (choices in index order).

        Raises ApiError 500 when the engine fails."""
        p = self.prepared
        texts: list[list[str]] = [[] for _ in range(len(run))]
        entries: list[list] = [[] for _ in range(len(run))]
        token_ids: list[list[int]] = [[] for _ in range(len(run))]
        async with aclosing(run.merged()) as merged:
            async for j, delta in merged:
                delta = cancelled_as_error(delta)
                if isinstance(delta, Content):
                    texts[j].append(delta.text)
                    entries[j].extend(delta.logprobs or [])
                    token_ids[j].extend(delta.token_ids or [])
                elif isinstance(delta, Error):
                    raise engine_error(delta)
        out = []
        for j in range(len(run)):
            prompt_text = self._prompt_text(j)
            finish = run.finishes.get(j)
            choice = {"index": j, "text": (prompt_text if self.echo else "") + "".join(texts[j]), "logprobs": None,
                      "finish_reason": finish.reason if finish else "stop"}
            if self.logprobs:
                parts = [self._prompt_logprobs(j, finish)] if self.echo else []
                parts.append(LegacyLogprobs(len(prompt_text) if self.echo else 0).extend(entries[j]))
                choice["logprobs"] = merge_legacy(parts)
            if self.return_token_ids:
                choice["prompt_token_ids"] = p.prompt_ids[p.prompt_of(j)]
                choice["token_ids"] = token_ids[j]
            out.append(choice)
        return completion_body(self.completion_id, p.model, p.created, out, run.usage, p.fingerprint)
