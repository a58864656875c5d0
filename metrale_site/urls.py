"""Top-level URLs: the console's pages (front door, playground, the admin's dashboard), the admin, the
OpenAI-compatible API, Anthropic's Messages API, Ollama's REST API (and its probe at /) and the health checks.

The inference app's fallbacks (501 for OpenAI endpoints not implemented, 404 in
OpenAI's shape for any other /v1/* path, /v1 itself included) come last, after every
app's routes.
"""
from django.contrib import admin
from django.urls import include, path

from inference.urls import fallback_urlpatterns
from inference.http.views import unknown_route

urlpatterns = [
    # The OpenAI routes first: every request resolves through the patterns before its own, and no other
    # app's route is one of theirs.
    path("", include("inference.urls")),
    path("", include("ollama_api.urls")),  # its root probe answers clients; browsers get the console's front door
    path("", include("console.urls")),
    path("admin/", admin.site.urls),
    path("", include("responses_api.urls")),
    path("", include("batches.urls")),
    path("", include("anthropic_api.urls")),
    path("", include("adapters.urls")),
    *fallback_urlpatterns,
    # `v1/<path:rest>` needs a non-empty rest; the API's root answers in OpenAI's shape too (no redirect).
    path("v1", unknown_route),
    path("v1/", unknown_route),
]
