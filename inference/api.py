"""`openai_endpoint`: the one wrapper every /v1/* (and /tokenize, /detokenize) view goes through.

It authenticates (request.principal), admits the request through the rate limiter, turns any
ApiError into OpenAI's error JSON, adds the x-ratelimit-* headers, and exempts the view from
CSRF (callers authenticate with a bearer key, not a cookie).

Non-generating views get one request debited before they run. Generating views
(`@openai_endpoint(generates=True)`) call `admit(request, reserve_tokens=...)` once they know the
prompt's size, and release the lease themselves when generation ends (for a stream: in the
`finally` of its async generator); if a view forgets, the wrapper releases it (charging the
whole reservation) so no concurrency slot leaks. When Django closes a streamed response the
wrapper also closes the view's generator, so its `finally` runs at once even when the client
left while the server was blocked sending (see _LeasedStream).

Responses that end before an identity is known (401) carry no x-ratelimit-* headers: there is
no budget to describe.
"""
from __future__ import annotations

import asyncio
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
                response.streaming_content = _LeasedStream(response, lease)
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


class _LeasedStream:
    """A generating view's stream body that is sure to end its lease.

    Django closes a streaming response when sending stops, also when the client left while the
    server was blocked in `send`; the view's generator is then merely dropped, and its `finally`
    (which releases the lease with the real usage and aborts generation) would wait for the
    garbage collector. Django calls `close()` here (any body with a `close` gets called), which
    schedules on the event loop: close the view's generator, then charge in full a lease it
    never released."""

    def __init__(self, response: StreamingHttpResponse, lease: Lease):
        # The view's own iterator, not Django's wrapper around it: only closing that one runs
        # the view's `finally`.
        self._content = getattr(response, "_iterator", None) or response.streaming_content
        self._lease = lease
        self._loop = asyncio.get_running_loop()

    def __aiter__(self):
        return self._content.__aiter__()

    def close(self) -> None:
        """Called by Django, from a worker thread, when the response is closed. Does not wait:
        the view's cleanup may itself need that thread (thread-sensitive ORM calls)."""
        if not self._loop.is_closed():
            asyncio.run_coroutine_threadsafe(self._finish(), self._loop)

    async def _finish(self) -> None:
        if hasattr(self._content, "aclose"):
            try:
                await self._content.aclose()
            except RuntimeError:  # already being closed (by cancellation): it releases itself
                pass
        await _release_forgotten(self._lease)
