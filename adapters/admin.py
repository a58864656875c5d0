"""The Adapter admin: find an adapter by name or path; load, reload or unload it on this server."""
from asgiref.sync import async_to_sync
from django.contrib import admin, messages

from inference.operations.registry import process_registry

from . import registry
from .models import Adapter, ModelSetting, ServedModel


@admin.register(Adapter)
class AdapterAdmin(admin.ModelAdmin):
    list_display = ("name", "path", "loaded", "requests_served", "error", "updated")
    list_filter = ("loaded",)
    search_fields = ("name", "path")
    filter_horizontal = ("tenants",)
    readonly_fields = ("loaded", "requests_served", "error", "created", "updated")
    actions = ("load_adapters", "reload_adapters", "unload_adapters")

    def get_queryset(self, request):
        registry.flush_all(process_registry())  # the counts shown are up to date
        return super().get_queryset(request)

    def save_related(self, request, form, formsets, change):
        super().save_related(request, form, formsets, change)
        for _, rt in process_registry().loaded_models("chat"):
            registry.refresh_allow_list(rt, form.instance)

    def _each(self, request, queryset, verb: str, act, **kwargs) -> None:
        rt = process_registry().runtime()  # adapters belong to the default chat model here
        if rt is None:
            self.message_user(request, "The default chat model is not loaded.", messages.ERROR)
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
    readonly_fields = ("state", "error", "fingerprint", "configured", "requested")

    def has_add_permission(self, request):
        return not ServedModel.objects.exists()

    def save_model(self, request, obj, form, change):
        from .swap_watch import configured_default

        obj.pk, obj.state, obj.error, obj.fingerprint = 1, "pending", "", ""
        obj.configured = configured_default()  # the swap replaces this configured default (swap_watch)
        super().save_model(request, obj, form, change)


def _registry():
    from inference.operations.registry import process_registry

    return process_registry()


@admin.register(ModelSetting)
class ModelSettingAdmin(admin.ModelAdmin):
    """Every configured model of this server, live from its registry (state, resident memory, KV pool,
    keep_alive, pinned, idle time, requests running), with load / unload / pin / unpin actions; editing a
    row sets the operators' pin and keep_alive over the configuration's (adapters/operator_choices.py)."""

    list_display = ("name", "kind", "live_state", "resident_mb", "kv_pool_mb", "keep_alive_now", "pinned_now",
                    "idle_s", "requests_running", "live_error")
    readonly_fields = ("name", "updated")
    fields = ("name", "pinned", "keep_alive", "updated")
    actions = ("load_models", "unload_models", "pin_models", "unpin_models")

    def get_queryset(self, request):
        for name in _registry().entries:  # one row per configured model (blank: as configured)
            ModelSetting.objects.get_or_create(name=name)
        return super().get_queryset(request).filter(name__in=list(_registry().entries))

    def has_add_permission(self, request):
        return False  # which models exist is the configuration's (METRALE_MODELS)

    def _state(self, obj) -> dict:
        entry = _registry().entries.get(obj.name)
        return _registry().state_of(entry) if entry is not None else {}

    @admin.display(description="kind")
    def kind(self, obj):
        return self._state(obj).get("kind")

    @admin.display(description="state")
    def live_state(self, obj):
        return self._state(obj).get("state")

    @admin.display(description="resident MB")
    def resident_mb(self, obj):
        value = self._state(obj).get("resident_bytes")
        return None if value is None else round(value / 1e6, 1)

    @admin.display(description="KV pool MB")
    def kv_pool_mb(self, obj):
        value = self._state(obj).get("kv_cache_bytes")
        return None if value is None else round(value / 1e6, 1)

    @admin.display(description="keep_alive")
    def keep_alive_now(self, obj):
        return self._state(obj).get("keep_alive")

    @admin.display(description="pinned", boolean=True)
    def pinned_now(self, obj):
        return self._state(obj).get("pinned")

    @admin.display(description="idle (s)")
    def idle_s(self, obj):
        return self._state(obj).get("idle_s")

    @admin.display(description="requests running")
    def requests_running(self, obj):
        return self._state(obj).get("requests_running")

    @admin.display(description="error")
    def live_error(self, obj):
        return self._state(obj).get("error") or ""

    def save_model(self, request, obj, form, change):
        from inference.operations.model_settings import SettingError, parse_keep_alive

        if obj.keep_alive:
            try:
                parse_keep_alive(obj.keep_alive)
            except SettingError as exc:
                self.message_user(request, f"{obj.name}: {exc}", messages.ERROR)
                return
        super().save_model(request, obj, form, change)
        from .operator_choices import apply_setting

        apply_setting(_registry(), obj)

    @admin.action(description="Load the selected models on this server")
    def load_models(self, request, queryset):
        for row in queryset:
            _registry().load(row.name)
            # "Model" first: the admin capitalises a message's first letter, and a name must stay as it is.
            self.message_user(request, f"Model {row.name}: loading.", messages.SUCCESS)

    @admin.action(description="Unload the selected models on this server (only idle ones; pinned ones too)")
    def unload_models(self, request, queryset):
        for row in queryset:
            done = _registry().unload(row.name, force=True)
            self.message_user(request, f"Model {row.name}: "
                                       f"{'unloaded' if done else 'not unloaded (not loaded, or busy)'}.",
                              messages.SUCCESS if done else messages.WARNING)

    @admin.action(description="Pin the selected models (load now, never unload)")
    def pin_models(self, request, queryset):
        for row in queryset:
            ModelSetting.objects.filter(pk=row.pk).update(pinned=True)
            _registry().pin(row.name, True)
        self.message_user(request, f"pinned {queryset.count()} model(s).", messages.SUCCESS)

    @admin.action(description="Unpin the selected models (they unload after keep_alive idle)")
    def unpin_models(self, request, queryset):
        for row in queryset:
            ModelSetting.objects.filter(pk=row.pk).update(pinned=False)
            _registry().pin(row.name, False)
        self.message_user(request, f"unpinned {queryset.count()} model(s).", messages.SUCCESS)
