"""Who is calling: `Authorization: Bearer <key>` (or `x-api-key: <key>`) -> ApiKey -> Tenant, as a Principal.

Rules (section 2.2 of reference/metrale-behaviour.md, with tenants per issue 8): with
METRALE["REQUIRE_AUTH"] off every request runs as the built-in default tenant; with it on, no
`Bearer <token>` and no `x-api-key` (Anthropic's header; its SDK sends either) is 401
`missing_api_key`, and a token that matches no usable key (unknown,
revoked, expired, or of an inactive tenant) is 401 `invalid_api_key`. OpenAI sends both as
type `invalid_request_error`.

Operator routes (`authenticate_operator`, through api.operator_endpoint) take only an admin key
(ApiKey.is_admin) or a staff user's session, with auth on or off.

With auth on, a request that sends no key from an active staff user's admin session (the
playground's) runs as the built-in operators' tenant (OPERATORS_TENANT_NAME); being
cookie-authenticated, its unsafe methods must pass Django's CSRF check (403 `csrf_failed`).
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from . import apikeys, recent
from ..models import ApiKey, Tenant
from ..serving.errors import ApiError

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

    Costs one indexed query (key by prefix, with its tenant) unless this process looked the same
    token up within recent.TTL_S, plus a write of last_used at most once a minute per key."""
    if not settings.METRALE["REQUIRE_AUTH"]:
        return await _named_tenant(Tenant.DEFAULT_NAME)

    token = bearer_token(request.headers.get("Authorization")) or request.headers.get("x-api-key", "").strip()
    if not token and "Authorization" not in request.headers:
        operators = await _operators_session(request)
        if operators is not None:
            return operators
    if not token:
        raise _unauthorized(
            "You didn't provide an API key. Send it as 'Authorization: Bearer YOUR_KEY' or 'x-api-key: YOUR_KEY'.",
            "missing_api_key")

    key = await usable_key(token)
    return Principal(key.tenant, key, key.tenant.prefix_cache_salt)


async def _named_tenant(name: str) -> Principal:
    """The Principal of the built-in tenant `name` (made when first needed), remembered (recent.py)."""
    async def load() -> Principal:
        tenant, _ = await Tenant.objects.aget_or_create(name=name)
        return Principal(tenant, None, tenant.prefix_cache_salt)

    return await recent.recall_or_load(("tenant", name), load)


async def usable_key(token: str) -> ApiKey:
    """The ApiKey (with its tenant) that `token` is, when it may be used now; else ApiError 401
    `invalid_api_key` (unknown, revoked, expired, tenant inactive). Stamps last_used at most once
    a minute. The row is remembered by its token's digest for recent.TTL_S; the checks run on every call."""
    digest = apikeys.hash_key(token)
    key = recent.recall(("key", digest))
    if key is None and apikeys.looks_like_key(token):
        key = await recent.shared_load(("key", digest), ApiKey.objects.select_related("tenant")
                                       .filter(prefix=apikeys.key_prefix(token)).afirst)
    if not apikeys.digest_matches(digest, key.key_hash if key else None):
        raise _unauthorized("Incorrect API key provided.", "invalid_api_key")
    recent.remember(("key", digest), key)
    now = timezone.now()
    refusal = key.refusal(now)
    if refusal:
        raise _unauthorized(f"The API key {key.prefix}… cannot be used: {refusal}.",
                            "invalid_api_key")

    if key.last_used is None or now - key.last_used >= LAST_USED_RESOLUTION:
        await ApiKey.objects.filter(pk=key.pk).aupdate(last_used=now)
        key.last_used = now
    return key


@dataclass(frozen=True, slots=True)
class Operator:
    """The caller of an operator route: an admin key (api_key set) or a staff user's session
    (username set). `name` says which, for logs: `key:<prefix>` or `user:<username>`."""

    name: str
    api_key: ApiKey | None = None
    username: str | None = None


def csrf_refusal(request) -> str | None:
    """Why Django's CSRF protection refuses `request` (a call authenticated by a session cookie),
    or None when it passes (safe methods always do). The same checks as CsrfViewMiddleware on a
    view that is not exempt: the token, and the Origin / Referer of a secure request."""
    from django.middleware.csrf import CsrfViewMiddleware

    refused = CsrfViewMiddleware(lambda r: None).process_view(request, None, (), {})
    return None if refused is None else "CSRF verification failed (send the csrftoken cookie's value as X-CSRFToken)"


# The tenant that staff users' session calls of the API run as (made when first needed; no migration).
OPERATORS_TENANT_NAME = "operators"


async def staff_session_user(request):
    """The active staff user of the request's session (an admin login), or None (no session, a
    user who is not staff or not active, or a request that went around AuthenticationMiddleware)."""
    user = await request.auser() if hasattr(request, "auser") else None
    return user if user is not None and user.is_active and user.is_staff else None


async def _operators_session(request) -> Principal | None:
    """A staff session's Principal in the operators' tenant, None without a staff session.
    Raises ApiError 403 `csrf_failed` for an unsafe method that fails the CSRF check."""
    if await staff_session_user(request) is None:
        return None
    refusal = csrf_refusal(request)
    if refusal:
        raise ApiError(403, refusal, type="invalid_request_error", code="csrf_failed")
    return await _named_tenant(OPERATORS_TENANT_NAME)


async def authenticate_operator(request) -> Operator:
    """The Operator of an operator route's request (api.operator_endpoint), whatever
    METRALE["REQUIRE_AUTH"] says: a bearer key must be an admin key (a usable one that is not:
    403 `admin_key_required`; an unusable one: 401 as for every route); without a key, a staff
    user's session is accepted, its unsafe methods CSRF-checked (403 `csrf_failed`); with
    neither, 401 `missing_api_key`."""
    token = bearer_token(request.headers.get("Authorization"))
    if token is not None:
        key = await usable_key(token)
        if not key.is_admin:
            raise ApiError(403, f"The API key {key.prefix}… is not an admin key; this route needs one "
                                "(manage.py create_api_key --admin) or a staff session.",
                           type="invalid_request_error", code="admin_key_required")
        return Operator(f"key:{key.prefix}", api_key=key)
    user = await staff_session_user(request)
    if user is not None:
        refusal = csrf_refusal(request)
        if refusal:
            raise ApiError(403, refusal, type="invalid_request_error", code="csrf_failed")
        return Operator(f"user:{user.get_username()}", username=user.get_username())
    raise _unauthorized("This route needs an admin API key ('Authorization: Bearer YOUR_ADMIN_KEY') "
                        "or a staff user's session.", "missing_api_key")
