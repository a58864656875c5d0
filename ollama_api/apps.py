"""App config for Ollama's REST API (/api/*)."""
from django.apps import AppConfig


class OllamaApiConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "ollama_api"
    verbose_name = "Ollama REST API"
