"""URLs of Anthropic's Messages API (every one answers in Anthropic's error shape)."""
from django.urls import path

from . import views

urlpatterns = [
    path("v1/messages", views.messages),
    path("v1/messages/count_tokens", views.count_tokens),
    path("v1/messages/<path:rest>", views.unknown_route),
]
