"""URLs of the inference app: the OpenAI chat and completions surface, models, tokenize and health."""
from django.urls import path

from . import views

urlpatterns = [
    path("health", views.health),
    path("v1/models", views.list_models),
    path("v1/models/<path:model_id>", views.retrieve_model),
    path("v1/chat/completions", views.chat_completions),
    path("v1/chat/completions/<str:completion_id>", views.stored_chat_completion),
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
