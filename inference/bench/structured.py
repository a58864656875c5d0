"""Structured-output figures: grammar compile times and decode tokens/s with and without a JSON schema.

Runs on an in-process LLMEngine (no HTTP), greedy, so both sides of a comparison do the
same forward work: the schema below never completes within max_tokens (an array of at
least 64 records), so a constrained request decodes exactly as many tokens as a free one.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from inference.engine import sampler as sampler_module
from inference.engine.grammar import GrammarCompiler, GrammarSpec
from inference.engine.grammar_state import StructuredOutput
from inference.engine.request import EngineRequest
from inference.engine.sampling_params import SamplingParams

RECORDS = {"type": "array", "minItems": 64, "items": {
    "type": "object", "properties": {
        "id": {"type": "integer", "minimum": 0}, "name": {"type": "string", "maxLength": 24},
        "email": {"type": "string", "format": "email"}, "score": {"type": "number", "minimum": 0, "maximum": 1},
        "tags": {"type": "array", "items": {"enum": ["new", "vip", "churned"]}, "maxItems": 3}},
    "required": ["id", "name", "email", "score", "tags"], "additionalProperties": False}}


@dataclass(slots=True)
class DecodeRun:
    """One batch decoded to max_tokens: decode tokens/s (after every row's first token) and the
    seconds spent computing and applying grammar masks during the decode steps."""

    batch: int
    constrained: bool
    tokens_per_s: float
    mask_s: float
    decode_s: float


def compile_times_s(tokenizer, schemas: list[dict]) -> tuple[float, list[float]]:
    """(seconds to build llguidance's tokenizer, each schema's compile seconds) with a fresh, cold cache."""
    compiler = GrammarCompiler(tokenizer)
    t0 = time.perf_counter()
    compiler.compile(GrammarSpec.json_schema({"type": "object"}))
    setup = time.perf_counter() - t0
    return setup, [compiler.compile(GrammarSpec.json_schema(s)).compile_s for s in schemas]


def decode_run(engine, tokenizer, batch: int, structured: StructuredOutput | None, max_tokens: int = 64) -> DecodeRun:
    """Decode `batch` requests together to max_tokens; times only steps where every row decodes."""
    prompt = tokenizer.encode_chat([{"role": "user", "content": "List customer records as JSON."}])
    seqs = [engine.add_request(EngineRequest(prompt, SamplingParams(
        temperature=0, max_tokens=max_tokens, ignore_eos=True, structured=structured), f"bench-{i}"))
        for i in range(batch)]
    mask_s = [0.0]
    apply = sampler_module.apply_grammar_masks

    def timed(logits, rows):
        t = time.perf_counter()
        apply(logits, rows)
        mask_s[0] += time.perf_counter() - t

    while any(s.num_output_tokens == 0 for s in seqs):
        engine.step()
    sampler_module.apply_grammar_masks = timed
    try:
        start_tokens = sum(s.num_output_tokens for s in seqs)
        t0 = time.perf_counter()
        while engine.has_work():
            engine.step()
        wall = time.perf_counter() - t0
    finally:
        sampler_module.apply_grammar_masks = apply
    decoded = sum(s.num_output_tokens for s in seqs) - start_tokens
    return DecodeRun(batch, structured is not None, decoded / wall, mask_s[0], wall)


def median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000
