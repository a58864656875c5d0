"""The x-ratelimit-* and Retry-After response headers, as OpenAI sends them, and beside them on Anthropic's routes
the anthropic-ratelimit-* ones, as Anthropic sends them.

Source: OpenAI's rate-limit guide (x-ratelimit-{limit,remaining,reset}-{requests,tokens}; resets
as durations such as "1s", "6m0s", "20ms") and section 2.3 of reference/metrale-behaviour.md (an
axis that is not enforced advertises "unlimited"; Retry-After is at least 1). Anthropic's API
reference, "Rate limits" (anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}: the
limit per minute, the whole units left, and when the limit is fully replenished in RFC 3339);
Anthropic sends them only for a limit that applies, so an axis not enforced sends none.
"""
from __future__ import annotations

import math
from datetime import datetime, timezone

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
    for axis, per_minute, level, rate_s, cap in _axes(limits, snapshot):
        if level is None:
            headers[f"x-ratelimit-limit-{axis}"] = UNLIMITED
            headers[f"x-ratelimit-remaining-{axis}"] = UNLIMITED
            headers[f"x-ratelimit-reset-{axis}"] = "0s"
        else:
            headers[f"x-ratelimit-limit-{axis}"] = str(per_minute)
            headers[f"x-ratelimit-remaining-{axis}"] = str(max(0, math.floor(level)))
            headers[f"x-ratelimit-reset-{axis}"] = format_duration(seconds_until(level, cap, rate_s))
    return headers


def _axes(limits: Limits, snapshot: Snapshot):
    return (("requests", limits.requests_per_minute, snapshot.requests, limits.request_rate_s, limits.request_capacity),
            ("tokens", limits.tokens_per_minute, snapshot.tokens, limits.token_rate_s, limits.token_capacity))


def rfc3339(unix_s: float) -> str:
    """A moment as RFC 3339 in UTC, to the second (rounded up): "2026-12-04T04:30:12Z"."""
    return datetime.fromtimestamp(math.ceil(unix_s), tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def anthropic_ratelimit_headers(limits: Limits, snapshot: Snapshot) -> dict[str, str]:
    """Anthropic's anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset} headers for a
    scope's state (the same buckets as the x-ratelimit ones): `reset` is the moment the bucket is
    full again, RFC 3339, from the snapshot's time. An axis not enforced has none."""
    headers = {}
    for axis, per_minute, level, rate_s, cap in _axes(limits, snapshot):
        if level is None:
            continue
        headers[f"anthropic-ratelimit-{axis}-limit"] = str(per_minute)
        headers[f"anthropic-ratelimit-{axis}-remaining"] = str(max(0, math.floor(level)))
        headers[f"anthropic-ratelimit-{axis}-reset"] = rfc3339(snapshot.at + seconds_until(level, cap, rate_s))
    return headers


def provider_ratelimit_headers(limits: Limits, snapshot: Snapshot, provider: str) -> dict[str, str]:
    """The headers a route of `provider` (its error shape's name: "openai", "anthropic") answers
    with: the x-ratelimit-* ones always, Anthropic's beside them on Anthropic's routes."""
    headers = ratelimit_headers(limits, snapshot)
    if provider == "anthropic":
        headers.update(anthropic_ratelimit_headers(limits, snapshot))
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
