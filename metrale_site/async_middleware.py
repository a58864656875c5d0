"""Django's own middlewares (security, sessions, common, CSRF, auth, messages, clickjacking) with their
hooks run on the event loop where they only compute.

Under ASGI, Django's MiddlewareMixin runs every hook of a sync middleware through
`sync_to_async(thread_sensitive=True)`: a hop to the request's own worker thread (a new thread per
request, asgiref's ThreadSensitiveContext) and back, twice per middleware. These seven middlewares
cost a request about a dozen hops, most of the time an API call spends in Django: 32 clients got 132
answers a second from /health/live through them and 332 without them (2 vCPUs). The hooks below
are the same Django code; each runs inline where Django's code does no I/O for that request, and
through the thread as before where it may reach the database:

- the session is saved (SessionMiddleware.process_response, when modified or saved on every request);
- a CSRF token is checked on an unsafe method of a view that is not exempt (process_view may parse the
  body), or kept in the session (CSRF_USE_SESSIONS);
- messages were read or added (MessageMiddleware.process_response stores them).

Everything else (headers, redirects, the lazy user, a session store that loads only when read) is
pure computation. The system checks that look for Django's middlewares accept these subclasses.

The four that serve a browser's session (sessions, CSRF, auth, messages) step aside for an API request that
carries no session cookie (passes_by): an API call authenticates by its key, and without the cookie the
session is empty, the user anonymous, no CSRF check applies (the API's views are exempt; a staff session's
check, auth.csrf_refusal, needs a session) and no message is stored. Their hooks cost an API request about
0.2 ms of the event loop's CPU (in-process, 2 vCPUs; the messages store alone made a signed-cookie Signer a
request, 4% of the loop's samples under one-token chat completions). With the cookie, every API request goes
through all of them, so a staff session's calls are authenticated and CSRF-checked as before.
"""
from __future__ import annotations

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.middleware import AuthenticationMiddleware
from django.contrib.messages.middleware import MessageMiddleware
from django.contrib.sessions.middleware import SessionMiddleware
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.common import CommonMiddleware
from django.middleware.csrf import CsrfViewMiddleware
from django.middleware.security import SecurityMiddleware

from inference.http.middleware import is_api_path

SAFE_METHODS = ("GET", "HEAD", "OPTIONS", "TRACE")  # CsrfViewMiddleware.process_view's (RFC 9110)


def passes_by(request) -> bool:
    """Whether the session middlewares (InlineHooks.session_only) step aside for `request`: an API path
    (inference.http.middleware.is_api_path) whose request has no session cookie
    (settings.SESSION_COOKIE_NAME). Decided once a request (kept on it)."""
    decided = request.__dict__.get("_passes_session_stack")
    if decided is None:
        decided = is_api_path(request.path) and settings.SESSION_COOKIE_NAME not in request.COOKIES
        request._passes_session_stack = decided
    return decided


class InlineHooks:
    """Mixed in before a Django MiddlewareMixin subclass: its async __acall__ runs process_request and
    process_response inline unless request_needs_thread / response_needs_thread say the hook may do
    I/O for this request (then through sync_to_async as MiddlewareMixin does). A middleware with
    `session_only` set is not run at all for a request it passes_by."""

    session_only = False

    def request_needs_thread(self, request) -> bool:
        return False

    def response_needs_thread(self, request, response) -> bool:
        return False

    async def __acall__(self, request):
        if self.session_only and passes_by(request):
            return await self.get_response(request)
        response = None
        if hasattr(self, "process_request"):
            if self.request_needs_thread(request):
                response = await sync_to_async(self.process_request, thread_sensitive=True)(request)
            else:
                response = self.process_request(request)
        response = response or await self.get_response(request)
        if hasattr(self, "process_response"):
            if self.response_needs_thread(request, response):
                response = await sync_to_async(self.process_response, thread_sensitive=True)(request, response)
            else:
                response = self.process_response(request, response)
        return response


class AsyncSecurityMiddleware(InlineHooks, SecurityMiddleware):
    """SecurityMiddleware: an HTTPS redirect and response headers (no I/O)."""


class AsyncSessionMiddleware(InlineHooks, SessionMiddleware):
    """SessionMiddleware: the store is made without reading it; the response hook saves it (I/O) only
    when it was modified or every request is saved."""

    session_only = True

    def response_needs_thread(self, request, response) -> bool:
        session = getattr(request, "session", None)
        return session is not None and (session.modified or settings.SESSION_SAVE_EVERY_REQUEST)


class AsyncCommonMiddleware(InlineHooks, CommonMiddleware):
    """CommonMiddleware: user-agent refusals, slash and www redirects (URL resolution, no I/O)."""


class AsyncCsrfViewMiddleware(InlineHooks, CsrfViewMiddleware):
    """CsrfViewMiddleware: the token from its cookie and the cookie set (no I/O unless
    CSRF_USE_SESSIONS); the check of an unsafe method on a view that is not exempt reads the body,
    in the thread."""

    session_only = True

    def request_needs_thread(self, request) -> bool:
        return settings.CSRF_USE_SESSIONS

    def response_needs_thread(self, request, response) -> bool:
        return settings.CSRF_USE_SESSIONS

    async def process_view(self, request, callback, callback_args, callback_kwargs):
        if self.session_only and passes_by(request):
            return None
        check = super().process_view
        if (getattr(callback, "csrf_exempt", False) or request.method in SAFE_METHODS) and not settings.CSRF_USE_SESSIONS:
            return check(request, callback, callback_args, callback_kwargs)
        return await sync_to_async(check, thread_sensitive=True)(request, callback, callback_args, callback_kwargs)


class AsyncAuthenticationMiddleware(InlineHooks, AuthenticationMiddleware):
    """AuthenticationMiddleware: request.user and request.auser, both lazy (no I/O until read)."""

    session_only = True


class AsyncMessageMiddleware(InlineHooks, MessageMiddleware):
    """MessageMiddleware: the storage is made without reading it; the response hook stores messages
    (a cookie, or the session: I/O) only when they were read or added."""

    session_only = True

    def response_needs_thread(self, request, response) -> bool:
        storage = getattr(request, "_messages", None)
        return storage is not None and (storage.used or storage.added_new)


class AsyncXFrameOptionsMiddleware(InlineHooks, XFrameOptionsMiddleware):
    """XFrameOptionsMiddleware: a response header (no I/O)."""

