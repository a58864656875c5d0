"""Token-bucket rate limiting: limits, bucket math, and the cache-backed stores (the facade is
inference.tenancy.ratelimit)."""
