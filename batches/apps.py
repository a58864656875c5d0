"""The batches app's configuration: it takes over orphaned batches after every heartbeat."""
from django.apps import AppConfig


class BatchesConfig(AppConfig):
    name = "batches"
    verbose_name = "Files and batches"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from inference.operations import heartbeat, runtime

        from . import housekeeping

        runtime.runtime_starting.connect(housekeeping.on_runtime_starting, dispatch_uid="batches-start")
        heartbeat.process_beat.connect(housekeeping.on_process_beat, dispatch_uid="batches-beat")
