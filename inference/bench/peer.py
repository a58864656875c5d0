"""Side by side with another OpenAI-compatible server (llama.cpp's llama-server on the same GGUF): interleaved rounds, ratios.

Each round runs, for every concurrency, the same streamed workload against our server
and then the peer, and one prompt-processing probe (a long prompt, one output token:
prompt tokens / TTFT) on each; alternating within a round keeps both under the same
machine load, which on shared machines drifts by more than the differences measured.
The peer has no `ignore_eos`: its special tokens are banned through `logit_bias`
(http_streams.stream_chat). Resident memory is read from /proc/<pid>/status.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import httpx

from .http_streams import run_http, stream_chat
from .stats import RunSummary
from .workload import BenchRequest, make_text


def rss_bytes(pid: int | None) -> int | None:
    """A process's resident set size in bytes (VmRSS), or None where it cannot be read."""
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def prompt_tok_s(url: str, request: BenchRequest, suppress: list[int] | None) -> float:
    """Prompt tokens per second of one request with a single output token (prompt tokens / TTFT)."""
    with httpx.Client() as client:
        t = stream_chat(client, url, [{"role": "user", "content": request.prompt}], 1, suppress)
    return request.prompt_tokens / t.ttft_s


@dataclass
class PeerComparison:
    """Per (side, concurrency) the RunSummary of every round, and per side the prompt rates."""

    streams: dict[tuple[str, int], list[RunSummary]] = field(default_factory=dict)
    prompt: dict[str, list[float]] = field(default_factory=dict)

    def median_tok_s(self, side: str, concurrency: int) -> float:
        return statistics.median(r.output_tok_s for r in self.streams[(side, concurrency)])

    def median_tpot(self, side: str, concurrency: int) -> float:
        return statistics.median(r.tpot_p50 for r in self.streams[(side, concurrency)])


def compare(ours: str, peer: str, workloads_for, tokenizer, suppress: list[int],
            rounds: int, prompt_tokens: int = 1000, log=print) -> PeerComparison:
    """Interleaved rounds against `ours` and `peer` (base URLs): in each round both get the same
    workloads, `workloads_for(round)` ({concurrency: [BenchRequest]}, new prompts every round:
    llama-server keeps finished prompts in a host-memory prompt cache that outlives its KV slots,
    so repeating a round's prompts would measure that cache, not serving). The prompt probe is
    a fresh random user message of `prompt_tokens` tokens each time (no prefix cache hit on
    either side, in this run or from an earlier one). log: called with one line per measurement."""
    import random

    result = PeerComparison()
    # A new text every run: a server that outlives one bench run keeps its prompt cache for the next.
    rng = random.Random(time.time_ns())
    warm = workloads_for(-1)
    for side, url, ban in (("ours", ours, None), ("peer", peer, suppress)):  # warm-up both
        run_http(url, warm[min(warm)][:1], 1, ban)
    for rnd in range(rounds):
        for c, requests in workloads_for(rnd).items():
            for side, url, ban in (("ours", ours, None), ("peer", peer, suppress)):
                timings, wall = run_http(url, requests, c, ban)
                summary = RunSummary.of(side, c, timings, wall)
                result.streams.setdefault((side, c), []).append(summary)
                log(f"round {rnd + 1} {side:<4} c={c:<3} {summary.output_tok_s:7.1f} tok/s  TPOT p50 "
                    f"{summary.tpot_p50 * 1000:6.1f} ms  TTFT p50 {summary.ttft_p50 * 1000:6.0f} ms")
        probe = BenchRequest(make_text(tokenizer, prompt_tokens, rng), prompt_tokens, 1)
        for side, url, ban in (("ours", ours, None), ("peer", peer, suppress)):
            rate = prompt_tok_s(url, probe, ban)
            result.prompt.setdefault(side, []).append(rate)
            log(f"round {rnd + 1} {side:<4} prompt processing ({prompt_tokens} tokens): {rate:7.0f} tok/s")
    return result
