"""Perplexity of a text through the engine's own path, by llama.cpp's llama-perplexity rule.

The rule (llama.cpp's tools/perplexity, the default mode): the text's tokens (a BOS first when
the tokenizer adds one) cut into chunks of n_ctx tokens, the last partial chunk dropped; each
chunk evaluated alone from an empty cache, its first token replaced by BOS when the tokenizer
adds one; the tokens at positions n_ctx / 2 + 1 .. n_ctx - 1 scored, each by the log
probability the model gave it after the tokens before it in the chunk; perplexity =
exp(mean negative log likelihood). Here each chunk is one engine request with prompt_logprobs
(the prefill path a served prompt takes: its weights, its KV cache dtype, its kernels).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from inference.engine.outputs import Failed, Finished
from inference.engine.request import EngineRequest
from inference.engine.sampling_params import SamplingParams


@dataclass(slots=True)
class Perplexity:
    """exp(nll / scored); nll: summed negative log likelihood (nats); scored: tokens scored; chunks;
    chunk_nll: each chunk's part of nll, in the text's order."""

    nll: float
    scored: int
    chunks: int
    chunk_nll: tuple[float, ...] = ()

    @property
    def value(self) -> float:
        return math.exp(self.nll / self.scored)


def chunk_tokens(tokens: list[int], n_ctx: int, bos_id: int | None = None, max_chunks: int | None = None
                 ) -> list[list[int]]:
    """llama-perplexity's chunks of `tokens` (the text's, BOS first when the tokenizer adds one):
    whole n_ctx-token pieces, each starting with bos_id when it is given."""
    n = len(tokens) // n_ctx
    if max_chunks is not None:
        n = min(n, max_chunks)
    out = []
    for i in range(n):
        chunk = list(tokens[i * n_ctx:(i + 1) * n_ctx])
        if bos_id is not None:
            chunk[0] = bos_id
        out.append(chunk)
    return out


def chunk_bos(tokens: list[int], bos_token_id: int | None) -> int | None:
    """The BOS id llama-perplexity opens every chunk with: the tokenizer's, where its encoding of the
    text starts with it (the tokenizer adds one: Gemma's does, SmolLM2's does not), else None."""
    return bos_token_id if tokens and bos_token_id is not None and tokens[0] == bos_token_id else None


def chunk_nlls(engine, chunks: list[list[int]], n_ctx: int) -> list[tuple[float, int]]:
    """(summed negative log likelihood, tokens scored) of each chunk, in order, through an LLMEngine:
    one request per chunk, several at once, each scoring the tokens at positions n_ctx / 2 + 1 ..
    n_ctx - 1 (the module docstring's rule). Raises RuntimeError when the engine fails a chunk."""
    first = n_ctx // 2
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0, ignore_eos=True)
    index = {f"perplexity-{i}": i for i in range(len(chunks))}
    for request_id, chunk in zip(index, chunks):
        engine.add_request(EngineRequest(chunk, params), request_id=request_id)
    out: list[tuple[float, int]] = [(0.0, 0)] * len(chunks)
    while engine.has_work():
        for seq, events in engine.step():
            for ev in events:
                if isinstance(ev, Failed):
                    raise RuntimeError(f"chunk {seq.request_id} failed: {ev.message}")
                if isinstance(ev, Finished):
                    entries = ev.prompt_logprobs[first + 1:n_ctx]
                    out[index[seq.request_id]] = (-sum(entry[0] for entry in entries), len(entries))
    return out


def engine_perplexity(engine, tokens: list[int], n_ctx: int = 512, bos_id: int | None = None,
                      max_chunks: int | None = None) -> Perplexity:
    """Perplexity of `tokens` through an LLMEngine (llama-perplexity's rule, module docstring): one
    request per chunk, several at once. Raises ValueError when the text has fewer than 2 chunks, or
    RuntimeError when the engine fails a chunk."""
    chunks = chunk_tokens(tokens, n_ctx, bos_id, max_chunks)
    if len(chunks) < 2:
        raise ValueError(f"the text has {len(tokens)} tokens; llama-perplexity needs at least {2 * n_ctx}")
    scores = chunk_nlls(engine, chunks, n_ctx)
    return Perplexity(sum(nll for nll, _ in scores), sum(n for _, n in scores), len(chunks),
                      tuple(nll for nll, _ in scores))
