"""App config for Anthropic's Messages API."""
from django.apps import AppConfig


class AnthropicApiConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "anthropic_api"
    verbose_name = "Anthropic Messages API"
