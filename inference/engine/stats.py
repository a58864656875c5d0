"""EngineStats: what the engine did, kept in plain counters on the engine thread and read at scrape time.

The engine thread records each step (`record_step`) and each request's end (`record_finished`)
into ints, floats and lists it alone writes; nothing here takes a lock or waits, so metrics
never slow a step. Readers on other threads (the /metrics collector, the dashboard) read
these values as they are: every counter and bucket only grows, so a read between two updates
is at worst one step stale, never backwards. A histogram's count is the sum of its buckets
(read together), so `_count` always matches `_bucket{le="+Inf"}`.

Names, buckets and timing follow vLLM (vllm/v1/metrics/loggers.py, vllm/v1/metrics/stats.py,
docs/design/metrics.md): TTFT is from arrival (the submit call) to the first token; queue is
arrival to first scheduled; prefill is first scheduled to first token; decode is first to
last token; e2e is arrival to the end; ITL is observed per generated token after the first,
as the time since the request's previous token. Finish reasons map to vLLM's
`finished_reason` label: cancelled (an operator's cancel or a client gone) and timeout are
`abort`, error is `error`.
"""
from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field

# vLLM's bucket lists (vllm/v1/metrics/loggers.py, PrometheusStatLogger).
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                  7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                 10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                             50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
# vLLM's FINISH_REASON_STRINGS (vllm/v1/engine/__init__.py): every label value is exported from the start.
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
_REASON_LABEL = {"stop": "stop", "length": "length", "cancelled": "abort", "timeout": "abort",
                 "error": "error", "repetition": "repetition"}

# The dashboard's rolling series: points of SERIES_INTERVAL_S seconds over SERIES_WINDOW_S.
SERIES_INTERVAL_S = 10
SERIES_WINDOW_S = 300
# Latency samples kept per point for its percentiles (the first ones of the interval).
_SAMPLES_PER_POINT = 2048


GRAMMAR_COMPILE_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def build_1_2_5_buckets(max_value: int) -> tuple[int, ...]:
    """vLLM's token-count buckets: 1, 2, 5, 10, 20, 50, ... up to max_value (included).

    Source: vllm/v1/metrics/loggers.py build_1_2_5_buckets. >>> build_1_2_5_buckets(100)
    (1, 2, 5, 10, 20, 50, 100)"""
    out, exponent = [], 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10 ** exponent
            if value > max_value:
                return tuple(out)
            out.append(value)
        exponent += 1


class Histogram:
    """A Prometheus-style histogram in plain numbers: `counts[i]` observations fell in
    (bounds[i-1], bounds[i]] (the last slot is +Inf); `sum` in the observed unit. Not cumulative:
    the collector accumulates at read time."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds):
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        """Add one observation (the engine thread only)."""
        i = 0
        bounds = self.bounds
        while i < len(bounds) and value > bounds[i]:
            i += 1
        self.counts[i] += 1
        self.sum += value

    def read(self) -> tuple[list[tuple[float, int]], int, float]:
        """(cumulative [(upper bound, count)] ending with +Inf, count, sum), as Prometheus exposes it."""
        counts = list(self.counts)
        total = 0
        cumulative = []
        for bound, n in zip((*self.bounds, float("inf")), counts):
            total += n
            cumulative.append((bound, total))
        return cumulative, total, self.sum

    @property
    def count(self) -> int:
        return sum(self.counts)


@dataclass(slots=True)
class _Timing:
    """One live request's times (time.monotonic() seconds)."""

    arrival: float
    scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None


@dataclass(slots=True)
class SeriesPoint:
    """One interval of the dashboard's rolling series."""

    start: float  # unix seconds
    prompt_tokens: int = 0
    generation_tokens: int = 0
    requests_finished: int = 0
    ttft_s: list = field(default_factory=list)
    itl_s: list = field(default_factory=list)


class EngineStats:
    """The engine's counters, histograms and rolling series (see the module docstring).

    Counters (ints): prompt_tokens, generation_tokens, prefix_cache_queries, prefix_cache_hits
    (tokens), request_success[finished_reason]; the scheduler's num_preemptions is read from
    the scheduler itself. Speculative decoding (the hook for a drafting engine): call
    `record_spec_decode` once per verified draft; its counters are exported under vLLM's
    spec_decode names once `spec_decode_enabled` is set or a draft was recorded.
    """

    def __init__(self, max_model_len: int, prefix_caching: bool = True):
        self.prefix_caching = prefix_caching
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.request_success = dict.fromkeys(FINISHED_REASONS, 0)
        self.ttft_s = Histogram(TTFT_BUCKETS_S)
        self.itl_s = Histogram(ITL_BUCKETS_S)
        self.e2e_s = Histogram(REQUEST_LATENCY_BUCKETS_S)
        self.queue_s = Histogram(REQUEST_LATENCY_BUCKETS_S)
        self.inference_s = Histogram(REQUEST_LATENCY_BUCKETS_S)
        self.prefill_s = Histogram(REQUEST_LATENCY_BUCKETS_S)
        self.decode_s = Histogram(REQUEST_LATENCY_BUCKETS_S)
        token_buckets = build_1_2_5_buckets(max_model_len)
        self.request_prompt_tokens = Histogram(token_buckets)
        self.request_generation_tokens = Histogram(token_buckets)
        self.request_max_tokens = Histogram(token_buckets)
        self.iteration_tokens = Histogram((1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384))
        # Speculative decoding (vLLM: spec_decode_num_drafts / _num_draft_tokens / _num_accepted_tokens,
        # and per draft position).
        self.spec_decode_enabled = False
        self.spec_decode_num_drafts = 0
        self.spec_decode_num_draft_tokens = 0
        self.spec_decode_num_accepted_tokens = 0
        self.spec_decode_accepted_per_pos: list[int] = []
        self.series: deque[SeriesPoint] = deque(maxlen=SERIES_WINDOW_S // SERIES_INTERVAL_S + 1)
        self._timings: dict[int, _Timing] = {}

    # --- the engine thread ---

    def record_arrival(self, seq, arrival: float) -> None:
        """A request entered the engine at `arrival` (monotonic seconds; its submit call)."""
        self._timings[id(seq)] = _Timing(arrival)

    def record_step(self, batch, outputs, now: float | None = None) -> None:
        """One step: `batch` (scheduler.ScheduledBatch) ran and gave `outputs` (StepOutputs).
        Counts prefix-cache queries and hits of first admissions, first scheduling times,
        generated tokens (TTFT and ITL), prompt tokens at each request's first token, and the
        end of every request that ended in the step."""
        from .outputs import Failed, Finished, TokenEvent

        now = time.monotonic() if now is None else now
        point = self._point()
        step_tokens = 0
        for i, (seq, n) in enumerate(batch.items):
            step_tokens += n + len(batch.drafts.get(i, ()))
            timing = self._timings.get(id(seq))
            if timing is not None and timing.scheduled is None:
                timing.scheduled = now
                if self.prefix_caching and i >= batch.first_admitted:
                    self.prefix_cache_queries += seq.num_prompt_tokens
                    self.prefix_cache_hits += seq.num_cached_tokens
        self.iteration_tokens.observe(step_tokens)
        for seq, events in outputs:
            tokens = sum(isinstance(event, TokenEvent) for event in events)
            if tokens:
                self._tokens(seq, tokens, now, point)
            for event in events:
                if isinstance(event, (Finished, Failed)):
                    self.record_finished(seq, now)

    def record_beam_step(self, root, decoded: int, now: float | None = None) -> None:
        """A beam search's step (its `root` sequence the request's): `decoded` beams generated a token
        each. All count as generation tokens; the request's TTFT and ITL are its steps'."""
        self._tokens(root, decoded, time.monotonic() if now is None else now, self._point())

    def _tokens(self, seq, n: int, now: float, point: SeriesPoint) -> None:
        """`seq` emitted n >= 1 tokens in one step: n generation tokens, and one TTFT or ITL sample (a
        step's drafted tokens accepted together arrive together: vLLM's per-iteration inter-token latency)."""
        self.generation_tokens += n
        point.generation_tokens += n
        timing = self._timings.get(id(seq))
        if timing is None:
            return
        if timing.first_token is None:
            timing.first_token = now
            ttft = now - timing.arrival
            self.ttft_s.observe(ttft)
            self.prompt_tokens += seq.num_prompt_tokens
            point.prompt_tokens += seq.num_prompt_tokens
            if len(point.ttft_s) < _SAMPLES_PER_POINT:
                point.ttft_s.append(ttft)
        else:
            itl = now - timing.last_token
            self.itl_s.observe(itl)
            if len(point.itl_s) < _SAMPLES_PER_POINT:
                point.itl_s.append(itl)
        timing.last_token = now

    def record_finished(self, seq, now: float | None = None) -> None:
        """`seq` ended (any reason: finished, aborted, failed): its request-level histograms and
        its finished_reason count. Idempotent per sequence."""
        timing = self._timings.pop(id(seq), None)
        if timing is None:
            return
        now = time.monotonic() if now is None else now
        reason = "repetition" if getattr(seq, "stopped_by_repetition", False) else _REASON_LABEL.get(
            seq.finish_reason or "stop", "abort")
        self.request_success[reason] += 1
        self._point().requests_finished += 1
        self.e2e_s.observe(now - timing.arrival)
        scheduled = timing.scheduled if timing.scheduled is not None else now
        self.queue_s.observe(scheduled - timing.arrival)
        first = timing.first_token if timing.first_token is not None else now
        last = timing.last_token if timing.last_token is not None else first
        self.prefill_s.observe(first - scheduled)
        self.decode_s.observe(last - first)
        self.inference_s.observe(last - scheduled)
        self.request_prompt_tokens.observe(seq.num_prompt_tokens)
        self.request_generation_tokens.observe(seq.num_output_tokens)
        self.request_max_tokens.observe(seq.params.max_tokens)

    def record_spec_decode(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """One draft of `num_draft_tokens` proposed tokens was verified and its first
        `num_accepted_tokens` accepted (vLLM's SpecDecodingStats.observe_draft)."""
        self.spec_decode_enabled = True
        self.spec_decode_num_drafts += 1
        self.spec_decode_num_draft_tokens += num_draft_tokens
        self.spec_decode_num_accepted_tokens += num_accepted_tokens
        per_pos = self.spec_decode_accepted_per_pos
        if len(per_pos) < num_draft_tokens:
            per_pos.extend([0] * (num_draft_tokens - len(per_pos)))
        for i in range(num_accepted_tokens):
            per_pos[i] += 1

    def _point(self) -> SeriesPoint:
        start = time.time() // SERIES_INTERVAL_S * SERIES_INTERVAL_S
        if not self.series or self.series[-1].start != start:
            self.series.append(SeriesPoint(start))
        return self.series[-1]

    # --- readers (any thread) ---

    def live_timing(self, seq) -> _Timing | None:
        """The times of a live request (for the engine's snapshot)."""
        return self._timings.get(id(seq))

    def series_view(self, now: float | None = None) -> dict:
        """The dashboard's rolling series (ARCHITECTURE.md, "The live dashboard's websocket"):
        one point per SERIES_INTERVAL_S over the last SERIES_WINDOW_S, oldest first, with token
        rates per second and TTFT / ITL p50 and p99 in seconds (None without samples), and the
        same over the whole window."""
        now = time.time() if now is None else now
        points = [p for p in list(self.series) if p.start > now - SERIES_WINDOW_S - SERIES_INTERVAL_S]
        out = []
        for p in points:
            span = max(1e-9, min(SERIES_INTERVAL_S, now - p.start))
            out.append({"t": p.start, "prompt_tokens_per_s": p.prompt_tokens / span,
                        "generation_tokens_per_s": p.generation_tokens / span,
                        "requests_finished": p.requests_finished,
                        **_percentiles("ttft", list(p.ttft_s)), **_percentiles("itl", list(p.itl_s))})
        span = max(1e-9, now - points[0].start) if points else 1.0
        window = {"prompt_tokens_per_s": sum(p.prompt_tokens for p in points) / span,
                  "generation_tokens_per_s": sum(p.generation_tokens for p in points) / span,
                  "requests_finished": sum(p.requests_finished for p in points),
                  **_percentiles("ttft", [x for p in points for x in list(p.ttft_s)]),
                  **_percentiles("itl", [x for p in points for x in list(p.itl_s)])}
        return {"interval_s": SERIES_INTERVAL_S, "window_s": SERIES_WINDOW_S, "points": out, "window": window}


def percentile(sorted_values: list[float], q: float) -> float | None:
    """The q-quantile (0-1) of ascending values, nearest rank; None when there are none."""
    if not sorted_values:
        return None
    rank = max(0, min(len(sorted_values) - 1, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[rank]


def _percentiles(name: str, values: list[float]) -> dict:
    values.sort()
    return {f"{name}_p50_s": percentile(values, 0.5), f"{name}_p99_s": percentile(values, 0.99)}


# Grammar compiles of the whole process (engine/grammar.py's worker observes them; /metrics reads them).
GRAMMAR_COMPILE_S = Histogram(GRAMMAR_COMPILE_BUCKETS_S)
