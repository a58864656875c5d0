"""The API routes this server serves, read from its URL configuration, for the front door's list."""
from __future__ import annotations

import re
from dataclasses import dataclass

from inference.operations.checks import site_routes

# Views that answer routes nobody serves (501 not implemented, 404 unknown): not listed.
_FALLBACKS = {"not_implemented", "unknown_route"}
_METHOD = re.compile(r"^(GET|POST|DELETE|PUT|PATCH)\b")


@dataclass(frozen=True, slots=True)
class Route:
    """One served route: its path as a client writes it (`/v1/chat/completions/{completion_id}`)
    and the HTTP methods it takes, when the view says (empty otherwise)."""

    path: str
    methods: tuple[str, ...]


def _methods(view) -> tuple[str, ...]:
    per_method = getattr(view, "method_views", None)  # inference.http.api.by_method
    if per_method:
        return tuple(per_method)
    found = _METHOD.match((view.__doc__ or "").strip())
    return (found[1],) if found else ()


def api_routes(prefixes: tuple[str, ...] = ("v1/", "api/", "tokenize", "detokenize", "health", "metrics")
               ) -> list[Route]:
    """Every route under `prefixes` with a view that serves it, in URL-configuration order, once each."""
    seen, routes = set(), []
    for route, view in site_routes():
        route = route.lstrip("^").rstrip("$")
        if not route.startswith(prefixes) or getattr(view, "__name__", "") in _FALLBACKS:
            continue
        path = "/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route)
        if path not in seen:
            seen.add(path)
            routes.append(Route(path, _methods(view)))
    return routes
