"""Admission control for /v1/*: token buckets per scope for requests and tokens, plus a cap on
generating requests in flight, kept in Django's cache (see ratelimiting/).

A generating request calls `acquire` (one request, `reserve_tokens` tokens, one concurrency
slot) and, however it ends, `Lease.release(used_tokens)`, which refunds the unused reservation
and frees the slot. Other /v1 routes call `debit_request` (one request, nothing to release).
A denial debits nothing. Rules: issue 8 and section 2.3 of reference/metrale-behaviour.md.
"""
from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.cache.backends.locmem import LocMemCache

from ..operations.metrics import RATE_LIMITED
from ..models import RateLimitContext
from . import recent
from .ratelimiting import clock
from .ratelimiting.buckets import Snapshot
from .ratelimiting.headers import provider_ratelimit_headers, ratelimit_headers, retry_after_s
from .ratelimiting.limits import Limits
from .ratelimiting.store import get_store
from ..serving.errors import ApiError

# A lease left behind by a crashed process frees itself this long after the request's deadline.
LEASE_SLACK_S = 60.0


@dataclass(eq=False)
class Lease:
    """What one admitted request holds: the debit's snapshot (for the response headers) and, for
    a generating request, a concurrency slot and `reserved_tokens` tokens."""

    scope: str
    limits: Limits
    snapshot: Snapshot
    reserved_tokens: int = 0
    lease_id: str | None = None
    released: bool = field(default=False)

    def headers(self, provider: str = "openai") -> dict[str, str]:
        """The x-ratelimit-{limit,remaining,reset}-{requests,tokens} headers for the response (and
        on an Anthropic route, `provider` "anthropic", its anthropic-ratelimit-* ones), as of the
        moment the request was admitted."""
        return provider_ratelimit_headers(self.limits, self.snapshot, provider)

    async def release(self, used_tokens: int) -> None:
        """End the lease: charge `used_tokens` (prompt + completion tokens actually processed),
        refund the rest of the reservation, free the concurrency slot.

        Idempotent: only the first call counts. The store write is shielded from cancellation,
        so calling this in the `finally` of a cancelled stream still completes it."""
        if self.released:
            return
        self.released = True
        if self.lease_id is None:
            return
        refund = self.reserved_tokens - max(0, int(used_tokens))
        store = get_store()
        await asyncio.shield(_call(store, store.release, self.scope, self.limits,
                                   now=clock.now(), refund_tokens=refund, lease_id=self.lease_id))


async def acquire(principal, *, reserve_tokens: int, timeout_s: float | None = None) -> Lease:
    """Admit a generating request: atomically debit one request and `reserve_tokens` tokens
    (prompt tokens + max_tokens) and take a concurrency slot, or change nothing and raise.

    Raises ApiError 429 (type and code `rate_limit_exceeded`, param "requests", "tokens" or
    "concurrency", headers Retry-After >= 1 s and x-ratelimit-*) when an axis refuses, and
    ApiError 400 (param "max_tokens", code "request_too_large") when the request could never be
    admitted: more than max_tokens_per_request, or more than the tokens bucket holds.

    timeout_s: the request's own deadline in seconds when it sets one (default
    METRALE["REQUEST_TIMEOUT_S"]); a lease never released (a crashed process) frees its slot
    LEASE_SLACK_S after it."""
    if reserve_tokens < 0:
        raise ValueError("reserve_tokens must be >= 0")
    scope, limits = await _scope_and_limits(principal)
    _check_request_size(limits, reserve_tokens)
    now = clock.now()
    lease_id = uuid.uuid4().hex
    timeout_s = timeout_s or settings.METRALE.get("REQUEST_TIMEOUT_S") or 600.0
    expiry = now + float(timeout_s) + LEASE_SLACK_S
    store = get_store()
    pending = asyncio.ensure_future(_call(store, store.acquire, scope, limits, now=now,
                                          reserve_tokens=reserve_tokens, lease_id=lease_id,
                                          lease_expiry=expiry))
    try:
        decision = await asyncio.shield(pending)
    except asyncio.CancelledError:
        # The client left while the debit was in flight: undo it if it went through.
        lease = Lease(scope, limits, Snapshot(now, None, None, 0), reserve_tokens, lease_id)
        pending.add_done_callback(lambda done: _release_orphan(done, lease))
        raise
    if decision.denied:
        raise _denial(limits, decision, reserve_tokens)
    return Lease(scope, limits, decision.snapshot, reserve_tokens, lease_id)


async def debit_request(principal) -> Lease:
    """Admit a non-generating /v1 request (models, tokenize, stored objects): debit one request
    from the requests bucket, reserve no tokens, take no concurrency slot. The returned Lease
    carries the headers; releasing it is allowed and does nothing.

    Raises ApiError 429 (param "requests") as `acquire` does."""
    scope, limits = await _scope_and_limits(principal)
    store = get_store()
    decision = await _call(store, store.acquire, scope, limits, now=clock.now(), reserve_tokens=0,
                           lease_id=None, lease_expiry=0.0)
    if decision.denied:
        raise _denial(limits, decision, 0)
    return Lease(scope, limits, decision.snapshot)


async def current_headers(principal, provider: str = "openai") -> dict[str, str]:
    """The x-ratelimit-* headers (and anthropic-ratelimit-* for `provider` "anthropic") of
    `principal`'s budget as it stands, debiting nothing: for a /v1 response that ends before its
    request was admitted (e.g. a 400 from validation)."""
    scope, limits = await _scope_and_limits(principal)
    store = get_store()
    usage = await _call(store, store.peek, scope, limits, now=clock.now(), count_denials=False)
    return provider_ratelimit_headers(limits, usage.snapshot, provider)


async def _scope_and_limits(principal) -> tuple[str, Limits]:
    """The request's scope and limits (RateLimitContext.afor), remembered for recent.TTL_S."""
    key_id = principal.api_key.pk if principal.api_key is not None else None
    return await recent.recall_or_load(("limits", principal.tenant.pk, key_id),
                                       lambda: RateLimitContext.objects.afor(principal.tenant.pk, key_id))


def _check_request_size(limits: Limits, reserve_tokens: int) -> None:
    if limits.max_tokens_per_request and reserve_tokens > limits.max_tokens_per_request:
        raise ApiError(400, f"This request needs {reserve_tokens} tokens (prompt + max_tokens); "
                       f"the most one request may use is {limits.max_tokens_per_request}.",
                       param="max_tokens", code="request_too_large")
    if limits.token_rate_s > 0 and reserve_tokens > limits.token_capacity:
        raise ApiError(400, f"This request needs {reserve_tokens} tokens (prompt + max_tokens), "
                       f"more than the {int(limits.token_capacity)} your tokens-per-minute "
                       "budget can ever hold. Lower max_tokens or shorten the prompt.",
                       param="max_tokens", code="request_too_large")


def _denial(limits: Limits, decision, reserve_tokens: int) -> ApiError:
    axis = decision.denied
    RATE_LIMITED.labels(axis).inc()
    retry_s = retry_after_s(limits, decision.snapshot, axis, reserve_tokens)
    if axis == "concurrency":
        message = (f"Too many concurrent requests (limit {limits.max_concurrent_requests}). "
                   f"Retry after {retry_s}s.")
    else:
        message = f"Rate limit exceeded for {axis}. Retry after {retry_s}s."
    headers = {"Retry-After": str(retry_s), **ratelimit_headers(limits, decision.snapshot)}
    return RateLimited(429, message, type="rate_limit_exceeded", param=axis,
                       code="rate_limit_exceeded", headers=headers, limits=limits, snapshot=decision.snapshot)


class RateLimited(ApiError):
    """A 429 from an axis that refused, with the budget's state it was refused at (`limits`,
    `snapshot`) for the provider's own rate-limit headers (Lease.headers)."""

    def __init__(self, *args, limits: Limits, snapshot: Snapshot, **kwargs):
        super().__init__(*args, **kwargs)
        self.limits = limits
        self.snapshot = snapshot

    def provider_headers(self, provider: str) -> dict[str, str]:
        """The refusal's rate-limit headers for a route of `provider` (see Lease.headers)."""
        return provider_ratelimit_headers(self.limits, self.snapshot, provider)


async def _call(store, method, *args, **kwargs):
    # Local memory is a dict behind a lock: call it inline. Anything else does network I/O,
    # which must not block the event loop.
    if isinstance(store.cache, LocMemCache):
        return method(*args, **kwargs)
    return await sync_to_async(method, thread_sensitive=False)(*args, **kwargs)


def _release_orphan(done: asyncio.Future, lease: Lease) -> None:
    if done.cancelled() or done.exception() is not None or done.result().denied:
        return
    asyncio.ensure_future(lease.release(0))
