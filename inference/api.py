"""`openai_endpoint`: the one wrapper every /v1/* (and /tokenize, /detokenize) view goes through.

It authenticates (request.principal), admits the request through the rate limiter, turns any
ApiError into OpenAI's error JSON, adds the x-ratelimit-* headers, and exempts the view from
CSRF (callers authenticate with a bearer key, not a cookie).

Non-generating views get one request debited before they run. Generating views
(`@openai_endpoint(generates=True)`) call `admit(request, reserve_tokens=...)` once they know the
prompt's size, and release the lease themselves when generation ends; if a view forgets, the
wrapper releases it (charging the whole reservation) so no concurrency slot leaks.
"""
from __future__ import annotations

import functools
import logging

from django.http import JsonResponse, StreamingHttpResponse

from .auth import authenticate
from .ratelimit import Lease, acquire, current_headers, debit_request
from .serving.errors import ApiError

logger = logging.getLogger(__name__)


def error_response(error: ApiError) -> JsonResponse:
    """An ApiError as an HTTP response: OpenAI's error body, its status and its headers."""
    return JsonResponse(error.body(), status=error.status, headers=error.headers)


async def admit(request, *, reserve_tokens: int, timeout_s: float | None = None) -> Lease:
    """Inside an `@openai_endpoint(generates=True)` view: take a lease for a generating request
    reserving `reserve_tokens` tokens (prompt tokens + max_tokens; timeout_s: the request's own
    deadline in seconds, if it sets one). Raises ApiError 429/400
    (the wrapper answers it). The view must `await lease.release(used_tokens)` when generation
    ends (in a `finally`, inside the stream for streaming responses)."""
    lease = await acquire(request.principal, reserve_tokens=reserve_tokens, timeout_s=timeout_s)
    request.ratelimit_lease = lease
    return lease


def openai_endpoint(view=None, *, generates: bool = False):
    """Wrap an async view as an OpenAI endpoint (see the module docstring).

    generates=False: one request is debited before the view runs (models, tokenize, stored
    objects). generates=True: the view calls `admit` itself."""
    if view is None:
        return functools.partial(openai_endpoint, generates=generates)

    @functools.wraps(view)
    async def wrapper(request, *args, **kwargs):
        request.principal = None
        request.ratelimit_lease = None
        try:
            request.principal = await authenticate(request)
            if not generates:
                request.ratelimit_lease = await debit_request(request.principal)
            response = await view(request, *args, **kwargs)
        except ApiError as error:
            response = error_response(error)
        except BaseException:
            await _release_forgotten(request.ratelimit_lease)
            raise
        lease = request.ratelimit_lease
        principal = request.principal
        if "x-ratelimit-limit-requests" in response.headers:  # a 429 carries its own
            headers = {}
        elif lease is not None:
            headers = lease.headers()
        elif principal is not None:  # answered before `admit` (e.g. a 400)
            headers = await current_headers(principal)
        else:  # no identity (401): no budget to describe
            headers = {}
        for name, value in headers.items():
            response.headers.setdefault(name, value)
        if lease is not None:
            if isinstance(response, StreamingHttpResponse) and response.is_async:
                # Iterate the view's own generator (not Django's wrapper around it) so that it
                # can be closed first: its `finally` releases the lease with the real usage.
                content = getattr(response, "_iterator", None) or response.streaming_content
                response.streaming_content = _released_at_end(content, lease)
            elif not response.streaming:  # (a sync stream releases in its own finally)
                await _release_forgotten(lease)
        return response

    wrapper.csrf_exempt = True
    wrapper.openai_endpoint = True
    return wrapper


async def _release_forgotten(lease: Lease | None) -> None:
    if lease is not None and not lease.released:
        if lease.lease_id is not None:
            logger.warning("a view did not release its rate-limit lease; charging the whole "
                           "reservation of %d tokens", lease.reserved_tokens)
        await lease.release(lease.reserved_tokens)


async def _released_at_end(content, lease: Lease):
    # Close the view's generator before the safety net, so that only a lease the view never
    # released is charged in full.
    try:
        async for chunk in content:
            yield chunk
    finally:
        if hasattr(content, "aclose"):
            await content.aclose()
        await _release_forgotten(lease)
