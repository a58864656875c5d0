"""App config for the inference app. Loads nothing: the engine starts with the server."""
from django.apps import AppConfig


class InferenceConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "inference"
    verbose_name = "Inference"

    def ready(self):
        from .operations import checks  # noqa: F401  (registers the system checks)
        from .tenancy import recent

        recent.connect()
