"""URLs of the inference app: the OpenAI chat and completions surface (with stored chat completions),
embeddings, models, tokenize, health (readiness), health/live (liveness), /metrics, and what routers read
(http/worker_views.py: server and model info, KV event sources, load, health_generate, flush_cache, the render
routes)."""
from django.urls import path

from .stored import views as stored_views
from .http import views, worker_views
from .operations.metrics_view import metrics_view
from .http.api import by_method

urlpatterns = [
    path("health", views.health),
    path("metrics", metrics_view),
    path("health/live", views.health_live),
    path("get_server_info", worker_views.get_server_info),
    path("server_info", worker_views.server_info),
    path("get_model_info", worker_views.get_model_info),
    path("model_info", worker_views.get_model_info),
    path("kv_event_sources", worker_views.kv_event_sources),
    path("get_load", worker_views.get_load),
    path("health_generate", worker_views.health_generate),
    path("flush_cache", worker_views.flush_cache),
    path("v1/models", views.list_models),
    path("v1/models/<path:model_id>", views.retrieve_model),
    path("v1/chat/completions/render", worker_views.render_chat),
    path("v1/completions/render", worker_views.render_completions),
    path("v1/chat/completions", by_method(GET=stored_views.list_completions, POST=views.chat_completions)),
    path("v1/chat/completions/<str:completion_id>",
         by_method(GET=stored_views.retrieve, POST=stored_views.update, DELETE=stored_views.delete)),
    path("v1/chat/completions/<str:completion_id>/messages", by_method(GET=stored_views.list_messages)),
    path("v1/completions", views.completions),
    path("v1/embeddings", views.embeddings_view),
    path("tokenize", views.tokenize_view),
    path("detokenize", views.detokenize_view),
]

# OpenAI endpoints this server does not implement (yet): 501. metrale_site/urls.py lists these
# after every app's own routes, so an app that implements one takes precedence.
NOT_IMPLEMENTED = ["v1/moderations", "v1/audio/<path:rest>", "v1/images/<path:rest>"]
fallback_urlpatterns = [
    *[path(route, views.not_implemented) for route in NOT_IMPLEMENTED],
    path("v1/<path:rest>", views.unknown_route),
]
