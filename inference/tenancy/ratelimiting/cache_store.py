"""The rate-limit store on a plain Django cache backend (local memory by default).

Check-and-debit is atomic within one process (a lock around read-modify-write), which is all a
local-memory cache can share anyway. Several processes sharing one budget need the Redis store.
"""
from __future__ import annotations

import threading

from .buckets import (DENIAL_TTL_S, DENIAL_WINDOW_MINUTES, Decision, Snapshot, Usage, bucket_ttl_s,
                      cache_key, denial_minute, first_denied, refill)
from .limits import Limits

_lock = threading.Lock()


class CacheStore:
    """Bucket levels, leases and denial counters kept as ordinary cache entries."""

    def __init__(self, cache):
        self.cache = cache

    def acquire(self, scope: str, limits: Limits, *, now: float, reserve_tokens: int,
                lease_id: str | None, lease_expiry: float) -> Decision:
        """Check every axis and, only if none refuses, debit one request, `reserve_tokens` tokens
        and (with a `lease_id`) a concurrency slot held until `lease_expiry` (seconds)."""
        with _lock:
            requests = self._level(scope, "requests", limits.request_rate_s,
                                   limits.request_capacity, now)
            tokens = self._level(scope, "tokens", limits.token_rate_s, limits.token_capacity, now)
            leases = self._leases(scope, now)
            denied = first_denied(requests, tokens, len(leases), reserve_tokens=reserve_tokens,
                                  takes_slot=lease_id is not None,
                                  max_concurrent=limits.max_concurrent_requests)
            if denied:
                self._count_denial(scope, now)
            else:
                if requests is not None:
                    requests -= 1
                    self._store(scope, "requests", requests, now, limits.request_rate_s,
                                limits.request_capacity)
                if tokens is not None and reserve_tokens > 0:
                    tokens -= reserve_tokens
                    self._store(scope, "tokens", tokens, now, limits.token_rate_s,
                                limits.token_capacity)
                if lease_id is not None:
                    leases[lease_id] = lease_expiry
                    self.cache.set(cache_key(scope, "leases"), leases,
                                   timeout=max(leases.values()) - now + 60)
            return Decision(denied, Snapshot(now, requests, tokens, len(leases)))

    def release(self, scope: str, limits: Limits, *, now: float, refund_tokens: int,
                lease_id: str | None) -> bool:
        """Free the lease and put `refund_tokens` back (negative: charge more), capped at the
        bucket's capacity. Returns False, changing nothing, when the lease is already gone."""
        with _lock:
            if lease_id is not None:
                leases = self._leases(scope, now)
                if leases.pop(lease_id, None) is None:
                    return False
                self.cache.set(cache_key(scope, "leases"), leases,
                               timeout=max(leases.values(), default=now) - now + 60)
            if limits.token_rate_s > 0 and refund_tokens:
                level = self._level(scope, "tokens", limits.token_rate_s, limits.token_capacity,
                                    now)
                level = min(limits.token_capacity, level + refund_tokens)
                self._store(scope, "tokens", level, now, limits.token_rate_s,
                            limits.token_capacity)
            return True

    def peek(self, scope: str, limits: Limits, *, now: float,
             count_denials: bool = True) -> Usage:
        """The scope's state at `now`, changing nothing (denials counted only if asked)."""
        with _lock:
            snapshot = Snapshot(
                now,
                self._level(scope, "requests", limits.request_rate_s, limits.request_capacity, now),
                self._level(scope, "tokens", limits.token_rate_s, limits.token_capacity, now),
                len(self._leases(scope, now)),
            )
        if not count_denials:
            return Usage(snapshot, 0)
        minute = denial_minute(now)
        keys = [cache_key(scope, f"denied:{m}")
                for m in range(minute - DENIAL_WINDOW_MINUTES + 1, minute + 1)]
        return Usage(snapshot, sum(self.cache.get_many(keys).values()))

    def _level(self, scope, axis, rate_s, cap, now) -> float | None:
        if rate_s <= 0:
            return None
        state = self.cache.get(cache_key(scope, axis))
        if state is None:
            return cap
        level, ts = state
        return refill(level, ts, now, rate_s, cap)

    def _store(self, scope, axis, level, now, rate_s, cap):
        self.cache.set(cache_key(scope, axis), (level, now), timeout=bucket_ttl_s(level, rate_s, cap))

    def _leases(self, scope, now) -> dict[str, float]:
        leases = self.cache.get(cache_key(scope, "leases")) or {}
        return {lease: expiry for lease, expiry in leases.items() if expiry > now}

    def _count_denial(self, scope, now):
        key = cache_key(scope, f"denied:{denial_minute(now)}")
        self.cache.set(key, (self.cache.get(key) or 0) + 1, timeout=DENIAL_TTL_S)
