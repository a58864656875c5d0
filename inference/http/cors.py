"""The CORS headers of an answer made before Django's middleware runs (ApiAsgiGuard's, the drain's, daphne's 413), by django-cors-headers' own rules.

django-cors-headers' CorsMiddleware adds CORS headers to every response that passes through Django;
an answer made outside Django (metrale_site/asgi.py's LimitedRequest, middleware.ApiAsgiGuard,
metrale_site/drain.py) would otherwise carry none, and a browser app would see a network error
instead of the 413 or 503. The headers here are computed by the same middleware's
`add_response_headers`, from the same `CORS_*` settings: one set of rules for every /v1 answer.
"""
from __future__ import annotations

from collections.abc import Iterable

from corsheaders.middleware import CorsMiddleware
from django.http import HttpRequest, HttpResponse

_middleware = CorsMiddleware(lambda request: None)


def cors_headers(method: str, path: str, headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The CORS response headers (lower-case names and values as bytes: access-control-*, vary) that
    django-cors-headers would add to an answer to the request `method path` with request `headers`
    (raw (name, value) pairs, as in an ASGI scope); [] where its rules add none (a path outside
    CORS_URLS_REGEX: no headers at all; no Origin: only `vary`)."""
    request = HttpRequest()
    request.method = method.upper()
    request.path = request.path_info = path
    for name, value in headers:
        key = name.decode("latin-1").upper().replace("-", "_")
        if key not in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            key = f"HTTP_{key}"
        request.META[key] = value.decode("latin-1")
    response = HttpResponse()
    before = set(response.headers)
    _middleware.add_response_headers(request, response)
    return [(name.lower().encode("latin-1"), value.encode("latin-1"))
            for name, value in response.headers.items() if name not in before]
