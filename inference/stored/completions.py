"""Chat completions kept with `store: true`, owned by their tenant: save, list, get, update, messages, delete.

Source: OpenAI API reference, "List Chat Completions" (filters `model` and `metadata[key]=value`;
`after`, `limit` 1-100 default 20, `order` asc by creation time by default; a list object with
first_id, last_id, has_more), "Get chat completion", "Update chat completion" (only `metadata`),
"Get chat messages" (the request's messages, each with an id, paginated the same way) and
"Delete chat completion". An id unknown to the caller's tenant is a 404 (inference.stored.objects);
a completion expires like a stored response (METRALE["STORE_TTL_S"] after it was made).
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING

from django.db import connection, models
from django.db.models.expressions import RawSQL

from ..serving.errors import bad_request, not_found
from .objects import StoredObject, cursor_page

if TYPE_CHECKING:
    from ..models import Tenant


class StoredChatCompletion(StoredObject):
    """One stored chat completion: the response body as sent, and the request's messages and metadata."""

    id = models.CharField(primary_key=True, max_length=64)
    model = models.CharField(max_length=200)
    metadata = models.JSONField(default=dict, blank=True)
    messages = models.JSONField(default=list, blank=True)
    response = models.JSONField()

    class Meta:
        app_label = "inference"
        ordering = ["-created_at"]
        verbose_name = "stored chat completion"
        indexes = [models.Index(fields=["tenant", "created_at", "id"], name="chat_tenant_created")]

    def __str__(self) -> str:
        return self.id

    def to_dict(self) -> dict:
        """The ChatCompletion object as it was returned, with the completion's current metadata."""
        return {**self.response, "metadata": self.metadata}

    def store_messages(self) -> list[dict]:
        """The request's messages as OpenAI's ChatCompletionStoreMessage objects, in order."""
        return [store_message(self.id, i, m) for i, m in enumerate(self.messages)]


def store_message(completion_id: str, index: int, message: dict) -> dict:
    """One request message as OpenAI returns it from "Get chat messages": id `<completion id>-<index>`,
    role, content as text, name, content_parts (the parts when content was an array, else None), and
    the message's tool_calls (arguments as a JSON string) or tool_call_id."""
    content = message.get("content")
    parts = content if isinstance(content, list) else None
    if parts is not None:
        content = "".join(p.get("text") or "" for p in parts if isinstance(p, dict))
    out = {"id": f"{completion_id}-{index}", "role": message.get("role"), "content": content,
           "name": message.get("name"), "content_parts": parts}
    if message.get("tool_calls"):
        out["tool_calls"] = [_wire_tool_call(c) for c in message["tool_calls"]]
    if message.get("tool_call_id"):
        out["tool_call_id"] = message["tool_call_id"]
    return out


def _wire_tool_call(call: dict) -> dict:
    fn = call.get("function") or {}
    args = fn.get("arguments", "")
    if not isinstance(args, str):  # the template-facing form keeps them parsed
        args = json.dumps(args, ensure_ascii=False)
    return {**call, "function": {**fn, "arguments": args}}


async def save_chat_completion(tenant: Tenant, request: dict, body: dict) -> None:
    """Store a chat.completion `body` as `tenant`'s (an inference.models.Tenant). `request` holds
    the request's `messages` and `metadata`. Bind the tenant with functools.partial to get the
    `save(request, body)` that serving.chat calls."""
    await StoredChatCompletion.objects.acreate(
        id=body["id"], tenant=tenant, model=body["model"], metadata=request.get("metadata") or {},
        messages=request.get("messages") or [], response=body)


def _missing(completion_id: str):
    return not_found(f"No chat completion found with id '{completion_id}'.", param="completion_id")


async def _owned(tenant: Tenant, completion_id: str) -> StoredChatCompletion:
    stored = await StoredChatCompletion.objects.owned_by(tenant).filter(pk=completion_id).afirst()
    if stored is None:
        raise _missing(completion_id)
    return stored


async def get_chat_completion(tenant: Tenant, completion_id: str) -> dict:
    """`tenant`'s stored ChatCompletion object. Raises ApiError 404 (OpenAI's shape) when it has none."""
    return (await _owned(tenant, completion_id)).to_dict()


async def update_chat_completion(tenant: Tenant, completion_id: str, metadata: dict) -> dict:
    """Replace the metadata of `tenant`'s stored completion (validated by the caller: at most 16
    pairs, keys up to 64 and values up to 512 characters) -> the ChatCompletion object. Raises
    ApiError 404 when the tenant has none with this id."""
    stored = await _owned(tenant, completion_id)
    stored.metadata = metadata
    await stored.asave(update_fields=["metadata"])
    return stored.to_dict()


async def delete_chat_completion(tenant: Tenant, completion_id: str) -> dict:
    """Delete `tenant`'s stored completion -> OpenAI's deletion object. Raises ApiError 404 when it has none."""
    deleted, _ = await StoredChatCompletion.objects.owned_by(tenant).filter(pk=completion_id).adelete()
    if not deleted:
        raise _missing(completion_id)
    return {"id": completion_id, "object": "chat.completion.deleted", "deleted": True}


async def list_chat_completions(tenant: Tenant, *, model: str | None, metadata: dict[str, str],
                                after: str | None, limit: int, order: str) -> dict:
    """A page of `tenant`'s stored completions, oldest first for order "asc" (newest for "desc"),
    made by `model` (when given) with every `metadata` pair, starting after the completion `after`.

    Returns {object: "list", data: [ChatCompletion], first_id, last_id, has_more}. Raises ApiError
    400 (param `after`) when the tenant has no completion with the id `after`.
    """
    rows = StoredChatCompletion.objects.owned_by(tenant)
    if model:
        rows = rows.filter(model=model)
    for key, value in metadata.items():
        rows = rows.filter(_has_metadata(key, value))
    if after is not None:
        anchor = await StoredChatCompletion.objects.owned_by(tenant).filter(pk=after).values(
            "created_at", "id").afirst()
        if anchor is None:
            raise bad_request(f"No chat completion with id '{after}' to list after.", "after")
        later = "gt" if order == "asc" else "lt"
        rows = rows.filter(models.Q(**{f"created_at__{later}": anchor["created_at"]})
                           | models.Q(created_at=anchor["created_at"], **{f"id__{later}": anchor["id"]}))
    keys = ("created_at", "id") if order == "asc" else ("-created_at", "-id")
    page = [row.to_dict() async for row in rows.order_by(*keys)[:limit + 1]]
    return cursor_page(page, limit)


async def list_chat_messages(tenant: Tenant, completion_id: str, *, after: str | None, limit: int,
                             order: str) -> dict:
    """A page of the messages of `tenant`'s stored completion (ChatCompletionStoreMessage objects),
    in request order for "asc", starting after the message id `after`. Raises ApiError 404 when the
    tenant has no such completion, 400 (param `after`) for a message id not in it."""
    messages = (await _owned(tenant, completion_id)).store_messages()
    if order == "desc":
        messages.reverse()
    if after is not None:
        ids = [m["id"] for m in messages]
        if after not in ids:
            raise bad_request(f"No message with id '{after}' in this chat completion.", "after")
        messages = messages[ids.index(after) + 1:]
    return cursor_page(messages[:limit + 1], limit)


def _has_metadata(key: str, value: str):
    """A filter expression: the completion's metadata holds `key` with the string `value`."""
    if connection.vendor == "sqlite":
        # SQLite's JSON paths cannot name a key that holds '"', so look the pair up among the entries.
        table = connection.ops.quote_name(StoredChatCompletion._meta.db_table)
        return RawSQL(f"EXISTS (SELECT 1 FROM json_each({table}.metadata) WHERE key = %s AND value = %s)",
                      (key, value), output_field=models.BooleanField())
    return models.Q(metadata__contains={key: value})


def purge_expired(now) -> int:
    """Delete the stored completions past their expires_at (synchronous ORM). Returns how many."""
    deleted, _ = StoredChatCompletion.objects.expired(now).delete()
    return deleted
