"""Picks the rate-limit store for the configured default cache: Redis scripts on django-redis,
a locked read-modify-write on anything else (local memory by default)."""
from __future__ import annotations

from django.core.cache import caches

from .cache_store import CacheStore


def is_redis(cache) -> bool:
    """True when `cache` is a django-redis cache, whose raw client can run Lua scripts."""
    try:
        from django_redis.cache import RedisCache
    except ImportError:
        return False
    return isinstance(cache, RedisCache)


def is_shared_atomically(cache) -> bool:
    """True when several processes can share budgets in `cache` atomically (django-redis), or
    when there is only one process's memory to share (local memory)."""
    from django.core.cache.backends.locmem import LocMemCache

    return is_redis(cache) or isinstance(cache, LocMemCache)


def get_store():
    """The store for settings.CACHES["default"], looked up on every call so that a settings
    change (tests switch CACHES) takes effect at once."""
    cache = caches["default"]
    if is_redis(cache):
        from .redis_store import RedisStore

        return RedisStore(cache)
    return CacheStore(cache)
