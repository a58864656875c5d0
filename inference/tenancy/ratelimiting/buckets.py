"""Token-bucket arithmetic and the value types the stores return; no I/O here.

A bucket is (level, ts): `level` units were available at time `ts` (seconds); it refills
continuously at `rate` units per second up to `cap` (the original server's rule, section 2.3 of
reference/metrale-behaviour.md). The Redis store runs the same arithmetic in Lua.
"""
from __future__ import annotations

from dataclasses import dataclass

AXES = ("requests", "tokens", "concurrency")
# Denials are counted per minute and kept for an hour (+1 minute of slack for the TTL).
DENIAL_WINDOW_MINUTES = 60
DENIAL_TTL_S = 3660


def refill(level: float, ts: float, now: float, rate_s: float, cap: float) -> float:
    """The level at `now` of a bucket that held `level` at `ts`, refilled at `rate_s` per second."""
    if now > ts:
        level += (now - ts) * rate_s
    return min(level, cap)


def seconds_until(level: float, needed: float, rate_s: float) -> float:
    """Seconds until a bucket at `level` holds `needed` units (0 when it already does)."""
    if level >= needed or rate_s <= 0:
        return 0.0
    return (needed - level) / rate_s


def bucket_ttl_s(level: float, rate_s: float, cap: float) -> float:
    """How long a bucket's state must be kept: until it is full again, plus a minute of slack.
    A missing bucket reads as full, so expiring it then loses nothing."""
    return max(0.0, cap - level) / rate_s + 60.0


def denial_minute(now: float) -> int:
    """The minute number (since the epoch) a denial at `now` is counted under."""
    return int(now // 60)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One scope's state at `at` (seconds since the epoch).

    requests / tokens: bucket levels (None where the axis is not enforced); in_flight: leases
    held by generating requests."""

    at: float
    requests: float | None
    tokens: float | None
    in_flight: int


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of an acquire: `denied` names the axis that refused ("requests", "tokens",
    "concurrency") or is None when everything was debited; `snapshot` is the state after it."""

    denied: str | None
    snapshot: Snapshot


@dataclass(frozen=True, slots=True)
class Usage:
    """What an operator sees for a scope: its snapshot and the denials in the last hour."""

    snapshot: Snapshot
    denials_last_hour: int


def cache_key(scope: str, part: str) -> str:
    """The cache key of one part of a scope's state. The scope sits in {braces} so that on a
    Redis Cluster all of one scope's keys share a slot (a script may touch them together)."""
    return f"metrale:rl:{{{scope}}}:{part}"


def first_denied(requests: float | None, tokens: float | None, in_flight: int, *,
                 reserve_tokens: int, takes_slot: bool, max_concurrent: int) -> str | None:
    """Which axis refuses a request, checked in the order requests, tokens, concurrency.

    A request needs one unit in the requests bucket, `reserve_tokens` in the tokens bucket (only
    when it reserves any), and, when it `takes_slot`, fewer than `max_concurrent` leases in
    flight (0: unlimited). The Redis script (redis_store.ACQUIRE_LUA) mirrors this function."""
    if requests is not None and requests < 1:
        return "requests"
    if tokens is not None and reserve_tokens > 0 and tokens < reserve_tokens:
        return "tokens"
    if takes_slot and max_concurrent > 0 and in_flight >= max_concurrent:
        return "concurrency"
    return None
