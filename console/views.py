"""The console's pages: the front door and the playground (templates/console/). They call nothing but the
public API from the browser; the server only says which model it serves and how to reach it."""
from __future__ import annotations

from django.conf import settings
from django.shortcuts import render
from django.views.decorators.http import require_safe

from inference.operations import runtime
from inference.tenancy.auth import staff_session_user

from .routes import api_routes


def _model_state() -> dict:
    state, error = runtime.status()
    return {"model": runtime.served_model_name(), "state": state, "error": error}


@require_safe
async def front_door(request):
    """GET /: the served model and its state, the API routes, copy-paste openai / anthropic / curl
    examples for the address this page was reached at, and links to the playground, admin and /metrics."""
    routes = api_routes()
    base_url = request.build_absolute_uri("/").rstrip("/")
    return render(request, "console/index.html", {
        **_model_state(), "routes": routes, "base_url": base_url,
        "has_messages": any(r.path == "/v1/messages" for r in routes),
        "has_metrics": any(r.path == "/metrics" for r in routes),
        "require_auth": settings.METRALE["REQUIRE_AUTH"],
    })


@require_safe
async def playground(request):
    """GET /playground: chat with the served model through /v1/chat/completions (static/console/
    playground.js). A staff user's admin session is the credential (the operators' tenant); anyone
    else enters an API key when the server requires one."""
    staff = await staff_session_user(request)
    return render(request, "console/playground.html", {
        **_model_state(), "staff": staff is not None,
        "needs_key": settings.METRALE["REQUIRE_AUTH"] and staff is None,
    })
