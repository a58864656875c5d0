"""Streams through HTTP with a fixed concurrency (threads + httpx), recording per-request timings."""
from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from .stats import RequestTiming
from .workload import BenchRequest


def stream_chat(client: httpx.Client, url: str, messages: list[dict], max_tokens: int) -> RequestTiming:
    """One streamed chat completion (greedy, ignore_eos); the token count comes from the usage chunk."""
    body = {"model": "bench", "messages": messages, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first = None
    tokens = 0
    with client.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            elif first is None and chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                first = time.perf_counter()
    end = time.perf_counter()
    return RequestTiming((first or end) - t0, end - t0, tokens)


def run_http(url: str, requests: list[BenchRequest], concurrency: int) -> tuple[list[RequestTiming], float]:
    """Run `requests` with `concurrency` client threads. Returns (timings, wall seconds)."""
    local = threading.local()

    def one(r: BenchRequest) -> RequestTiming:
        if not hasattr(local, "client"):
            local.client = httpx.Client()
        return stream_chat(local.client, url, [{"role": "user", "content": r.prompt}], r.output_tokens)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        timings = list(pool.map(one, requests))
    return timings, time.perf_counter() - t0
