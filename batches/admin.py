"""Admin of files, batches and each tenant's batch usage per day (read-only: clients make them)."""
from django.contrib import admin

from inference.admin import StoredObjectAdmin

from .models import Batch, BatchUsage, StoredFile


@admin.register(StoredFile)
class StoredFileAdmin(StoredObjectAdmin):
    list_display = ("id", "tenant", "filename", "purpose", "bytes", "created_at", "expires_at")
    list_filter = ("tenant", "purpose")
    search_fields = ("id", "filename", "tenant__name")
    readonly_fields = ("id", "tenant", "filename", "purpose", "bytes", "content", "created_at")


@admin.register(Batch)
class BatchAdmin(StoredObjectAdmin):
    list_display = ("id", "tenant", "endpoint", "status", "total", "completed", "failed", "input_tokens",
                    "output_tokens", "worker", "created_at")
    list_filter = ("tenant", "status", "endpoint")
    search_fields = ("id", "input_file_id", "tenant__name")
    readonly_fields = [f.name for f in Batch._meta.fields if f.name != "expires_at"]


@admin.register(BatchUsage)
class BatchUsageAdmin(admin.ModelAdmin):
    list_display = ("tenant", "day", "requests", "input_tokens", "output_tokens", "total_tokens")
    list_filter = ("tenant", "day")
    search_fields = ("tenant__name",)
    readonly_fields = ("tenant", "day", "requests", "input_tokens", "output_tokens")

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
