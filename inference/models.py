"""Tenants, their API keys (stored hashed) and the rate limits they fall under."""
from __future__ import annotations

import hashlib
import hmac

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone

from .tenancy import apikeys
from .tenancy.ratelimiting.limits import Limits, default_limits


class Tenant(models.Model):
    """One customer: its keys, its limits, and its own slice of the prefix cache.

    A tenant without a tenant-wide RateLimitContext falls under the server defaults
    (settings.METRALE["RATE_LIMITS"])."""

    DEFAULT_NAME = "default"  # the tenant every request runs as when METRALE_REQUIRE_AUTH is off

    name = models.CharField(max_length=100, unique=True)
    active = models.BooleanField(default=True, help_text="Inactive tenants' keys are refused (401).")
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    @property
    def prefix_cache_salt(self) -> str:
        """Salt for this tenant's prefix-cache block hashes, so one tenant's cached prompt blocks
        never match another's. Derived from the tenant id and SECRET_KEY (stable across
        processes and restarts; not guessable from the id)."""
        message = f"metrale-prefix-cache:tenant:{self.pk}".encode()
        return hmac.new(settings.SECRET_KEY.encode(), message, hashlib.sha256).hexdigest()[:32]


class ApiKey(models.Model):
    """A bearer key of one tenant. Only its SHA-256 is stored; the full key exists once, on the
    instance that created it (`new_key`), to be shown to the operator. `is_admin` is its scope:
    an admin key is also accepted by the operator routes (api.operator_endpoint)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=apikeys.PREFIX_LENGTH, unique=True, editable=False,
                              help_text="The key's first characters, shown so people can tell keys apart.")
    key_hash = models.CharField(max_length=64, editable=False)
    created = models.DateTimeField(auto_now_add=True)
    last_used = models.DateTimeField(null=True, blank=True, editable=False,
                                     help_text="Updated at most once a minute.")
    expires_at = models.DateTimeField(null=True, blank=True, help_text="Empty: never expires.")
    revoked = models.BooleanField(default=False)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)
    is_admin = models.BooleanField(
        "admin", default=False,
        help_text="Admin scope: the key may also call the operator routes (/metrics when "
                  "METRALE_METRICS_AUTH is on, adapter loading, model swap).")

    new_key: str | None = None

    class Meta:
        ordering = ["tenant__name", "-created"]
        verbose_name = "API key"

    def __str__(self):
        return f"{self.prefix}… ({self.name or 'unnamed'})"

    def save(self, *args, **kwargs):
        """Generates the key on first save (kept in `new_key`, never stored) and stamps
        revoked_at when the key is revoked."""
        if not self.key_hash:
            self.new_key = apikeys.generate_key()
            self.prefix = apikeys.key_prefix(self.new_key)
            self.key_hash = apikeys.hash_key(self.new_key)
        if self.revoked and self.revoked_at is None:
            self.revoked_at = timezone.now()
        elif not self.revoked:
            self.revoked_at = None
        super().save(*args, **kwargs)

    def refusal(self, now) -> str | None:
        """Why the key may not be used at `now` ("revoked", "expired", "tenant inactive"), or
        None when it may."""
        if self.revoked:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        if not self.tenant.active:
            return "tenant inactive"
        return None


class RateLimitContextQuerySet(models.QuerySet):
    async def afor(self, tenant_id: int, api_key_id: int | None) -> tuple[str, Limits]:
        """The scope and limits a request falls under: its key's own context when the key has
        one, else its tenant's tenant-wide context, else the server defaults (tenant scope)."""
        query = models.Q(api_key__isnull=True)
        if api_key_id is not None:
            query |= models.Q(api_key_id=api_key_id)
        contexts = [c async for c in self.filter(query, tenant_id=tenant_id)]
        for context in sorted(contexts, key=lambda c: c.api_key_id is None):
            return context.scope, context.limits()
        return tenant_scope(tenant_id), default_limits()


def tenant_scope(tenant_id: int) -> str:
    """The rate-limit scope name of a tenant's shared budget."""
    return f"tenant:{tenant_id}"


def key_scope(api_key_id: int) -> str:
    """The rate-limit scope name of a key with limits of its own."""
    return f"key:{api_key_id}"


class RateLimitContext(models.Model):
    """The limits of a tenant (api_key empty) or of one of its keys (the key then has a budget
    of its own instead of sharing the tenant's). 0 everywhere means "not enforced"."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="rate_limits")
    api_key = models.OneToOneField(ApiKey, on_delete=models.CASCADE, null=True, blank=True,
                                   related_name="rate_limit",
                                   help_text="Empty: the tenant-wide limits.")
    requests_per_minute = models.PositiveIntegerField(default=0, help_text="0: unlimited.")
    tokens_per_minute = models.PositiveIntegerField(
        default=0, help_text="Prompt + completion tokens. 0: unlimited.")
    burst_requests = models.PositiveIntegerField(
        null=True, blank=True, help_text="Requests bucket size. Empty: the per-minute rate.")
    burst_tokens = models.PositiveIntegerField(
        null=True, blank=True, help_text="Tokens bucket size. Empty: the per-minute rate.")
    max_concurrent_requests = models.PositiveIntegerField(
        default=0, help_text="Generating requests in flight at once. 0: unlimited.")
    max_tokens_per_request = models.PositiveIntegerField(
        default=0, help_text="Prompt + max_tokens of one request. 0: unlimited.")
    updated = models.DateTimeField(auto_now=True)

    objects = RateLimitContextQuerySet.as_manager()

    class Meta:
        ordering = ["tenant__name", "api_key__prefix"]
        verbose_name = "rate limit context"
        constraints = [
            models.UniqueConstraint(fields=["tenant"], condition=models.Q(api_key__isnull=True),
                                    name="inference_one_tenant_wide_rate_limit"),
        ]

    def __str__(self):
        return f"{self.tenant} / {self.api_key.prefix if self.api_key_id else 'all keys'}"

    def clean(self):
        if self.api_key_id is not None and self.api_key.tenant_id != self.tenant_id:
            raise ValidationError({"api_key": "This key belongs to another tenant."})

    @property
    def scope(self) -> str:
        """The rate-limit scope these limits govern."""
        return key_scope(self.api_key_id) if self.api_key_id else tenant_scope(self.tenant_id)

    def limits(self) -> Limits:
        """These limits as the rate limiter's value type."""
        return Limits(
            requests_per_minute=self.requests_per_minute,
            tokens_per_minute=self.tokens_per_minute,
            burst_requests=self.burst_requests,
            burst_tokens=self.burst_tokens,
            max_concurrent_requests=self.max_concurrent_requests,
            max_tokens_per_request=self.max_tokens_per_request,
        )

    def usage(self):
        """The live view (ratelimiting.buckets.Usage): bucket levels, leases in flight and the
        denials of the last hour, read from the cache now."""
        from .tenancy.ratelimiting import clock
        from .tenancy.ratelimiting.store import get_store

        return get_store().peek(self.scope, self.limits(), now=clock.now())


from .stored.completions import StoredChatCompletion  # noqa: E402,F401  (its own module: one model, one job)
from .operations.heartbeat import ServerProcess  # noqa: E402,F401  (its own module: the process heartbeat)
from .operations.request_log import RequestLogEntry  # noqa: E402,F401  (its own module: the request log)
