"""Per-request timings and their summary (TTFT, TPOT, throughput)."""
from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass(slots=True)
class RequestTiming:
    """Seconds from submit to the first token (ttft_s) and to the last (total_s); tokens generated."""

    ttft_s: float
    total_s: float
    output_tokens: int

    @property
    def tpot_s(self) -> float:
        """Time per output token after the first (0 for single-token outputs)."""
        return (self.total_s - self.ttft_s) / (self.output_tokens - 1) if self.output_tokens > 1 else 0.0


def percentile(values: list[float], p: float) -> float:
    """The p-th percentile (0-100) by linear interpolation."""
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[max(0, min(98, int(p) - 1))] if p < 100 else max(values)


@dataclass(slots=True)
class RunSummary:
    """Aggregate output tokens/s over the wall time, TTFT and TPOT percentiles in seconds."""

    label: str
    concurrency: int
    output_tok_s: float
    ttft_p50: float
    ttft_p99: float
    tpot_p50: float
    tpot_p99: float

    @classmethod
    def of(cls, label: str, concurrency: int, timings: list[RequestTiming], wall_s: float) -> "RunSummary":
        ttft = [t.ttft_s for t in timings]
        tpot = [t.tpot_s for t in timings if t.output_tokens > 1]
        return cls(label, concurrency, sum(t.output_tokens for t in timings) / wall_s, percentile(ttft, 50),
                   percentile(ttft, 99), percentile(tpot, 50), percentile(tpot, 99))
