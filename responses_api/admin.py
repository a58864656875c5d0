"""Admin for stored responses and conversations: newest first, filter by tenant, model and
status, search by id, metadata and tenant name, the item transcript inline. Read-only except delete,
which cascades to items and events."""

from __future__ import annotations

import json

from django.contrib import admin

from inference.admin import StoredObjectAdmin, json_column

from .models import Conversation, ConversationItem, ResponseItem, StoredResponse


def transcript_line(data: dict) -> str:
    """One item as a line of transcript: `role: text`, `call name(arguments)`, `output: ...`."""
    kind = data.get("type")
    if kind == "message":
        text = "".join(p.get("text") or p.get("refusal") or "" for p in data.get("content", []))
        return f"{data.get('role')}: {text}"
    if kind == "function_call":
        return f"call {data.get('name')}({data.get('arguments')}) [{data.get('call_id')}]"
    if kind == "function_call_output":
        return f"output [{data.get('call_id')}]: {data.get('output')}"
    if kind == "reasoning":
        return "reasoning: " + "".join(s.get("text", "") for s in data.get("summary", []))
    return json.dumps(data, ensure_ascii=False)


class _ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False
    show_change_link = False
    fields = ("position", "type", "item_id", "text")
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False

    @admin.display(description="transcript")
    def text(self, item):
        return transcript_line(item.data)


class ResponseItemInline(_ReadOnlyInline):
    model = ResponseItem
    fields = ("position", "direction", "type", "item_id", "text")
    readonly_fields = fields


class ConversationItemInline(_ReadOnlyInline):
    model = ConversationItem


@admin.register(StoredResponse)
class StoredResponseAdmin(StoredObjectAdmin):
    list_display = ("id", "created_at", "tenant", "model", "status", "usage")
    list_filter = ("status", "model", "tenant", "background")
    list_max_show_all = 1000
    inlines = (ResponseItemInline,)
    fields = ("id", "tenant", "model", "status", "background", "streamed",
              "previous_response", "conversation", "created_at", "completed_at", "expires_at",
              "worker", "usage", "error_text", "metadata_text", "request_text", "body_text")
    readonly_fields = fields

    @admin.display(description="usage")
    def usage(self, obj):
        return f"{obj.input_tokens} in, {obj.output_tokens} out" \
            if obj.input_tokens is not None else "-"

    error_text = json_column("error", "error")
    metadata_text = json_column("metadata", "metadata")
    request_text = json_column("request", "request")
    body_text = json_column("body", "response body")


@admin.register(Conversation)
class ConversationAdmin(StoredObjectAdmin):
    list_display = ("id", "created_at", "updated_at", "tenant")
    list_filter = ("tenant",)
    inlines = (ConversationItemInline,)
    fields = ("id", "tenant", "created_at", "updated_at", "expires_at", "metadata_text")
    readonly_fields = fields

    metadata_text = json_column("metadata", "metadata")
