"""The rows every API request looks up (its tenant, its key, its rate-limit context), remembered by this
process for a moment.

Without it each request makes two or three database queries, each through Django's async ORM: a hop
to a worker thread and back, and under ASGI a new thread per request for the first of them. That was
a third of the event loop's time at 32 clients on small requests (one-text embeddings, /v1/models).

Rule: an entry is reused for at most TTL_S seconds, and this process forgets every entry as soon as
it saves or deletes a Tenant, ApiKey or RateLimitContext (the admin's edits, manage.py commands, the
signals below). A change made by another process (another replica, a raw UPDATE) is seen within
TTL_S. What is checked against the clock (a key's expiry, its tenant's activity as read) is checked
on every request from the remembered row.

When an entry lapses under load, the requests that miss it together share one lookup (shared_load):
at 32 clients every lapse had each of them query on a new thread with a new database connection of
its own.
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

TTL_S = 1.0

_lock = threading.Lock()
_entries: dict[tuple, tuple[float, Any]] = {}
_loads: dict[tuple, asyncio.Future] = {}  # (event loop, key) -> the lookup under way (event loop threads only)


def recall(key: tuple) -> Any:
    """The value remembered under `key` within the last TTL_S seconds, or None."""
    with _lock:
        found = _entries.get(key)
        if found is None:
            return None
        expires, value = found
        if time.monotonic() >= expires:
            del _entries[key]
            return None
        return value


def remember(key: tuple, value: Any) -> Any:
    """Keep `value` (not None) under `key` for TTL_S seconds; returns it."""
    with _lock:
        if len(_entries) > 10_000:  # many distinct tokens: start over rather than grow
            _entries.clear()
        _entries[key] = (time.monotonic() + TTL_S, value)
    return value


async def shared_load(key: tuple, load: Callable[[], Awaitable[Any]]) -> Any:
    """load()'s result, one lookup for every caller that asks for `key` on this event loop while it runs:
    the first runs load(), the others wait for its result or its exception. A caller cancelled while
    waiting leaves the lookup running; a first caller cancelled mid-lookup leaves the waiting ones to
    look up again. load() remembers what it found (remember) as the caller's rule is."""
    loop = asyncio.get_running_loop()
    while True:
        pending = _loads.get((loop, key))
        if pending is None:
            break
        try:
            return await asyncio.shield(pending)
        except asyncio.CancelledError:
            if pending.cancelled() and not asyncio.current_task().cancelling():
                continue  # the first caller was cancelled, not this one: look up afresh
            raise
    future = _loads[(loop, key)] = loop.create_future()
    try:
        value = await load()
    except asyncio.CancelledError:
        future.cancel()
        raise
    except BaseException as exc:
        future.set_exception(exc)
        future.exception()  # retrieved: with no caller waiting, asyncio must not report it unhandled
        raise
    else:
        future.set_result(value)
        return value
    finally:
        _loads.pop((loop, key), None)


async def recall_or_load(key: tuple, load: Callable[[], Awaitable[Any]]) -> Any:
    """The value remembered for `key`, or else load()'s (one lookup shared by the callers that miss it together:
    shared_load), remembered for TTL_S. Raises what load() raises (nothing is remembered then)."""
    async def load_and_remember() -> Any:
        return remember(key, await load())

    return recall(key) or await shared_load(key, load_and_remember)


def forget_all(**_signal_kwargs) -> None:
    """Drop every entry (connected to post_save / post_delete of the looked-up models)."""
    with _lock:
        _entries.clear()


def connect() -> None:
    """Forget on every save or delete of a Tenant, ApiKey or RateLimitContext (called once, in
    InferenceConfig.ready)."""
    from django.db.models.signals import post_delete, post_save

    from ..models import ApiKey, RateLimitContext, Tenant

    for model in (Tenant, ApiKey, RateLimitContext):
        post_save.connect(forget_all, sender=model, dispatch_uid=f"recent-save-{model.__name__}")
        post_delete.connect(forget_all, sender=model, dispatch_uid=f"recent-delete-{model.__name__}")
