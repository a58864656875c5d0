"""Decode under CPU contention, side by side: each server's streams with N busy processes beside it, as a
ratio to its own idle figure measured in the same interleaved run.

A busy neighbour is a process spinning in a loop (`while True: pass`, bounded by a deadline), the
production case of a server beside PostgreSQL, a Celery worker holding its own engine, or a noisy
cloud neighbour. Every run of a round measures a server idle, then the same server with the
neighbours started just for that run (and ended after it), so drift falls on both figures alike;
the servers' order alternates by round. A second figure runs two of our servers at once, each
decoding one stream, against each alone.
"""
from __future__ import annotations

import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from .decode import DecodeRun, decode_run

# The busy loop of one neighbour: it ends by itself after its deadline even if the bench dies.
BUSY_LOOP = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"


class BusyNeighbours:
    """A context manager: `n` processes that each keep one CPU busy for at most `seconds` seconds,
    started on entry (after `settle_s`, so the kernel has spread them) and killed on exit."""

    def __init__(self, n: int, seconds: float = 600, settle_s: float = 0.3):
        self.n, self.seconds, self.settle_s = n, seconds, settle_s
        self.procs: list[subprocess.Popen] = []

    def __enter__(self):
        self.procs = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP.format(seconds=self.seconds)])
                      for _ in range(self.n)]
        time.sleep(self.settle_s)
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()
        self.procs = []


@dataclass
class ContentionComparison:
    """Per (server, streams, "idle" | "busy") the DecodeRun of every round; `pair`: per server, its
    decode tok/s alone and while the other of two ran at once, per round."""

    busy: int
    runs: dict[tuple[str, int, str], list[DecodeRun]] = field(default_factory=dict)
    pair: dict[str, dict[str, list[float]]] = field(default_factory=dict)

    def median(self, server: str, streams: int, load: str, figure: str = "decode_tok_s") -> float:
        """The median over rounds of one DecodeRun figure (decode_tok_s in tokens/s, tpot_p50_s in seconds)
        for a server, a stream count and a load ("idle" or "busy"). Raises KeyError for a run not made."""
        return statistics.median(getattr(r, figure) for r in self.runs[(server, streams, load)])

    def ratio(self, server: str, streams: int) -> float:
        """The median busy decode tok/s over the median idle one."""
        return self.median(server, streams, "busy") / self.median(server, streams, "idle")


def compare_contention(servers: dict[str, str], levels: list[int], busy: int, rounds: int = 2,
                       max_tokens: int = 128, temperature: float = 0.8, pair: tuple[str, str] | None = None,
                       first_prompt: int = 20_000, log=print) -> ContentionComparison:
    """Interleaved rounds: for each level and server (order alternating by round), an idle run then
    a run with `busy` neighbours; then, with `pair` (two of `servers`), each decoding one stream at
    once against each alone. servers: {name: base URL}. log: one line per run."""
    result = ContentionComparison(busy)
    names = list(servers)
    prompt = first_prompt
    for rnd in range(rounds):
        for c in levels:
            for name in (names if rnd % 2 == 0 else names[::-1]):
                for load in ("idle", "busy"):
                    if load == "busy":
                        with BusyNeighbours(busy):
                            run = decode_run(servers[name], c, max_tokens, temperature, None, prompt)
                    else:
                        run = decode_run(servers[name], c, max_tokens, temperature, None, prompt)
                    prompt += c
                    result.runs.setdefault((name, c, load), []).append(run)
                    log(f"round {rnd + 1} {name:<16} c={c:<3} {load:<4} ({busy} busy) TPOT p50 "
                        f"{run.tpot_p50_s * 1000:7.2f} ms  decode {run.decode_tok_s:7.1f} tok/s")
        if pair:
            for name in pair:
                alone = decode_run(servers[name], 1, max_tokens, temperature, None, prompt)
                prompt += 1
                result.pair.setdefault(name, {}).setdefault("alone", []).append(alone.decode_tok_s)
            with ThreadPoolExecutor(2) as pool:
                both = list(pool.map(lambda i: decode_run(servers[pair[i]], 1, max_tokens, temperature, None,
                                                          prompt + i), range(2)))
            prompt += 2
            for name, run in zip(pair, both):
                result.pair[name].setdefault("together", []).append(run.decode_tok_s)
                log(f"round {rnd + 1} {name:<16} c=1   beside the other server: decode {run.decode_tok_s:7.1f} "
                    f"tok/s (alone {result.pair[name]['alone'][-1]:.1f})")
    return result


def contention_table(cmp: ContentionComparison, levels: list[int]) -> list[str]:
    """Markdown rows: per streams and server, idle and busy decode tok/s (TPOT p50) and busy / idle;
    then the pair's rows."""
    names = list(dict.fromkeys(name for name, _, _ in cmp.runs))
    lines = [f"| streams | server | idle tok/s (TPOT) | {cmp.busy} busy process(es) tok/s (TPOT) | busy / idle |",
             "| --- | --- | --- | --- | --- |"]
    for c in levels:
        for name in names:
            cells = [f"{cmp.median(name, c, load):.1f} ({cmp.median(name, c, load, 'tpot_p50_s') * 1000:.2f} ms)"
                     for load in ("idle", "busy")]
            lines.append(f"| {c} | {name} | {cells[0]} | {cells[1]} | {cmp.ratio(name, c):.2f} |")
    for name, figures in cmp.pair.items():
        alone, together = statistics.median(figures["alone"]), statistics.median(figures["together"])
        lines.append(f"| 1 | {name}, beside another server decoding | {alone:.1f} | {together:.1f} (the other "
                     f"server busy) | {together / alone:.2f} |")
    return lines
