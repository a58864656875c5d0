"""`openai_endpoint`: the one wrapper every /v1/* (and /tokenize, /detokenize) view goes through.

It authenticates (request.principal), admits the request through the rate limiter, turns any
ApiError into the route's error JSON (`error_shape`: OpenAI's by default, Anthropic's for the
Messages routes; serving/errors.ErrorShape), adds the x-ratelimit-* headers (and on Anthropic's routes
the anthropic-ratelimit-* ones beside them, named by the shape), and exempts the view from
CSRF (callers authenticate with a bearer key, not a cookie).

Non-generating views get one request debited before they run, but those a router calls on a client's
behalf just before routing that client's request (`@openai_endpoint(debits=False)`: the render
routes, http/worker_views.py), which are authenticated and never debited. Generating views
(`@openai_endpoint(generates=True)`) call `admit(request, reserve_tokens=..., used_tokens=...)`
once they know the prompt's size; that gives the request a GenerationLease, the one owner of its
rate-limit lease, which this wrapper settles with the tokens really used when the response is
done: at once for a blocking answer or an error, when the body ends or is closed for a stream
(also when the client left while the server was blocked sending; see _SettledStream). A
background task takes the lease over with `hand_off()` and settles it when it ends.

Responses that end before an identity is known (401) carry no x-ratelimit-* headers: there is
no budget to describe.

`operator_endpoint` is the wrapper of operator routes (/metrics when METRALE_METRICS_AUTH is on,
adapter loading, model swap): only an admin key or a staff session (auth.authenticate_operator),
no rate limit, errors in OpenAI's shape; the view finds its caller in `request.operator`.

`by_method(GET=view, POST=view, ...)` gives one URL a view per HTTP method, each of them an
openai_endpoint view, and answers other methods with a 405 (and Allow) in their error shape.
"""
from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable

from django.http import JsonResponse, StreamingHttpResponse

from ..tenancy.auth import authenticate, authenticate_operator
from ..tenancy.ratelimit import Lease, RateLimited, acquire, current_headers, debit_request
from .request_context import note_tenant
from ..serving.errors import OPENAI, ApiError, ErrorShape

# The name it logged under before inference/ was grouped (log filters select it).
logger = logging.getLogger("inference.api")


def error_response(error: ApiError, shape: ErrorShape = OPENAI, request_id: str | None = None) -> JsonResponse:
    """An ApiError as an HTTP response in `shape` (OpenAI's error body by default): its status
    (as the shape sends it) and its headers."""
    status, body = shape.of(error, request_id)
    return JsonResponse(body, status=status, headers=error.headers)


class GenerationLease:
    """The one owner of a generating request's rate-limit lease (inference.tenancy.ratelimit.Lease).

    `settle()` ends it, exactly once, charging `used_tokens()` (prompt + completion tokens really
    processed, however the request ended: finished, error, client gone, cancelled) and freeing
    the concurrency slot; it is the only place a lease is released. Whoever holds the request
    calls it: openai_endpoint for a blocking answer, an error or a stream's end, or the task a
    request was handed off to (`hand_off`, for background work).
    """

    def __init__(self, lease: Lease, used_tokens: Callable[[], int]):
        self.lease = lease
        self.used_tokens = used_tokens
        self.handed_off = False

    def hand_off(self) -> GenerationLease:
        """The caller (a background task) settles this lease from now on; the endpoint leaves it."""
        self.handed_off = True
        return self

    async def settle(self) -> None:
        """Charge the tokens used and free the slot (idempotent; shielded from cancellation by
        Lease.release)."""
        try:
            used = self.used_tokens()
        except Exception:  # a broken counter must not leak the slot: charge the reservation
            logger.exception("counting a request's tokens failed; charging its whole reservation")
            used = self.lease.reserved_tokens
        await self.lease.release(used)


async def admit(request, *, reserve_tokens: int, used_tokens: Callable[[], int],
                timeout_s: float | None = None) -> GenerationLease:
    """Inside an `@openai_endpoint(generates=True)` view: take a lease for a generating request
    reserving `reserve_tokens` tokens (prompt tokens + max_tokens). used_tokens: a callable that
    gives the tokens processed so far (read when the lease is settled). timeout_s: the request's
    own deadline in seconds, if it sets one. Raises ApiError 429/400 (the wrapper answers it).
    The wrapper settles the lease (see GenerationLease)."""
    lease = await acquire(request.principal, reserve_tokens=reserve_tokens, timeout_s=timeout_s)
    request.ratelimit_lease = lease
    request.generation_lease = GenerationLease(lease, used_tokens)
    return request.generation_lease


def openai_endpoint(view=None, *, generates: bool = False, debits: bool = True, error_shape: ErrorShape = OPENAI):
    """Wrap an async view as an API endpoint (see the module docstring).

    generates=False: one request is debited before the view runs (models, tokenize, stored
    objects), unless debits=False (a router's probe for the request it routes). generates=True: the
    view calls `admit` itself. error_shape: how the route words
    its errors (serving/errors.OPENAI, ANTHROPIC or OLLAMA); every layer reads it from the view
    (inference.http.error_shapes)."""
    if view is None:
        return functools.partial(openai_endpoint, generates=generates, debits=debits, error_shape=error_shape)

    @functools.wraps(view)
    async def wrapper(request, *args, **kwargs):
        request.principal = None
        request.ratelimit_lease = None
        request.generation_lease = None
        request.model_holds = []
        refused = None
        try:
            request.principal = await authenticate(request)
            note_tenant(request.principal.tenant.name)
            if not generates and debits:
                request.ratelimit_lease = await debit_request(request.principal)
            response = await view(request, *args, **kwargs)
        except ApiError as error:
            refused = error if isinstance(error, RateLimited) else None
            response = error_response(error, error_shape, getattr(request, "request_id", None))
        except BaseException:
            await _settle(request)
            release_models(request)
            raise
        lease = request.ratelimit_lease
        principal = request.principal
        if refused is not None:  # a 429: the budget it was refused at
            headers = refused.provider_headers(error_shape.name)
        elif lease is not None:
            headers = lease.headers(error_shape.name)
        elif principal is not None:  # answered before `admit` (e.g. a 400)
            headers = await current_headers(principal, error_shape.name)
        else:  # no identity (401): no budget to describe
            headers = {}
        for name, value in headers.items():
            response.headers.setdefault(name, value)
        owner = request.generation_lease
        if isinstance(response, StreamingHttpResponse) and response.is_async and (
                request.model_holds or (owner is not None and not owner.handed_off)):
            response.streaming_content = _SettledStream(response, owner if owner is not None and not owner.handed_off
                                                        else None, request)
        else:
            if owner is not None and not owner.handed_off:
                await owner.settle()
            release_models(request)
        return response

    wrapper.csrf_exempt = True
    wrapper.openai_endpoint = True
    wrapper.error_shape = error_shape
    return wrapper


def release_models(request) -> None:
    """Release the request's holds on its models (views.ready_model took them): from now on the registry
    may unload them once idle (operations/registry.py)."""
    holds, request.model_holds = getattr(request, "model_holds", None) or [], []
    for hold in holds:
        hold.release()


async def _settle(request) -> None:
    owner = getattr(request, "generation_lease", None)
    if owner is not None and not owner.handed_off:
        await owner.settle()


class _SettledStream:
    """A generating view's stream body whose lease is settled (and its models' holds released) when the
    body ends, however it ends.

    Django closes a streaming response when sending stops, also when the client left while the
    server was blocked in `send`; the view's generator is then merely dropped, and its `finally`
    (which aborts generation) would wait for the garbage collector. Django calls `close()` here
    (any body with a `close` gets called), which schedules on the event loop: close the view's
    generator, then settle the lease with the tokens used."""

    def __init__(self, response: StreamingHttpResponse, owner: GenerationLease | None, request=None):
        # The view's own iterator, not Django's wrapper around it: only closing that one runs
        # the view's `finally`.
        self._content = getattr(response, "_iterator", None) or response.streaming_content
        self._owner = owner
        self._request = request
        self._loop = asyncio.get_running_loop()

    async def __aiter__(self):
        try:
            async for chunk in self._content:
                yield chunk
        finally:
            await self._finish()

    def close(self) -> None:
        """Called by Django, from a worker thread, when the response is closed. Does not wait:
        the view's cleanup may itself need that thread (thread-sensitive ORM calls)."""
        if not self._loop.is_closed():
            asyncio.run_coroutine_threadsafe(self._finish(), self._loop)

    async def _finish(self) -> None:
        if hasattr(self._content, "aclose"):
            try:
                await self._content.aclose()
            except RuntimeError:  # already being closed (by cancellation)
                pass
        if self._owner is not None:
            await self._owner.settle()
        if self._request is not None:
            release_models(self._request)


def operator_endpoint(view):
    """Wrap an async view as an operator route (see the module docstring): the caller must be an
    admin key or a staff user's session (auth.authenticate_operator: 401 without either, 403 for
    a key that is not an admin key or a session call failing CSRF); `request.operator` is the
    auth.Operator; an ApiError raised by the view is answered in OpenAI's error shape. Marked
    `operator_endpoint` (system check metrale.W002 accepts it under /v1)."""

    @functools.wraps(view)
    async def wrapper(request, *args, **kwargs):
        try:
            request.operator = await authenticate_operator(request)
            return await view(request, *args, **kwargs)
        except ApiError as error:
            return error_response(error)

    # Bearer calls carry no cookie to forge; session calls are CSRF-checked by authenticate_operator.
    wrapper.csrf_exempt = True
    wrapper.operator_endpoint = True
    return wrapper


def by_method(**views):
    """One URL's view that hands each HTTP method (GET=..., POST=..., DELETE=...) to its own view (HEAD to GET's,
    RFC 9110 9.3.2); another method is a 405 in the views' error shape with an Allow header.

    Each view must itself be an openai_endpoint view (auth, rate limits, errors), and so is the 405:
    the dispatcher is marked `openai_endpoint` (what system check metrale.W002 reads) only when every
    view it dispatches to is, so a method view that skips the wrapper is still caught.
    """
    allowed = ", ".join(views)
    shapes = {getattr(v, "error_shape", OPENAI) for v in views.values()}
    shape = shapes.pop() if len(shapes) == 1 else OPENAI

    @openai_endpoint(error_shape=shape)
    async def not_allowed(request, *args, **kwargs):
        raise ApiError(405, f"{request.method} is not allowed on {request.path}; use {' or '.join(views)}.",
                       code="method_not_allowed", headers={"Allow": allowed})

    async def dispatch(request, *args, **kwargs):
        method = "GET" if request.method == "HEAD" else request.method
        return await views.get(method, not_allowed)(request, *args, **kwargs)

    dispatch.openai_endpoint = all(getattr(v, "openai_endpoint", False) or getattr(v, "operator_endpoint", False)
                                   for v in views.values())
    dispatch.csrf_exempt = all(getattr(v, "csrf_exempt", False) for v in views.values())
    dispatch.error_shape = shape
    dispatch.method_views = views
    dispatch.__doc__ = " ".join(f"{method}: {v.__doc__}" for method, v in views.items())
    return dispatch
