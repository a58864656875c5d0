"""The Adapter admin: find an adapter by name or path; load, reload or unload it on this server."""
from asgiref.sync import async_to_sync
from django.contrib import admin, messages

from inference.operations import runtime

from . import registry
from .models import Adapter, ServedModel


@admin.register(Adapter)
class AdapterAdmin(admin.ModelAdmin):
    list_display = ("name", "path", "loaded", "requests_served", "error", "updated")
    list_filter = ("loaded",)
    search_fields = ("name", "path")
    filter_horizontal = ("tenants",)
    readonly_fields = ("loaded", "requests_served", "error", "created", "updated")
    actions = ("load_adapters", "reload_adapters", "unload_adapters")

    def get_queryset(self, request):
        registry.flush_served(runtime.get_runtime(wait=False))  # the counts shown are up to date
        return super().get_queryset(request)

    def save_related(self, request, form, formsets, change):
        super().save_related(request, form, formsets, change)
        registry.refresh_allow_list(runtime.get_runtime(wait=False), form.instance)

    def _each(self, request, queryset, verb: str, act, **kwargs) -> None:
        rt = runtime.get_runtime(wait=False)
        if rt is None:
            self.message_user(request, "The model is not loaded yet.", messages.ERROR)
            return
        for row in queryset:
            try:
                async_to_sync(act)(rt, row.name, *([row.path] if act is registry.load else []), **kwargs)
            except registry.AdapterRefused as refusal:
                self.message_user(request, f"{row.name}: {refusal}", messages.ERROR)
            else:
                self.message_user(request, f"{row.name}: {verb}.", messages.SUCCESS)

    @admin.action(description="Load the selected adapters on this server")
    def load_adapters(self, request, queryset):
        self._each(request, queryset, "loaded", registry.load)

    @admin.action(description="Reload the selected adapters from their folders (in-flight requests finish first)")
    def reload_adapters(self, request, queryset):
        self._each(request, queryset, "reloaded", registry.load, replace=True)

    @admin.action(description="Unload the selected adapters (in-flight requests finish first)")
    def unload_adapters(self, request, queryset):
        self._each(request, queryset, "unloaded", registry.unload)


@admin.register(ServedModel)
class ServedModelAdmin(admin.ModelAdmin):
    """Editing the folder or name is the swap: every server sharing the database follows it
    (adapters.swap_watch) and reports its state here."""

    list_display = ("name", "path", "state", "fingerprint", "requested")
    readonly_fields = ("state", "error", "fingerprint", "requested")

    def has_add_permission(self, request):
        return not ServedModel.objects.exists()

    def save_model(self, request, obj, form, change):
        obj.pk, obj.state, obj.error, obj.fingerprint = 1, "pending", "", ""
        super().save_model(request, obj, form, change)
