"""URLs of the inference app: the OpenAI chat surface, models and health."""
from django.urls import path

from . import views

urlpatterns = [
    path("health", views.health),
    path("v1/models", views.list_models),
    path("v1/chat/completions", views.chat_completions),
]
