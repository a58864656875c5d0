"""Decode speed as users measure it: streamed chat, short prompts, TPOT after the first token, side by side.

Every server under test (ours with speculation off and `auto`, llama.cpp's llama-server on the
same GGUF) gets the same request body, as a user of either would send it: `messages`,
`max_tokens`, `temperature`, optionally `seed`, `ignore_eos` (both servers honour it, so every
stream is exactly `max_tokens` long) and `stream_options.include_usage` (the token count).
Nothing else is set, so each server applies its own defaults for the rest (llama-server's
sampler chain truncates with top-k 40, top-p 0.95 and min-p 0.05; ours, as OpenAI's API,
samples the whole distribution).

A run is `concurrency` streams started together. Its figures: TPOT p50, the median over the
streams of (last token time - first token time) / (tokens - 1), and decode tok/s, the tokens
after each stream's first over the span from the first stream's first token to the last
stream's last. Prefill is outside both (TTFT is reported apart). Rounds interleave the servers
so the machine's drift (shared machines drift by more than the differences measured) falls on
each alike; each round uses new prompts.

The client reads the stream with http.client and looks at each line's bytes only (one JSON
parse for the usage chunk): it shares the machine's cores with the servers.
"""
from __future__ import annotations

import http.client
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import urlsplit

SUBJECTS = ("a cat", "a lighthouse keeper", "two rival bakers", "a lost robot", "a river", "a chess game", "an old map",
            "a storm at sea", "a mountain village", "a clockmaker", "a garden", "a train journey", "a detective",
            "a dragon", "a violin", "the moon", "a market day", "a letter", "a snowstorm", "a library at night")


def story_prompt(i: int) -> str:
    """The i-th short user message (about 10-15 tokens): a request for a story."""
    return f"Write a long story about {SUBJECTS[i % len(SUBJECTS)]} (story {i})."


@dataclass(slots=True)
class StreamTiming:
    """perf_counter instants of one stream: sent, first and last content chunk; tokens generated."""

    sent_s: float
    first_s: float
    last_s: float
    tokens: int

    @property
    def ttft_s(self) -> float:
        return self.first_s - self.sent_s

    @property
    def tpot_s(self) -> float:
        """Seconds per token after the first (NaN for a stream of fewer than 2 tokens)."""
        return (self.last_s - self.first_s) / (self.tokens - 1) if self.tokens > 1 else float("nan")


def stream_once(url: str, prompt: str, max_tokens: int, temperature: float, seed: int | None,
                timeout_s: float = 900, model: str | None = None, keep_alive=None) -> StreamTiming:
    """One streamed chat completion against the server at base URL `url` (of `model`, with `keep_alive`,
    where given). Raises RuntimeError on a non-200 answer or a stream without content."""
    parts = urlsplit(url)
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": temperature,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    if model is not None:
        body["model"] = model
    if keep_alive is not None:
        body["keep_alive"] = keep_alive
    if seed is not None:
        body["seed"] = seed
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s)
    try:
        sent = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            raise RuntimeError(f"{url} answered {response.status}: {response.read()[:300]!r}")
        first = last = None
        chunks = tokens = 0
        while True:
            line = response.fp.readline()
            if not line or line.startswith(b"data: [DONE]"):
                break
            if not line.startswith(b"data: "):
                continue
            if b'"usage":{' in line and b'"choices":[]' in line:
                tokens = json.loads(line[6:])["usage"]["completion_tokens"]
            elif b'"content":"' in line and b'"content":""' not in line:
                last = time.perf_counter()
                first = first or last
                chunks += 1
    finally:
        conn.close()
    if first is None:
        raise RuntimeError(f"{url} streamed no content")
    return StreamTiming(sent, first, last, tokens or chunks)


@dataclass(slots=True)
class DecodeRun:
    """One run's streams and their summary figures (see the module docstring)."""

    streams: list[StreamTiming]

    @property
    def tpot_p50_s(self) -> float:
        return statistics.median(s.tpot_s for s in self.streams)

    @property
    def decode_tok_s(self) -> float:
        span = max(s.last_s for s in self.streams) - min(s.first_s for s in self.streams)
        return sum(s.tokens - 1 for s in self.streams) / span if span > 0 else float("nan")

    @property
    def ttft_p50_s(self) -> float:
        return statistics.median(s.ttft_s for s in self.streams)


def decode_run(url: str, concurrency: int, max_tokens: int, temperature: float, seed: int | None,
               first_prompt: int) -> DecodeRun:
    """`concurrency` streams started together (prompts first_prompt, first_prompt + 1, ...; seeded
    streams take seed + their index)."""
    def one(i: int) -> StreamTiming:
        return stream_once(url, story_prompt(first_prompt + i), max_tokens, temperature,
                           None if seed is None else seed + i)

    with ThreadPoolExecutor(concurrency) as pool:
        return DecodeRun(list(pool.map(one, range(concurrency))))


@dataclass(frozen=True, slots=True)
class Sampling:
    """A row's sampling: its label, temperature and seed (None: unseeded)."""

    label: str
    temperature: float
    seed: int | None = None


SAMPLINGS = (Sampling("greedy", 0.0), Sampling("T 0.8", 0.8), Sampling("T 0.8, seed", 0.8, 1234))


@dataclass
class DecodeComparison:
    """Per (server, concurrency, sampling label) the DecodeRun of every round."""

    runs: dict[tuple[str, int, str], list[DecodeRun]] = field(default_factory=dict)

    def median(self, server: str, concurrency: int, sampling: str, figure: str) -> float:
        """The median over rounds of one figure ('tpot_p50_s', 'decode_tok_s', 'ttft_p50_s')."""
        return statistics.median(getattr(r, figure) for r in self.runs[(server, concurrency, sampling)])


def compare_decode(servers: dict[str, str], levels: list[int], samplings=SAMPLINGS, rounds: int = 2,
                   max_tokens: int = 128, log=print) -> DecodeComparison:
    """Interleaved rounds: in each, for every concurrency and sampling, every server in turn (their
    order alternating by round), each run with new prompts. servers: {name: base URL}. log: called
    with one line per run."""
    result = DecodeComparison()
    names = list(servers)
    prompt = 0
    for name in names:  # warm-up: each server's first request pays one-off costs
        decode_run(servers[name], 1, 8, 0.8, None, 10_000)
    for rnd in range(rounds):
        for c in levels:
            for sampling in samplings:
                for name in (names if rnd % 2 == 0 else names[::-1]):
                    run = decode_run(servers[name], c, max_tokens, sampling.temperature, sampling.seed, prompt)
                    result.runs.setdefault((name, c, sampling.label), []).append(run)
                    log(f"round {rnd + 1} {name:<16} c={c:<3} {sampling.label:<12} TPOT p50 "
                        f"{run.tpot_p50_s * 1000:7.2f} ms  decode {run.decode_tok_s:7.1f} tok/s  "
                        f"TTFT p50 {run.ttft_p50_s * 1000:6.0f} ms")
                prompt += c
    return result


def decode_table(cmp: DecodeComparison, ours: list[str], peer: str | None, levels: list[int],
                 samplings=SAMPLINGS) -> list[str]:
    """Markdown rows: for each concurrency and sampling, each of our servers' decode tok/s and TPOT
    p50, the peer's, and our ratio to it (decode tok/s)."""
    head = "| streams | sampling | " + " | ".join(f"{n} tok/s (TPOT)" for n in ours)
    head += (f" | {peer} tok/s (TPOT) | " + " | ".join(f"{n} / {peer}" for n in ours) + " |") if peer else " |"
    cols = len(ours) * (2 if peer else 1) + (1 if peer else 0)
    lines = [head, "| --- | --- |" + " --- |" * cols]
    for c in levels:
        for s in samplings:
            cells = []
            for n in ours + ([peer] if peer else []):
                cells.append(f"{cmp.median(n, c, s.label, 'decode_tok_s'):.1f} "
                             f"({cmp.median(n, c, s.label, 'tpot_p50_s') * 1000:.2f} ms)")
            if peer:
                base = cmp.median(peer, c, s.label, "decode_tok_s")
                cells += [f"{cmp.median(n, c, s.label, 'decode_tok_s') / base:.2f}x" for n in ours]
            lines.append(f"| {c} | {s.label} | " + " | ".join(cells) + " |")
    return lines
