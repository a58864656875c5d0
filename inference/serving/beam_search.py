"""Beam search (blocking requests): the request's fields checked, one engine beam search, its choices.

The search is the engine's (engine/beam_search.py: vLLM's rule, the live beams as decode rows of
the continuous batch, each step's beams forked copy-on-write from their parents, so the prompt
and every beam's prefix are computed once). This module submits one EngineRequest with `beam`
and turns the n best beams into n choices, best first: text without an ending EOS, and with
`logprobs` each output token's logprob and its step's best alternatives (the EOS that ended a
beam included), so a choice's logprobs sum to its beam's cumulative logprob (vLLM returns a
beam's per-step candidate logprobs and cumulative_logprob the same way).
Fields: `use_beam_search`, the width `num_beams` (metrale's) or else `n` (vLLM's rule),
`length_penalty` (1.0), `early_stopping` (false); `n` best beams come back, `n` <= width.
"""
from __future__ import annotations

import asyncio
import time

from inference.engine.beam_search import Beam, BeamSpec, score
from inference.engine.outputs import Failed, Finished
from inference.engine.request import EngineRequest
from inference.engine.sampling_params import SamplingParams

from .deltas import Content, Error, Finish, Usage
from .errors import bad_request
from .logprobs import spelling_for, token_logprob

__all__ = ["MAX_BEAMS", "EXCLUDED", "Beam", "BeamSpec", "score", "beam_spec", "beam_request", "beam_result", "search",
           "BeamChoices"]

MAX_BEAMS = 32
# Fields whose effect a beam search cannot honour (it ranks the model's raw log-probabilities).
EXCLUDED = ("tools", "response_format", "structured_outputs", "prediction", "stop")


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


def beam_request(prompt_ids: list[int], spec: BeamSpec, max_tokens: int, eos_ids, *, salt: str = "",
                 timeout_s: float | None = None, top_logprobs: int = 0, lora_name: str | None = None) -> EngineRequest:
    """The EngineRequest of one beam search of up to max_tokens steps (its Finished's `beams`: the spec.n
    best, best first). eos_ids: the token ids that end a beam. top_logprobs: how many candidates each
    step keeps as alternatives (at least the 2 * width the search ranks)."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, logprobs=max(2 * spec.width, top_logprobs),
                            ignore_eos=True, stop_token_ids=sorted(set(eos_ids)))
    return EngineRequest(list(prompt_ids), params, timeout_s=timeout_s, cache_salt=salt, lora_name=lora_name,
                         beam=spec)


async def beam_result(handle) -> Finished:
    """The Finished of a submitted beam search (reason stop, or timeout / cancelled with the best beams so
    far); the request is aborted if the waiter is cancelled. Raises RuntimeError when it failed."""
    try:
        async for event in handle:
            if isinstance(event, Failed):
                raise RuntimeError(event.message)
            if isinstance(event, Finished):
                return event
    finally:
        handle.abort()
    raise RuntimeError("the beam search ended without a result")


async def search(engine, prompt_ids: list[int], spec: BeamSpec, max_tokens: int, eos_ids, *,
                 salt: str = "", timeout_s: float | None = None) -> list[Beam]:
    """The `spec.n` best beams after a beam search of up to max_tokens steps, best first. engine: an
    AsyncEngine. Raises what submit raises (RequestRejected, EngineOverloaded) and RuntimeError when
    the search fails."""
    handle = engine.submit(beam_request(prompt_ids, spec, max_tokens, eos_ids, salt=salt, timeout_s=timeout_s))
    return list((await beam_result(handle)).beams or [])


class BeamChoices:
    """The choices of one beam-search request, in Choices' shape: `generations[i].deltas()` yields choice i's
    Content and Finish once the shared search ends (an Error if it fails)."""

    def __init__(self, engine, tokenizer, prepared):
        spec = prepared.beam
        first = prepared.inputs[0].request
        self.started = time.perf_counter()
        # The request's logprobs count (chat's top_logprobs, completions' logprobs); None: no logprobs.
        self.top_logprobs = first.params.logprobs
        # A refusal (RequestRejected, EngineOverloaded) is raised here, as Choices' submits are.
        self.handle = handle = engine.submit(beam_request(
            first.prompt_token_ids, spec, first.params.max_tokens, tokenizer.eos_token_ids, salt=first.cache_salt,
            timeout_s=first.timeout_s, top_logprobs=self.top_logprobs or 0, lora_name=first.lora_name))
        self.task = asyncio.ensure_future(beam_result(handle))
        self.generations = [_BeamChoice(self, tokenizer, i, len(first.prompt_token_ids))
                            for i in range(len(prepared.inputs))]


class _BeamChoice:
    def __init__(self, owner: BeamChoices, tokenizer, index: int, num_prompt: int):
        self.owner, self.tokenizer, self.index, self.num_prompt = owner, tokenizer, index, num_prompt
        self.submitted_at = owner.started
        self.finished_at: float | None = None

    def abort(self, reason: str = "cancelled") -> None:
        self.owner.handle.abort(reason)
        self.owner.task.cancel()

    async def deltas(self):
        try:
            finished = await asyncio.shield(self.owner.task)
        except Exception as exc:  # a failed search (or a refusal) ends this request in-band
            yield Error(f"engine error: {exc}")
            return
        self.finished_at = time.perf_counter()
        beams = finished.beams or []
        if self.index >= len(beams):  # fewer hypotheses than choices (a tiny vocabulary, or an early abort)
            if finished.reason != "stop":
                yield Finish(finished.reason, Usage(self.num_prompt, 0))
                return
            yield Error("beam search produced fewer beams than choices")
            return
        beam = beams[self.index]
        out = beam.output[:-1] if beam.finished else beam.output
        yield Content(self.tokenizer.decode(out, skip_special_tokens=True), logprobs=self._logprobs(beam),
                      token_ids=list(beam.output))
        reason = "stop" if beam.finished else ("length" if finished.reason == "stop" else finished.reason)
        yield Finish(reason, Usage(self.num_prompt, len(beam.output)))

    def _logprobs(self, beam: Beam) -> list | None:
        """One entry per output token: its logprob and its step's `top_logprobs` best candidates."""
        n = self.owner.top_logprobs
        if n is None:
            return None
        spell = spelling_for(self.tokenizer)
        return [token_logprob(spell, token, (logprob, top[:n]))
                for token, (logprob, top) in zip(beam.output, beam.logprobs)]
