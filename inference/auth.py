"""Who is calling: `Authorization: Bearer <key>` (or `x-api-key: <key>`) -> ApiKey -> Tenant, as a Principal.

Rules (section 2.2 of reference/metrale-behaviour.md, with tenants per issue 8): with
METRALE["REQUIRE_AUTH"] off every request runs as the built-in default tenant; with it on, no
`Bearer <token>` and no `x-api-key` (Anthropic's header; its SDK sends either) is 401
`missing_api_key`, and a token that matches no usable key (unknown,
revoked, expired, or of an inactive tenant) is 401 `invalid_api_key`. OpenAI sends both as
type `invalid_request_error`.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from . import apikeys
from .models import ApiKey, Tenant
from .serving.errors import ApiError

# last_used is written at most this often per key, so a busy key costs no write per request.
LAST_USED_RESOLUTION = timedelta(minutes=1)


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller of one request: its tenant, the key it used (None with auth off), and the salt
    that keeps its prefix-cache blocks apart from every other tenant's."""

    tenant: Tenant
    api_key: ApiKey | None
    prefix_cache_salt: str


def bearer_token(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header (scheme case-insensitive, as RFC
    6750 allows), or None when the header is absent or not of that form."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or " " in token:
        return None
    return token


def _unauthorized(message: str, code: str) -> ApiError:
    return ApiError(401, message, type="invalid_request_error", code=code)


async def authenticate(request) -> Principal:
    """The Principal of `request`, or ApiError(401) per the module's rules.

    Costs one indexed query (key by prefix, with its tenant), plus a write of last_used at most
    once a minute per key."""
    if not settings.METRALE["REQUIRE_AUTH"]:
        tenant, _ = await Tenant.objects.aget_or_create(name=Tenant.DEFAULT_NAME)
        return Principal(tenant, None, tenant.prefix_cache_salt)

    token = bearer_token(request.headers.get("Authorization")) or request.headers.get("x-api-key", "").strip()
    if not token:
        raise _unauthorized(
            "You didn't provide an API key. Send it as 'Authorization: Bearer YOUR_KEY' or 'x-api-key: YOUR_KEY'.",
            "missing_api_key")

    key = None
    if apikeys.looks_like_key(token):
        key = await (ApiKey.objects.select_related("tenant")
                     .filter(prefix=apikeys.key_prefix(token)).afirst())
    if not apikeys.key_matches(token, key.key_hash if key else None):
        raise _unauthorized("Incorrect API key provided.", "invalid_api_key")
    now = timezone.now()
    refusal = key.refusal(now)
    if refusal:
        raise _unauthorized(f"The API key {key.prefix}… cannot be used: {refusal}.",
                            "invalid_api_key")

    if key.last_used is None or now - key.last_used >= LAST_USED_RESOLUTION:
        await ApiKey.objects.filter(pk=key.pk).aupdate(last_used=now)
        key.last_used = now
    return Principal(key.tenant, key, key.tenant.prefix_cache_salt)
