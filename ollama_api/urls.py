"""URLs of Ollama's REST API (every one answers in Ollama's error shape) and its probe at the site's root."""
from django.urls import path

from . import model_views, views

urlpatterns = [
    # Before the console's front door (metrale_site/urls.py): a browser still gets that page.
    path("", views.root),
    path("api/chat", views.chat),
    path("api/generate", views.generate),
    path("api/embed", views.embed),
    path("api/embeddings", views.embeddings_view),
    path("api/tags", model_views.tags),
    path("api/show", model_views.show),
    path("api/ps", model_views.ps),
    path("api/version", model_views.version),
    path("api/pull", model_views.pull),
    path("api/delete", model_views.delete),
    path("api/copy", model_views.copy),
    path("api/create", views.not_implemented),
    path("api/push", views.not_implemented),
    path("api/blobs/<str:digest>", views.not_implemented),
    path("api", views.unknown_route),
    path("api/", views.unknown_route),
    path("api/<path:rest>", views.unknown_route),
]
