"""POST /v1/completions: prompts (text or token ids) -> prompts x n engine requests -> chunks or a body.

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
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field

from .chat_encoder import DONE, ChatChunkEncoder, sse
from .choices import Choices
from .completion_encoder import CompletionChunkEncoder, completion_body
from .deltas import Content, Error, Finish, Usage
from .errors import ApiError
from .logprobs import LegacyLogprobs, merge_legacy, prompt_entries, spelling_for
from .model_names import check_model
from .pipeline import GenerationInput
from .prompts import completion_prompt_ids
from .protocol import CompletionRequest, parse_json_body, validate
from .sampling import context_limit, defaults_for, resolve_max_tokens, sampling_params, timeout_for

log = logging.getLogger("metrale.api")

OPENAI_DEFAULT_MAX_TOKENS = 16


@dataclass(slots=True)
class PreparedCompletion:
    """A completions request ready for the engine: inputs[j] is choice j, of prompt j // n."""

    completion_id: str
    model: str
    created: int
    stream: bool
    include_usage: bool
    continuous_usage: bool
    return_token_ids: bool
    logprobs: bool
    echo: bool
    n: int
    prompt_texts: list[str]
    prompt_ids: list[list[int]]
    inputs: list[GenerationInput]
    # Updated as generation runs: what the rate limiter charges when it ends.
    usage: Usage = field(default_factory=Usage)
    # Seconds from submit to the last choice's end (blocking requests; for Server-Timing).
    engine_s: float | None = None

    @property
    def reserve_tokens(self) -> int:
        """Tokens to reserve against the rate limit: every prompt + every choice's max_tokens."""
        return sum(len(p) for p in self.prompt_ids) + sum(g.params.max_tokens for g in self.inputs)

    @property
    def timeout_s(self) -> float | None:
        """The request's deadline in seconds."""
        return self.inputs[0].timeout_s


def parse(raw_body: bytes) -> dict:
    """Parse and validate the body (no model needed). Raises ApiError (400) on bad input."""
    return validate(CompletionRequest, parse_json_body(raw_body))


def prepare(req: dict, rt, request_id: str | None = None, cache_salt: str = "") -> PreparedCompletion:
    """Tokenize every prompt and build the engine inputs (engine request ids `<request_id>-<choice>`;
    cache_salt: the tenant's prefix-cache salt).

    Raises ApiError: 404 for an unknown model, 400 for out-of-vocabulary ids, a suffix on a model
    without infill, or a prompt + max_tokens over the context (param prompt, with the numbers).
    """
    check_model(req.get("model", ""), rt.model_id)
    tok, vocab = rt.tokenizer, rt.tokenizer.vocab_size
    defaults = defaults_for(rt.model_path)
    limit = context_limit(rt.engine)
    n = req.get("n") or 1
    logprobs = req.get("logprobs")
    prompt_logprobs = logprobs if req["echo"] and logprobs is not None else None
    prompt_ids, prompt_texts, inputs = [], [], []
    for k, prompt in enumerate(req["prompt"]):
        param = "prompt" if len(req["prompt"]) == 1 else f"prompt[{k}]"
        ids = completion_prompt_ids(tok, prompt, req.get("suffix"), vocab, param)
        max_tokens = resolve_max_tokens(req.get("max_tokens"), defaults.get("max_tokens", OPENAI_DEFAULT_MAX_TOKENS),
                                        len(ids), limit, param=param)
        prompt_ids.append(ids)
        prompt_texts.append(prompt if isinstance(prompt, str) else tok.decode(prompt, skip_special_tokens=False))
        for i in range(n):
            params = sampling_params(req, max_tokens=max_tokens, tokenizer=tok, defaults=defaults,
                                     logprobs=logprobs, prompt_logprobs=prompt_logprobs, seed_offset=i)
            inputs.append(GenerationInput(ids, params, stop=req["stop"],
                                          include_stop_str_in_output=req["include_stop_str_in_output"],
                                          timeout_s=timeout_for(req),
                                          request_id=f"{request_id}-{len(inputs)}" if request_id else None,
                                          cache_salt=cache_salt))
    opts = req.get("stream_options") or {}
    return PreparedCompletion(
        completion_id=f"cmpl-{secrets.token_hex(12)}", model=rt.model_id, created=int(time.time()),
        stream=req["stream"], include_usage=bool(opts.get("include_usage")),
        continuous_usage=bool(opts.get("continuous_usage_stats")), return_token_ids=req["return_token_ids"],
        logprobs=logprobs is not None, echo=req["echo"], n=n, prompt_texts=prompt_texts, prompt_ids=prompt_ids,
        inputs=inputs, usage=Usage(sum(len(ids) for ids in prompt_ids), 0))


def _usage(p: PreparedCompletion, finishes: dict[int, Finish]) -> Usage:
    """Each prompt counted once, completion tokens summed over choices."""
    usage = Usage()
    for k in range(len(p.prompt_ids)):
        first = finishes.get(k * p.n)
        usage.prompt_tokens += first.usage.prompt_tokens if first else len(p.prompt_ids[k])
        usage.cached_prompt_tokens += first.usage.cached_prompt_tokens if first else 0
    usage.completion_tokens = sum(f.usage.completion_tokens for f in finishes.values())
    return usage


def _prompt_logprobs(rt, p: PreparedCompletion, j: int, finish: Finish | None) -> dict:
    """The echoed prompt's legacy logprobs (offsets from 0); null logprobs while the engine gives none."""
    ids = p.prompt_ids[j // p.n]
    entries = (finish.prompt_logprobs if finish is not None and finish.prompt_logprobs is not None
               else prompt_entries(spelling_for(rt.tokenizer), ids, None))
    return LegacyLogprobs(0).extend(entries)


async def stream(rt, p: PreparedCompletion) -> AsyncIterator[bytes]:
    """SSE frames: per choice its echo (if asked), text chunks and a finish chunk; then the usage chunk if
    asked and [DONE]. Submits before the first frame (RequestRejected is raised by the first `anext`);
    an error after that is sent in-band as data: {"error": ...} then [DONE]."""
    choices = Choices(rt.engine, rt.tokenizer, p.inputs)
    enc = CompletionChunkEncoder(p.completion_id, p.model, p.created, continuous_usage=p.continuous_usage)
    defer = p.echo and p.logprobs
    held: dict[int, list[bytes]] = {j: [] for j in range(len(choices))}
    legacy = [LegacyLogprobs(len(p.prompt_texts[j // p.n]) if p.echo else 0) for j in range(len(choices))]
    running = p.usage
    finishes: dict[int, Finish] = {}
    failed = False
    yield b": metrale\n\n"  # an SSE comment: the stream is open and the requests are submitted
    if p.echo and not defer:
        for j in range(len(choices)):
            ids = p.prompt_ids[j // p.n] if p.return_token_ids else None
            yield sse(enc.chunk(j, p.prompt_texts[j // p.n], token_ids=ids, usage=running))
    try:
        async with aclosing(choices.merged()) as merged:
            async for j, delta in merged:
                if isinstance(delta, Error):
                    failed = True
                    yield sse(ChatChunkEncoder.error_frame(delta))
                    break
                if isinstance(delta, Content):
                    running.completion_tokens += len(delta.token_ids or [])
                if isinstance(delta, Finish):
                    finishes[j] = delta
                    frame = sse(enc.chunk(j, "", finish_reason=delta.reason, usage=running))
                elif isinstance(delta, Content) and (delta.text or p.logprobs or p.return_token_ids):
                    lps = legacy[j].extend(delta.logprobs or []) if p.logprobs else None
                    ids = delta.token_ids if p.return_token_ids else None
                    frame = sse(enc.chunk(j, delta.text, logprobs=lps, token_ids=ids, usage=running))
                else:
                    continue
                if not defer:
                    yield frame
                    continue
                held[j].append(frame)
                if isinstance(delta, Finish):
                    echo = enc.chunk(j, p.prompt_texts[j // p.n], logprobs=_prompt_logprobs(rt, p, j, delta),
                                     usage=running)
                    yield sse(echo)
                    for frame in held.pop(j):
                        yield frame
    except Exception as exc:  # a bug must still end the stream in OpenAI's shape
        log.exception("completions stream failed")
        failed = True
        yield sse(ChatChunkEncoder.error_frame(Error(f"internal error: {exc}")))
    if not failed:
        p.usage = _usage(p, finishes)
        if p.include_usage:
            yield sse(enc.usage_chunk(p.usage))
    yield DONE


async def complete(rt, p: PreparedCompletion) -> dict:
    """The blocking text_completion body (choices in index order). Sets p.engine_s.

    Raises RequestRejected (from submit) and ApiError 500 when the engine fails."""
    choices = Choices(rt.engine, rt.tokenizer, p.inputs)
    texts: list[list[str]] = [[] for _ in range(len(choices))]
    entries: list[list[dict]] = [[] for _ in range(len(choices))]
    token_ids: list[list[int]] = [[] for _ in range(len(choices))]
    finishes: dict[int, Finish] = {}
    async with aclosing(choices.merged()) as merged:
        async for j, delta in merged:
            if isinstance(delta, Content):
                p.usage.completion_tokens += len(delta.token_ids or [])
                texts[j].append(delta.text)
                entries[j].extend(delta.logprobs or [])
                token_ids[j].extend(delta.token_ids or [])
            elif isinstance(delta, Finish):
                finishes[j] = delta
            elif isinstance(delta, Error):
                raise ApiError(500, delta.message, type="server_error")
    p.engine_s = choices.engine_s
    p.usage = _usage(p, finishes)
    out = []
    for j in range(len(choices)):
        prompt_text = p.prompt_texts[j // p.n]
        choice = {"index": j, "text": (prompt_text if p.echo else "") + "".join(texts[j]), "logprobs": None,
                  "finish_reason": finishes[j].reason if j in finishes else "stop"}
        if p.logprobs:
            parts = [_prompt_logprobs(rt, p, j, finishes.get(j))] if p.echo else []
            parts.append(LegacyLogprobs(len(prompt_text) if p.echo else 0).extend(entries[j]))
            choice["logprobs"] = merge_legacy(parts)
        if p.return_token_ids:
            choice["prompt_token_ids"] = p.prompt_ids[j // p.n]
            choice["token_ids"] = token_ids[j]
        out.append(choice)
    return completion_body(p.completion_id, p.model, p.created, out, p.usage)
