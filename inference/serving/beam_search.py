"""Beam search (blocking requests): the request's fields checked, the search over engine steps, its choices.

The algorithm is vLLM's (`vllm/entrypoints/llm.py` beam_search): every step, each live beam
is one engine request of max_tokens 1 asking for the top 2 * width log-probabilities (the
model's own, temperature 0: no sampling control applies); each candidate extends its beam's
cumulative log-probability; candidates ending in EOS are complete, the `width` best others
live on; after max_tokens steps (or, with early_stopping, once `width` beams are complete) the
complete and live beams are ranked by vLLM's score, cumulative logprob / length **
length_penalty (length: prompt + output tokens, an ending EOS not counted). The beams'
requests run in the same continuous batch as everything else and share their prompt's full
KV blocks through the prefix cache (each recomputes only its last, partial block).
Fields: `use_beam_search`, the width `num_beams` (metrale's) or else `n` (vLLM's rule),
`length_penalty` (1.0), `early_stopping` (false); `n` best beams come back, `n` <= width.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from inference.engine.outputs import Failed, TokenEvent
from inference.engine.request import EngineRequest
from inference.engine.sampling_params import SamplingParams

from .deltas import Content, Error, Finish, Usage
from .errors import bad_request

MAX_BEAMS = 32
# Fields whose effect a beam search cannot honour (it ranks the model's raw log-probabilities).
EXCLUDED = ("tools", "response_format", "structured_outputs", "prediction", "logprobs", "stop")


@dataclass(frozen=True, slots=True)
class BeamSpec:
    """width: beams kept per step; n: beams returned (<= width); length_penalty; early_stopping."""

    width: int
    n: int
    length_penalty: float = 1.0
    early_stopping: bool = False


def beam_spec(attrs: dict) -> BeamSpec | None:
    """The request's BeamSpec (None without `use_beam_search`). attrs: a validated chat or completions
    request. Raises ApiError 400 for `stream`, n > width, a width over MAX_BEAMS, or a field the search
    cannot honour (EXCLUDED), naming the field."""
    if not attrs.get("use_beam_search"):
        return None
    if attrs.get("stream"):
        raise bad_request("'use_beam_search' cannot be used with 'stream': beam search answers blocking "
                          "requests only.", "stream")
    n = attrs.get("n") or 1
    width = attrs.get("num_beams") or n
    if width > MAX_BEAMS:
        raise bad_request(f"'num_beams' must be at most {MAX_BEAMS}.", "num_beams")
    if n > width:
        raise bad_request(f"'n' ({n}) must not exceed the beam width 'num_beams' ({width}).", "n")
    for name in EXCLUDED:
        value = attrs.get(name)
        if value not in (None, False, [], {}):
            raise bad_request(f"'{name}' cannot be used with 'use_beam_search'.", name,
                              code="unsupported_parameter")
    penalty = attrs.get("length_penalty")
    return BeamSpec(width, n, 1.0 if penalty is None else float(penalty), bool(attrs.get("early_stopping")))


@dataclass(slots=True)
class Beam:
    """One hypothesis: all its token ids (prompt + output), its cumulative logprob, and whether EOS ended it."""

    tokens: list[int]
    cum_logprob: float = 0.0
    finished: bool = False
    output: list[int] = field(default_factory=list)


def score(beam: Beam, length_penalty: float) -> float:
    """vLLM's get_beam_search_score: cum_logprob / len ** length_penalty, len without an ending EOS."""
    length = len(beam.tokens) - (1 if beam.finished else 0)
    return beam.cum_logprob / (length ** length_penalty)


async def _top(engine, beam: Beam, k: int, salt: str, timeout_s: float | None) -> list[tuple[int, float]]:
    """The k most likely next tokens of `beam` with their logprobs (one engine request)."""
    params = SamplingParams(temperature=0, max_tokens=1, logprobs=k, ignore_eos=True)
    handle = engine.submit(EngineRequest(beam.tokens, params, timeout_s=timeout_s, cache_salt=salt))
    top = None
    async for event in handle:
        if isinstance(event, TokenEvent):
            if event.logprobs is None:
                raise RuntimeError("the engine gave a beam's step no logprobs")
            top = event.logprobs[1]
        elif isinstance(event, Failed):
            raise RuntimeError(event.message)
    if top is None:
        raise RuntimeError("a beam's step ended without a token")
    return top


async def search(engine, prompt_ids: list[int], spec: BeamSpec, max_tokens: int, eos_ids, *,
                 salt: str = "", timeout_s: float | None = None) -> list[Beam]:
    """The `spec.n` best beams after a beam search of up to max_tokens steps, best first.

    engine: an AsyncEngine (submit). eos_ids: the token ids that end a beam. Raises RuntimeError
    when an engine request fails, and what submit raises (RequestRejected, EngineOverloaded).
    """
    eos = frozenset(eos_ids)
    live = [Beam(list(prompt_ids))]
    done: list[Beam] = []
    for _ in range(max_tokens):
        tops = await asyncio.gather(*(_top(engine, b, 2 * spec.width, salt, timeout_s) for b in live))
        grown = []
        for beam, top in zip(live, tops):
            for token, logprob in top:
                child = Beam(beam.tokens + [token], beam.cum_logprob + logprob, token in eos, beam.output + [token])
                (done if child.finished else grown).append(child)
        grown.sort(key=lambda b: score(b, spec.length_penalty), reverse=True)
        live = grown[:spec.width]
        if not live or (spec.early_stopping and len(done) >= spec.width):
            break
    ranked = sorted(done + live, key=lambda b: score(b, spec.length_penalty), reverse=True)
    return ranked[:spec.n]


class BeamChoices:
    """The choices of one beam-search request, in Choices' shape: `generations[i].deltas()` yields choice i's
    Content and Finish once the shared search ends (an Error if it fails)."""

    def __init__(self, engine, tokenizer, prepared):
        spec = prepared.beam
        first = prepared.inputs[0].request
        self.started = time.perf_counter()
        self.task = asyncio.ensure_future(search(
            engine, first.prompt_token_ids, spec, first.params.max_tokens, tokenizer.eos_token_ids,
            salt=first.cache_salt, timeout_s=first.timeout_s))
        self.generations = [_BeamChoice(self, tokenizer, i, len(first.prompt_token_ids))
                            for i in range(len(prepared.inputs))]


class _BeamChoice:
    def __init__(self, owner: BeamChoices, tokenizer, index: int, num_prompt: int):
        self.owner, self.tokenizer, self.index, self.num_prompt = owner, tokenizer, index, num_prompt
        self.submitted_at = owner.started
        self.finished_at: float | None = None

    def abort(self, reason: str = "cancelled") -> None:
        self.owner.task.cancel()

    async def deltas(self):
        try:
            beams = await asyncio.shield(self.owner.task)
        except Exception as exc:  # a failed step (or a refusal mid-search) ends this request in-band
            yield Error(f"engine error: {exc}")
            return
        self.finished_at = time.perf_counter()
        if self.index >= len(beams):  # fewer complete hypotheses than choices (a tiny vocabulary)
            yield Error("beam search produced fewer beams than choices")
            return
        beam = beams[self.index]
        out = beam.output[:-1] if beam.finished else beam.output
        yield Content(self.tokenizer.decode(out, skip_special_tokens=True), token_ids=list(beam.output))
        yield Finish("stop" if beam.finished else "length", Usage(self.num_prompt, len(beam.output)))

