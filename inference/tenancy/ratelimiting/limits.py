"""Limits: the numbers one rate-limit scope (a tenant or one API key) is held to."""
from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-scope limits. Every 0 means "not enforced" (the original server's rule: a rate of 0
    disables only that bucket).

    requests_per_minute / tokens_per_minute: refill rates of the two token buckets.
    burst_requests / burst_tokens: bucket capacities; None means "the per-minute rate" (min 1),
      as METRALE_RATE_LIMIT_BURST_RPM/_TPM default in the original server.
    max_concurrent_requests: generating requests in flight at once.
    max_tokens_per_request: the most prompt + max_tokens one request may reserve.
    """

    requests_per_minute: int = 0
    tokens_per_minute: int = 0
    burst_requests: int | None = None
    burst_tokens: int | None = None
    max_concurrent_requests: int = 0
    max_tokens_per_request: int = 0

    def __post_init__(self):
        for name in self.__slots__:
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ValueError(f"{name} must be a whole number >= 0, got {value!r}")

    @property
    def request_capacity(self) -> float:
        """Requests the bucket holds when full."""
        return float(max(1, self.burst_requests or self.requests_per_minute))

    @property
    def token_capacity(self) -> float:
        """Tokens the bucket holds when full."""
        return float(max(1, self.burst_tokens or self.tokens_per_minute))

    @property
    def request_rate_s(self) -> float:
        """Requests refilled per second (0: the axis is not enforced)."""
        return self.requests_per_minute / 60.0

    @property
    def token_rate_s(self) -> float:
        """Tokens refilled per second (0: the axis is not enforced)."""
        return self.tokens_per_minute / 60.0


def default_limits() -> Limits:
    """The limits of a tenant that has no RateLimitContext: settings.METRALE["RATE_LIMITS"].

    Raises ImproperlyConfigured when a value is negative or not whole."""
    values = settings.METRALE.get("RATE_LIMITS", {})
    try:
        return Limits(
            requests_per_minute=values.get("RPM", 0),
            tokens_per_minute=values.get("TPM", 0),
            burst_requests=values.get("BURST_RPM"),
            burst_tokens=values.get("BURST_TPM"),
            max_concurrent_requests=values.get("MAX_CONCURRENT_REQUESTS", 0),
            max_tokens_per_request=values.get("MAX_TOKENS_PER_REQUEST", 0),
        )
    except ValueError as exc:
        raise ImproperlyConfigured(f"METRALE['RATE_LIMITS']: {exc}") from exc
