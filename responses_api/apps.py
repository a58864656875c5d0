"""App config for the Responses API."""
from django.apps import AppConfig


class ResponsesApiConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "responses_api"
    verbose_name = "Responses and conversations"
