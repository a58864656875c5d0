"""App config for the Responses API."""
from django.apps import AppConfig


class ResponsesApiConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "responses_api"
    verbose_name = "Responses and conversations"

    def ready(self):
        # Connecting a receiver loads nothing; the work runs when the runtime starts.
        from inference.operations.heartbeat import process_beat
        from inference.operations.runtime import runtime_starting

        from .housekeeping import on_process_beat, on_runtime_starting

        runtime_starting.connect(on_runtime_starting, dispatch_uid="responses_api.housekeeping")
        process_beat.connect(on_process_beat, dispatch_uid="responses_api.housekeeping")
