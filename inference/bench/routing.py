"""Routing quality behind a router (does a conversation's second turn find its prefix cached, and how much sooner
does it start), the latency the router adds to a request, and how long a replica's death takes to be routed
around. On one machine the replicas share its cores, so these figures are about placement, not throughput."""
from __future__ import annotations

import json
import statistics
import threading
import time
from dataclasses import dataclass

import httpx

MODEL = "smollm2-135m-instruct"


@dataclass(slots=True)
class SecondTurn:
    """A conversation's second turn: its prompt tokens, how many came from the prefix cache, its TTFT (seconds)."""

    prompt_tokens: int
    cached_tokens: int
    ttft_s: float


def first_turn(tag: str, i: int) -> list[dict]:
    """Conversation `i`'s first turn: a system message naming the conversation (so no two conversations share a
    KV block) and a question of about 100 tokens."""
    return [{"role": "system", "content": f"Conversation {tag} {i}. Answer briefly."},
            {"role": "user", "content": f"Tell me about the number {i}, its history and its uses. " * 4}]


def stream_turn(url: str, headers: dict, messages: list[dict], max_tokens: int,
                client: httpx.Client | None = None) -> tuple[str, dict, float]:
    """One streamed greedy chat turn: (its text, its usage, seconds to its first content), on `client` (default
    a new one). Raises httpx.HTTPError."""
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    text, usage, first = [], {}, None
    t0 = time.perf_counter()
    with (client.stream("POST", url + "/v1/chat/completions", headers=headers, json=body, timeout=300)
          if client is not None else
          httpx.stream("POST", url + "/v1/chat/completions", headers=headers, json=body, timeout=300)) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or []:
                if choice["delta"].get("content"):
                    first = first or time.perf_counter()
                    text.append(choice["delta"]["content"])
    return "".join(text), usage, (first or time.perf_counter()) - t0


def second_turns(url: str, headers: dict, tag: str, conversations: int, max_tokens: int = 4,
                 first_to: list[str] | None = None) -> list[SecondTurn]:
    """Run `conversations` two-turn conversations one after the other through `url` (a router): the second turn
    repeats the first and its answer, then asks more. first_to: URLs the first turns go to instead, in turn
    (straight to the replicas: the router never saw them). Returns each second turn. The turns share one
    client (a new one builds an SSL context first: ~50 ms of CPU)."""
    out = []
    with httpx.Client() as client:
        for i in range(conversations):
            first = first_turn(tag, i)
            reply, _, _ = stream_turn(first_to[i % len(first_to)] if first_to else url, headers, first, max_tokens,
                                      client)
            second = first + [{"role": "assistant", "content": reply}, {"role": "user", "content": "And then?"}]
            _, usage, ttft_s = stream_turn(url, headers, second, max_tokens, client)
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            out.append(SecondTurn(usage["prompt_tokens"], cached, ttft_s))
    return out


def hit_ratio(turns: list[SecondTurn]) -> float:
    """The share of second turns that found any of their prefix cached."""
    return sum(t.cached_tokens > 0 for t in turns) / len(turns)


def cached_token_ratio(turns: list[SecondTurn]) -> float:
    """Cached prompt tokens / prompt tokens, over the second turns."""
    return sum(t.cached_tokens for t in turns) / sum(t.prompt_tokens for t in turns)


def request_latency_s(url: str, headers: dict, rounds: int) -> list[float]:
    """End-to-end seconds of `rounds` identical one-token chat requests (a short prompt, cached after the first)."""
    body = {"model": MODEL, "max_tokens": 1, "temperature": 0, "messages": [{"role": "user", "content": "Hi"}]}
    out = []
    with httpx.Client(headers=headers, timeout=120) as client:
        for _ in range(rounds):
            t0 = time.perf_counter()
            client.post(url + "/v1/chat/completions", json=body).raise_for_status()
            out.append(time.perf_counter() - t0)
    return out


@dataclass(slots=True)
class Failover:
    """A replica killed with -9: seconds until the router marked it down, requests sent meanwhile and after (a
    request a second, each answered or failed), the first failure's cause."""

    marked_s: float
    ok: int
    failed: int
    first_error: str | None


def failover(router, replica, headers: dict, *, after_s: float = 2.0) -> Failover:
    """Kill `replica` (bench/cluster.Replica) and keep sending small requests through `router` (bench/cluster.Router)
    until it marks the replica down and `after_s` seconds more; the Failover figures."""
    ok = failed = 0
    error = None
    done = threading.Event()

    def load():
        nonlocal ok, failed, error
        body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "Hello"}]}
        while not done.is_set():
            try:
                r = httpx.post(router.url + "/v1/chat/completions", headers=headers, json=body, timeout=60)
                r.raise_for_status()
                ok += 1
            except httpx.HTTPError as exc:
                failed += 1
                error = error or f"{type(exc).__name__}: {exc}"
            done.wait(0.1)

    sender = threading.Thread(target=load, daemon=True)
    sender.start()
    killed = time.monotonic()
    replica.kill()
    while router.health().get(replica.url, True):
        time.sleep(0.05)
    marked_s = time.monotonic() - killed
    time.sleep(after_s)
    done.set()
    sender.join(60)
    return Failover(marked_s, ok, failed, error)


def median_ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.1f} ms"
