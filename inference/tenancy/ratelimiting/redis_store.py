"""The rate-limit store on Redis (django-redis): each check-and-debit is one Lua script, so any
number of server processes share one budget atomically.

The scripts mirror cache_store.CacheStore and buckets.first_denied line for line. Time comes from
the caller (ARGV), not Redis's TIME, so every store reads the same clock as the headers it feeds.
"""
from __future__ import annotations

from redis.commands.core import Script

from .buckets import (DENIAL_TTL_S, DENIAL_WINDOW_MINUTES, Decision, Snapshot, Usage, cache_key,
                      denial_minute, refill)
from .limits import Limits

# Shared by both scripts: a bucket is a hash {level, ts}; a missing one reads as full.
_BUCKET_LUA = b"""
local now = tonumber(ARGV[1])
local function level(key, rate, cap)
  if rate <= 0 then return nil end
  local v = redis.call('HMGET', key, 'level', 'ts')
  local lvl, ts = tonumber(v[1]), tonumber(v[2])
  if lvl == nil then return cap end
  if now > ts then lvl = lvl + (now - ts) * rate end
  if lvl > cap then lvl = cap end
  return lvl
end
local function store(key, lvl, rate, cap)
  redis.call('HSET', key, 'level', tostring(lvl), 'ts', tostring(now))
  local keep = cap - lvl
  if keep < 0 then keep = 0 end
  redis.call('PEXPIRE', key, math.ceil((keep / rate + 60) * 1000))
end
local function out(x)
  if x == nil then return '' end
  return tostring(x)
end
"""

# KEYS: requests bucket, tokens bucket, leases zset (score = expiry), this minute's denial counter.
# ARGV: now, request rate/s, request cap, token rate/s, token cap, reserve, max concurrent,
#       lease id ('' = takes no slot), lease expiry, denial ttl.
ACQUIRE_LUA = _BUCKET_LUA + b"""
local req_rate, req_cap = tonumber(ARGV[2]), tonumber(ARGV[3])
local tok_rate, tok_cap = tonumber(ARGV[4]), tonumber(ARGV[5])
local reserve, max_conc = tonumber(ARGV[6]), tonumber(ARGV[7])
local lease, expiry = ARGV[8], tonumber(ARGV[9])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local in_flight = redis.call('ZCARD', KEYS[3])
local req = level(KEYS[1], req_rate, req_cap)
local tok = level(KEYS[2], tok_rate, tok_cap)
local denied = ''
if req ~= nil and req < 1 then denied = 'requests'
elseif tok ~= nil and reserve > 0 and tok < reserve then denied = 'tokens'
elseif lease ~= '' and max_conc > 0 and in_flight >= max_conc then denied = 'concurrency' end
if denied ~= '' then
  redis.call('INCR', KEYS[4])
  redis.call('EXPIRE', KEYS[4], tonumber(ARGV[10]))
  return {denied, out(req), out(tok), in_flight}
end
if req ~= nil then req = req - 1; store(KEYS[1], req, req_rate, req_cap) end
if tok ~= nil and reserve > 0 then tok = tok - reserve; store(KEYS[2], tok, tok_rate, tok_cap) end
if lease ~= '' then
  redis.call('ZADD', KEYS[3], expiry, lease)
  redis.call('PEXPIRE', KEYS[3], math.ceil((expiry - now + 60) * 1000))
  in_flight = in_flight + 1
end
return {'', out(req), out(tok), in_flight}
"""

# KEYS: tokens bucket, leases zset. ARGV: now, token rate/s, token cap, refund, lease id ('' = none).
RELEASE_LUA = _BUCKET_LUA + b"""
local tok_rate, tok_cap, refund, lease = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
if lease ~= '' and redis.call('ZREM', KEYS[2], lease) == 0 then return 0 end
local tok = level(KEYS[1], tok_rate, tok_cap)
if tok ~= nil and refund ~= 0 then
  tok = tok + refund
  if tok > tok_cap then tok = tok_cap end
  store(KEYS[1], tok, tok_rate, tok_cap)
end
return 1
"""

_acquire_script = Script(None, ACQUIRE_LUA)
_release_script = Script(None, RELEASE_LUA)


def _level(raw: bytes | str) -> float | None:
    return None if raw in (b"", "") else float(raw)


class RedisStore:
    """Bucket levels (hashes), leases (a sorted set by expiry) and per-minute denial counters
    in Redis, under the cache's key prefix."""

    def __init__(self, cache):
        self.cache = cache

    def _key(self, scope: str, part: str) -> str:
        return self.cache.make_key(cache_key(scope, part))

    def _client(self):
        return self.cache.client.get_client(write=True)

    def acquire(self, scope: str, limits: Limits, *, now: float, reserve_tokens: int,
                lease_id: str | None, lease_expiry: float) -> Decision:
        """As CacheStore.acquire, in one Lua script."""
        denial_key = self._key(scope, f"denied:{denial_minute(now)}")
        keys = [self._key(scope, "requests"), self._key(scope, "tokens"),
                self._key(scope, "leases"), denial_key]
        args = [repr(now), repr(limits.request_rate_s), repr(limits.request_capacity),
                repr(limits.token_rate_s), repr(limits.token_capacity), reserve_tokens,
                limits.max_concurrent_requests, lease_id or "", repr(lease_expiry), DENIAL_TTL_S]
        denied, requests, tokens, in_flight = _acquire_script(keys=keys, args=args,
                                                              client=self._client())
        denied = denied.decode() if isinstance(denied, bytes) else denied
        return Decision(denied or None, Snapshot(now, _level(requests), _level(tokens),
                                                 int(in_flight)))

    def release(self, scope: str, limits: Limits, *, now: float, refund_tokens: int,
                lease_id: str | None) -> bool:
        """As CacheStore.release, in one Lua script."""
        keys = [self._key(scope, "tokens"), self._key(scope, "leases")]
        args = [repr(now), repr(limits.token_rate_s), repr(limits.token_capacity), refund_tokens,
                lease_id or ""]
        return bool(_release_script(keys=keys, args=args, client=self._client()))

    def peek(self, scope: str, limits: Limits, *, now: float,
             count_denials: bool = True) -> Usage:
        """The scope's state at `now`, read in one pipeline, changing nothing."""
        minute = denial_minute(now)
        denial_keys = [self._key(scope, f"denied:{m}")
                       for m in range(minute - DENIAL_WINDOW_MINUTES + 1, minute + 1)
                       if count_denials]
        pipe = self._client().pipeline(transaction=False)
        pipe.hmget(self._key(scope, "requests"), "level", "ts")
        pipe.hmget(self._key(scope, "tokens"), "level", "ts")
        pipe.zcount(self._key(scope, "leases"), f"({now!r}", "+inf")
        if denial_keys:
            pipe.mget(denial_keys)
        req_state, tok_state, in_flight, *denials = pipe.execute()
        denials = denials[0] if denials else []

        def level(state, rate_s, cap):
            if rate_s <= 0:
                return None
            if state[0] is None:
                return cap
            return refill(float(state[0]), float(state[1]), now, rate_s, cap)

        snapshot = Snapshot(now, level(req_state, limits.request_rate_s, limits.request_capacity),
                            level(tok_state, limits.token_rate_s, limits.token_capacity),
                            int(in_flight))
        return Usage(snapshot, sum(int(d) for d in denials if d is not None))
