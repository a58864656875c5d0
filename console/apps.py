"""App config of the console pages. No models, so no migrations."""
from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "console"
    verbose_name = "Console"
