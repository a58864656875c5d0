"""Prefix-cache benefit through HTTP: TTFT with a shared ~1,000-token system prompt, miss vs hit."""
from __future__ import annotations

import random
import statistics

import httpx

from .http_streams import stream_chat
from .workload import make_text


def prefix_ttft(url: str, tokenizer, system_tokens: int = 1000, repeats: int = 3) -> tuple[float, float]:
    """(median TTFT in seconds on a miss, on a hit): each miss uses a fresh system prompt; each hit
    repeats one system prompt already served once, with a different user question."""
    rng = random.Random(1)
    client = httpx.Client()
    misses, hits = [], []
    shared = make_text(tokenizer, system_tokens, rng)
    stream_chat(client, url, [{"role": "system", "content": shared}, {"role": "user", "content": "Hi"}], 1)
    for i in range(repeats):
        fresh = make_text(tokenizer, system_tokens, rng)
        misses.append(stream_chat(client, url, [{"role": "system", "content": fresh},
                                                {"role": "user", "content": f"Question {i}?"}], 1).ttft_s)
        hits.append(stream_chat(client, url, [{"role": "system", "content": shared},
                                              {"role": "user", "content": f"Question {i}?"}], 1).ttft_s)
    return statistics.median(misses), statistics.median(hits)
