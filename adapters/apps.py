"""The adapters app's config: startup adapters load when the default chat model is ready
(inference.operations.runtime.runtime_ready), and the servers follow the operators' ServedModel choice
(swap_watch) and their ModelSetting rows."""
from django.apps import AppConfig


class AdaptersConfig(AppConfig):
    name = "adapters"
    verbose_name = "LoRA adapters"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from inference.operations import runtime

        from .operator_choices import apply_operator_choices
        from .registry import load_startup_adapters, start_watchers_at_start

        runtime.runtime_ready.connect(load_startup_adapters, dispatch_uid="adapters.load_startup_adapters")
        runtime.runtime_starting.connect(apply_operator_choices, dispatch_uid="adapters.apply_operator_choices")
        runtime.runtime_starting.connect(start_watchers_at_start, dispatch_uid="adapters.start_watchers")
