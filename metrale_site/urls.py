"""Top-level URLs: the admin, the OpenAI-compatible API and the health check.

The inference app's fallbacks (501 for OpenAI endpoints not implemented, 404 in
OpenAI's shape for any other /v1/* path) come last, after every app's routes.
"""
from django.contrib import admin
from django.urls import include, path

from inference.urls import fallback_urlpatterns

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("inference.urls")),
    path("", include("responses_api.urls")),
    *fallback_urlpatterns,
]
