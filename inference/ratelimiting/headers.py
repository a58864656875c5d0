"""The x-ratelimit-* and Retry-After response headers, as OpenAI sends them.

Source: OpenAI's rate-limit guide (x-ratelimit-{limit,remaining,reset}-{requests,tokens}; resets
as durations such as "1s", "6m0s", "20ms") and section 2.3 of reference/metrale-behaviour.md (an
axis that is not enforced advertises "unlimited"; Retry-After is at least 1).
"""
from __future__ import annotations

import math

from .buckets import Snapshot, seconds_until
from .limits import Limits

UNLIMITED = "unlimited"


def format_duration(seconds: float) -> str:
    """A reset time in OpenAI's style: "0s", "20ms", "1s", "6m0s", "1h0m0s"."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{max(1, math.ceil(seconds * 1000))}ms"
    total = math.ceil(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def ratelimit_headers(limits: Limits, snapshot: Snapshot) -> dict[str, str]:
    """The six x-ratelimit-* headers for a scope's state. `remaining` is the whole units in the
    bucket now; `reset` is the time until the bucket is full again."""
    headers = {}
    for axis, per_minute, level, rate_s, cap in (
        ("requests", limits.requests_per_minute, snapshot.requests, limits.request_rate_s,
         limits.request_capacity),
        ("tokens", limits.tokens_per_minute, snapshot.tokens, limits.token_rate_s,
         limits.token_capacity),
    ):
        if level is None:
            headers[f"x-ratelimit-limit-{axis}"] = UNLIMITED
            headers[f"x-ratelimit-remaining-{axis}"] = UNLIMITED
            headers[f"x-ratelimit-reset-{axis}"] = "0s"
        else:
            headers[f"x-ratelimit-limit-{axis}"] = str(per_minute)
            headers[f"x-ratelimit-remaining-{axis}"] = str(max(0, math.floor(level)))
            headers[f"x-ratelimit-reset-{axis}"] = format_duration(seconds_until(level, cap, rate_s))
    return headers


def retry_after_s(limits: Limits, snapshot: Snapshot, denied: str, reserve_tokens: int) -> int:
    """Whole seconds (at least 1) until the refused axis could admit the request. A concurrency
    slot frees when another request ends, which no clock predicts: 1 second."""
    if denied == "requests":
        wait = seconds_until(snapshot.requests, 1, limits.request_rate_s)
    elif denied == "tokens":
        wait = seconds_until(snapshot.tokens, reserve_tokens, limits.token_rate_s)
    else:
        wait = 1
    return max(1, math.ceil(wait))
