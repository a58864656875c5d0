"""Decode throughput through HTTP: single-stream tokens/s and aggregate tokens/s of N concurrent streams."""
from __future__ import annotations

import json
import threading
import time

import httpx


def stream_once(url: str, prompt: str, max_tokens: int) -> dict:
    """Stream one chat completion (greedy, ignore_eos); returns token count and times in seconds.

    Tokens are counted from the final usage chunk; decode rate excludes the time to first token.
    """
    body = {"model": "bench", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first = last = None
    usage = None
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            elif chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                now = time.perf_counter()
                first = first or now
                last = now
    tokens = usage["completion_tokens"]
    return {"tokens": tokens, "ttft_s": (first or t0) - t0, "total_s": time.perf_counter() - t0,
            "decode_tok_s": (tokens - 1) / (last - first) if last and last > first else 0.0}


def concurrent(url: str, prompts: list[str], max_tokens: int) -> dict:
    """Run one stream per prompt at once; aggregate tokens/s = all completion tokens / wall time."""
    results: list[dict] = [None] * len(prompts)  # type: ignore[list-item]

    def run(i):
        results[i] = stream_once(url, prompts[i], max_tokens)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    total = sum(r["tokens"] for r in results)
    return {"tokens": total, "wall_s": wall, "aggregate_tok_s": total / wall,
            "ttft_s": sorted(r["ttft_s"] for r in results)}
