"""Streams through HTTP with a fixed concurrency (threads + httpx), recording per-request timings.

The same client measures our server and, optionally, another OpenAI-compatible one
(llama-cpp-python's): for a server without `ignore_eos` and without usage in streams,
`suppress` makes the special tokens (EOS among them) impossible through `logit_bias`
(-100, OpenAI's documented "ban"), and tokens are counted as the content chunks streamed.
"""
from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from .stats import RequestTiming
from .workload import BenchRequest


def stream_chat(client: httpx.Client, url: str, messages: list[dict], max_tokens: int,
                suppress: list[int] | None = None) -> RequestTiming:
    """One streamed greedy chat completion of exactly max_tokens tokens.

    suppress: None for our server (ignore_eos; the token count from the usage chunk);
    token ids to ban for another server (the count is then the content chunks seen,
    one token each on llama-cpp-python's server).
    """
    # No `model`: both servers then answer with the model they serve (ours refuses a name it does not serve).
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    if suppress is None:
        body.update(ignore_eos=True, stream_options={"include_usage": True})
    else:
        body["logit_bias"] = {str(i): -100 for i in suppress}
    t0 = time.perf_counter()
    first = None
    tokens = chunks = 0
    with client.stream("POST", url + "/v1/chat/completions", json=body, timeout=900) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            elif chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                chunks += 1
                if first is None:
                    first = time.perf_counter()
    end = time.perf_counter()
    return RequestTiming((first or end) - t0, end - t0, tokens or chunks)


def run_http(url: str, requests: list[BenchRequest], concurrency: int,
             suppress: list[int] | None = None) -> tuple[list[RequestTiming], float]:
    """Run `requests` with `concurrency` client threads. Returns (timings, wall seconds).

    Each request opens its own connection (about 0.1 ms on loopback): llama-server closes idle
    keep-alive connections, and a request sent on one it has just closed fails before it starts.
    """

    def one(r: BenchRequest) -> RequestTiming:
        with httpx.Client() as client:
            return stream_chat(client, url, [{"role": "user", "content": r.prompt}], r.output_tokens, suppress)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        timings = list(pool.map(one, requests))
    return timings, time.perf_counter() - t0
