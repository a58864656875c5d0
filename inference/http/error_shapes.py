"""Which error shape a path answers in: the `error_shape` of the view its URL resolves to (OpenAI's by default).

The shape is a property of the route (its view, set by `api.openai_endpoint(error_shape=...)`),
so every layer that answers before or around the view (middleware.ApiAsgiGuard, daphne's body
limit in metrale_site/asgi.py, the drain gate, ApiRequestMiddleware's 500) words its error the
way the view itself would.
"""
from __future__ import annotations

from django.urls import Resolver404, resolve

from ..serving.errors import OPENAI, ErrorShape


def shape_of_view(view) -> ErrorShape:
    """The error shape a view answers in (OPENAI when it declares none)."""
    return getattr(view, "error_shape", OPENAI)


def shape_for_path(path: str) -> ErrorShape:
    """The error shape of the route `path` resolves to; OPENAI for a path no route matches or
    that cannot be resolved (not text, no leading '/')."""
    if not isinstance(path, str) or not path.startswith("/"):
        return OPENAI
    try:
        return shape_of_view(resolve(path).func)
    except Resolver404:
        return OPENAI
    except Exception:  # the guards answer whatever the path; a path the resolver chokes on is nobody's route
        return OPENAI
