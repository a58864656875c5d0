"""Many models behind one endpoint, measured through HTTP: cold load to first token, the TTFT a switch between two
resident models adds, each model's resident memory, and two models streaming at once against each alone.

Every figure is a median over rounds, from streamed chat completions (decode.stream_once: TTFT is the first
content chunk after the request was sent, TPOT the seconds per token after it). A cold round asks for the
model with keep_alive 0, so the registry unloads it once the answer ends, and waits for /v1/models to say
"unloaded" before the next.
"""
from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field

import httpx

from .decode import StreamTiming, story_prompt, stream_once


def model_states(url: str) -> dict[str, dict]:
    """/v1/models' cards by id (with the registry's extra fields: state, resident_bytes, load_s, ...)."""
    return {m["id"]: m for m in httpx.get(url + "/v1/models", timeout=30).json()["data"]}


def wait_state(url: str, model: str, state: str, timeout_s: float = 60) -> None:
    """Poll /v1/models until `model` is in `state`. Raises RuntimeError past timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if model_states(url).get(model, {}).get("state") == state:
            return
        time.sleep(0.1)
    raise RuntimeError(f"{model} did not become {state} within {timeout_s:g} s")


@dataclass(slots=True)
class ModelFigures:
    """One model's figures (seconds, bytes)."""

    name: str
    cold_ttft_s: list[float] = field(default_factory=list)
    warm_ttft_s: list[float] = field(default_factory=list)
    load_s: list[float] = field(default_factory=list)
    resident_bytes: int | None = None
    kv_cache_bytes: int | None = None
    alone_tpot_s: list[float] = field(default_factory=list)
    together_tpot_s: list[float] = field(default_factory=list)


def cold_and_warm(url: str, model: str, rounds: int, max_tokens: int = 4) -> ModelFigures:
    """`rounds` cold requests (the model unloaded before each: keep_alive 0) and as many warm ones."""
    figures = ModelFigures(model)
    for i in range(rounds):
        wait_state(url, model, "unloaded")
        figures.cold_ttft_s.append(stream_once(url, story_prompt(i), max_tokens, 0.0, None, model=model,
                                               keep_alive=0).ttft_s)
    stream_once(url, story_prompt(0), max_tokens, 0.0, None, model=model, keep_alive=-1)  # resident from here
    for i in range(rounds):
        figures.warm_ttft_s.append(stream_once(url, story_prompt(i), max_tokens, 0.0, None, model=model).ttft_s)
    card = model_states(url)[model]
    figures.resident_bytes, figures.kv_cache_bytes = card.get("resident_bytes"), card.get("kv_cache_bytes")
    return figures


def switch_ttft(url: str, a: str, b: str, rounds: int, max_tokens: int = 4) -> dict[str, tuple[list, list]]:
    """Both models resident, requests in the order a, a, b, b, a, a, ... (`rounds` times each pair): per model,
    (TTFTs of requests after one to the same model, TTFTs of requests right after a switch)."""
    stream_once(url, story_prompt(0), max_tokens, 0.0, None, model=a, keep_alive=-1)
    stream_once(url, story_prompt(0), max_tokens, 0.0, None, model=b, keep_alive=-1)
    out: dict[str, tuple[list, list]] = {a: ([], []), b: ([], [])}
    previous = b
    for i in range(rounds * 2):
        model = a if i % 2 == 0 else b
        for k in range(2):
            ttft = stream_once(url, story_prompt(i * 2 + k), max_tokens, 0.0, None, model=model).ttft_s
            out[model][0 if previous == model else 1].append(ttft)
            previous = model
    return out


def together(url: str, a: str, b: str, max_tokens: int) -> tuple[StreamTiming, StreamTiming]:
    """One stream on each model at once (started together)."""
    out: dict[str, StreamTiming] = {}
    start = threading.Barrier(2)

    def run(model: str, i: int):
        start.wait()
        out[model] = stream_once(url, story_prompt(i), max_tokens, 0.0, None, model=model)

    threads = [threading.Thread(target=run, args=(m, i)) for i, m in enumerate((a, b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out[a], out[b]


def streams_alone_and_together(url: str, a: ModelFigures, b: ModelFigures, rounds: int, max_tokens: int) -> None:
    """Each model's TPOT alone and while the other streams, interleaved round by round (into a and b)."""
    for i in range(rounds):
        a.alone_tpot_s.append(stream_once(url, story_prompt(i), max_tokens, 0.0, None, model=a.name).tpot_s)
        b.alone_tpot_s.append(stream_once(url, story_prompt(i), max_tokens, 0.0, None, model=b.name).tpot_s)
        ta, tb = together(url, a.name, b.name, max_tokens)
        a.together_tpot_s.append(ta.tpot_s)
        b.together_tpot_s.append(tb.tpot_s)


def median_ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.1f} ms" if values else "-"
