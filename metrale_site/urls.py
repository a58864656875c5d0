"""Top-level URLs: the admin, the OpenAI-compatible API and the health check."""
from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("inference.urls")),
    path("", include("responses_api.urls")),
]
