"""The adapters app's config: startup adapters load when the runtime is ready
(inference.operations.runtime.runtime_ready), and the servers serve the operators' ServedModel choice
(runtime.model_choice, swap_watch)."""
from django.apps import AppConfig


class AdaptersConfig(AppConfig):
    name = "adapters"
    verbose_name = "LoRA adapters"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from inference.operations import runtime

        from . import swap_watch
        from .registry import load_startup_adapters

        runtime.runtime_ready.connect(load_startup_adapters, dispatch_uid="adapters.load_startup_adapters")
        runtime.model_choice = swap_watch.chosen_model
