"""URLs of the inference app: the OpenAI chat and completions surface (with stored chat completions),
models, tokenize, and health (readiness) and health/live (liveness)."""
from django.urls import path

from . import stored_views, views
from .api import by_method

urlpatterns = [
    path("health", views.health),
    path("health/live", views.health_live),
    path("v1/models", views.list_models),
    path("v1/models/<path:model_id>", views.retrieve_model),
    path("v1/chat/completions", by_method(GET=stored_views.list_completions, POST=views.chat_completions)),
    path("v1/chat/completions/<str:completion_id>",
         by_method(GET=stored_views.retrieve, POST=stored_views.update, DELETE=stored_views.delete)),
    path("v1/chat/completions/<str:completion_id>/messages", by_method(GET=stored_views.list_messages)),
    path("v1/completions", views.completions),
    path("tokenize", views.tokenize_view),
    path("detokenize", views.detokenize_view),
]

# OpenAI endpoints this server does not implement (yet): 501. metrale_site/urls.py lists these
# after every app's own routes, so an app that implements one takes precedence.
NOT_IMPLEMENTED = ["v1/embeddings", "v1/moderations", "v1/audio/<path:rest>", "v1/images/<path:rest>",
                   "v1/batches", "v1/batches/<path:rest>", "v1/files", "v1/files/<path:rest>"]
fallback_urlpatterns = [
    *[path(route, views.not_implemented) for route in NOT_IMPLEMENTED],
    path("v1/<path:rest>", views.unknown_route),
]
