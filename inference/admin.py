"""The operators' console: tenants with their keys, keys (revocable), rate limits with live usage,
stored chat completions, the request log."""
import json

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import mark_safe

from .models import ApiKey, RateLimitContext, RequestLogEntry, ServerProcess, StoredChatCompletion, Tenant
from .tenancy.ratelimiting.headers import format_duration
from .tenancy.ratelimiting.buckets import seconds_until


def json_column(field: str, description: str):
    """A read-only admin field showing the model's JSON field `field` indented, wrapped and
    HTML-escaped ("-" when it is null)."""

    @admin.display(description=description)
    def show(self, obj):
        value = getattr(obj, field)
        if value is None:
            return "-"
        return format_html("<pre style='white-space: pre-wrap'>{}</pre>",
                           json.dumps(value, indent=2, ensure_ascii=False))
    return show


class StoredObjectAdmin(admin.ModelAdmin):
    """The admin of what clients stored through the API (inference.stored.objects.StoredObject):
    newest first, searched by id, metadata and tenant name (subclasses filter by tenant too); it can
    be read and deleted, never made or edited here (the API wrote it; it is the record)."""

    list_select_related = ("tenant",)
    search_fields = ("id", "metadata", "tenant__name")
    date_hierarchy = "created_at"
    ordering = ("-created_at",)
    list_per_page = 100
    show_full_result_count = False

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    @admin.display(description=mark_safe('<input type="checkbox" id="action-toggle">'))
    def action_checkbox(self, obj):
        # The same markup as Django's, without a form widget and its template per row: that
        # render was half the time of a 1000-row list.
        return format_html('<input type="checkbox" name="{}" value="{}" class="action-select" '
                           'aria-label="Select this object for an action - {}">',
                           ACTION_CHECKBOX_NAME, obj.pk, obj)


def _announce_new_key(request, key: ApiKey) -> None:
    if key.new_key:
        messages.success(request, f"New API key for {key.tenant} ({key.name or 'unnamed'}): "
                                  f"{key.new_key} — copy it now; it is not shown again.")


class ApiKeyInline(admin.TabularInline):
    model = ApiKey
    fields = ("name", "prefix", "created", "last_used", "expires_at", "is_admin", "revoked")
    readonly_fields = ("prefix", "created", "last_used")
    extra = 0
    show_change_link = True


class RateLimitContextInline(admin.StackedInline):
    model = RateLimitContext
    extra = 0
    fields = ("api_key", ("requests_per_minute", "burst_requests"),
              ("tokens_per_minute", "burst_tokens"),
              ("max_concurrent_requests", "max_tokens_per_request"))

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name == "api_key":
            tenant_id = request.resolver_match.kwargs.get("object_id")
            kwargs["queryset"] = ApiKey.objects.filter(tenant_id=tenant_id)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ("name", "active", "created", "key_count")
    list_filter = ("active", "created")
    search_fields = ("name", "api_keys__prefix", "api_keys__name")
    readonly_fields = ("created",)
    inlines = [ApiKeyInline, RateLimitContextInline]

    @admin.display(description="keys")
    def key_count(self, tenant):
        return tenant.api_keys.filter(revoked=False).count()

    def save_formset(self, request, form, formset, change):
        super().save_formset(request, form, formset, change)
        if formset.model is ApiKey:
            for key in formset.new_objects:
                _announce_new_key(request, key)


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("prefix", "name", "tenant", "is_admin", "created", "last_used", "expires_at", "revoked")
    list_filter = ("revoked", "is_admin", "tenant", "created", "expires_at")
    search_fields = ("prefix", "name", "tenant__name")
    readonly_fields = ("prefix", "created", "last_used", "revoked_at")
    fields = ("tenant", "name", "prefix", "is_admin", "expires_at", "revoked", "revoked_at", "created",
              "last_used")
    actions = ["revoke"]

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        _announce_new_key(request, obj)

    @admin.action(description="Revoke selected API keys")
    def revoke(self, request, queryset):
        count = queryset.filter(revoked=False).update(revoked=True, revoked_at=timezone.now())
        self.message_user(request, f"Revoked {count} key(s).", messages.SUCCESS)


@admin.register(RateLimitContext)
class RateLimitContextAdmin(admin.ModelAdmin):
    list_display = ("__str__", "requests_per_minute", "requests_remaining", "tokens_per_minute",
                    "tokens_remaining", "max_concurrent_requests", "in_flight", "resets_in",
                    "denials_last_hour")
    list_filter = ("tenant__active", "tenant", ("api_key", admin.EmptyFieldListFilter))
    search_fields = ("tenant__name", "api_key__prefix", "api_key__name")
    autocomplete_fields = ("tenant", "api_key")
    readonly_fields = ("updated", "live_usage")

    def _usage(self, context):
        # One cache read per row, shared by the row's live columns.
        if not hasattr(context, "_admin_usage"):
            context._admin_usage = context.usage()
        return context._admin_usage

    @admin.display(description="requests left")
    def requests_remaining(self, context):
        level = self._usage(context).snapshot.requests
        return "unlimited" if level is None else int(max(0, level))

    @admin.display(description="tokens left")
    def tokens_remaining(self, context):
        level = self._usage(context).snapshot.tokens
        return "unlimited" if level is None else int(max(0, level))

    @admin.display(description="in flight")
    def in_flight(self, context):
        return self._usage(context).snapshot.in_flight

    @admin.display(description="full again in")
    def resets_in(self, context):
        snapshot, limits = self._usage(context).snapshot, context.limits()
        waits = [seconds_until(level, cap, rate) for level, cap, rate in (
            (snapshot.requests, limits.request_capacity, limits.request_rate_s),
            (snapshot.tokens, limits.token_capacity, limits.token_rate_s)) if level is not None]
        return format_duration(max(waits, default=0))

    @admin.display(description="denials (1 h)")
    def denials_last_hour(self, context):
        return self._usage(context).denials_last_hour

    @admin.display(description="live usage")
    def live_usage(self, context):
        if context.pk is None:
            return "-"
        return (f"requests left {self.requests_remaining(context)}, tokens left "
                f"{self.tokens_remaining(context)}, in flight {self.in_flight(context)}, full "
                f"again in {self.resets_in(context)}, denials in the last hour "
                f"{self.denials_last_hour(context)}")


@admin.register(StoredChatCompletion)
class StoredChatCompletionAdmin(StoredObjectAdmin):
    list_display = ("id", "created_at", "tenant", "model", "expires_at")
    list_filter = ("tenant", "model")
    fields = ("id", "tenant", "model", "created_at", "expires_at", "metadata_text", "messages_text",
              "response_text")
    readonly_fields = fields

    metadata_text = json_column("metadata", "metadata")
    messages_text = json_column("messages", "request messages")
    response_text = json_column("response", "chat completion")


@admin.register(ServerProcess)
class ServerProcessAdmin(admin.ModelAdmin):
    """Server processes and their heartbeats (read-only: the processes write them)."""

    list_display = ("id", "host", "pid", "started_at", "last_beat_at", "stopped_at")
    list_filter = ("host", ("stopped_at", admin.EmptyFieldListFilter))
    search_fields = ("id", "host")
    readonly_fields = ("id", "host", "pid", "pid_namespace", "started_at", "last_beat_at",
                       "stopped_at")

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(RequestLogEntry)
class RequestLogEntryAdmin(admin.ModelAdmin):
    """Every replica's API requests (METRALE_REQUEST_LOG_DB), newest first, filtered by tenant,
    route, status and finish reason; read-only (the writer thread records them). No bodies."""

    list_display = ("ts", "request_id", "tenant", "route", "method", "status", "model", "prompt_tokens",
                    "completion_tokens", "cached_tokens", "ttft_ms", "e2e_ms", "finish_reason", "replica")
    list_filter = ("tenant", "route", "status", "finish_reason", "replica")
    search_fields = ("request_id", "tenant", "route")
    date_hierarchy = "ts"
    list_per_page = 100
    show_full_result_count = False
    readonly_fields = list_display

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
