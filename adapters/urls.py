"""URLs of the adapters app: vLLM's runtime LoRA routes."""
from django.urls import path

from . import views

urlpatterns = [
    path("v1/load_lora_adapter", views.load_lora_adapter),
    path("v1/unload_lora_adapter", views.unload_lora_adapter),
]
