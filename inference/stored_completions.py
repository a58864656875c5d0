"""Chat completions kept with `store: true`, read back by GET /v1/chat/completions/{id}.

Source: OpenAI API reference, "Get chat completion" (returns the ChatCompletion
object; an unknown id is a 404) and "Delete chat completion".
"""
from __future__ import annotations

from django.db import models

from .serving.errors import not_found


class StoredChatCompletion(models.Model):
    """One stored chat completion: the response body as sent, and the request's messages and metadata."""

    id = models.CharField(primary_key=True, max_length=64)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    model = models.CharField(max_length=200)
    metadata = models.JSONField(default=dict, blank=True)
    messages = models.JSONField(default=list, blank=True)
    response = models.JSONField()

    class Meta:
        app_label = "inference"
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.id

    def to_dict(self) -> dict:
        """The ChatCompletion object as it was returned, with the request's metadata."""
        return {**self.response, "metadata": self.metadata}


async def save_chat_completion(request: dict, body: dict) -> None:
    """Store a chat.completion `body`; `request` holds the request's messages and metadata."""
    await StoredChatCompletion.objects.acreate(
        id=body["id"], model=body["model"], metadata=request.get("metadata") or {},
        messages=request.get("messages") or [], response=body)


def _missing(completion_id: str):
    return not_found(f"No chat completion found with id '{completion_id}'.", param="completion_id")


async def get_chat_completion(completion_id: str) -> dict:
    """The stored ChatCompletion object. Raises ApiError 404 (OpenAI's shape) when there is none."""
    stored = await StoredChatCompletion.objects.filter(pk=completion_id).afirst()
    if stored is None:
        raise _missing(completion_id)
    return stored.to_dict()


async def delete_chat_completion(completion_id: str) -> dict:
    """Delete a stored completion -> OpenAI's deletion object. Raises ApiError 404 when there is none."""
    deleted, _ = await StoredChatCompletion.objects.filter(pk=completion_id).adelete()
    if not deleted:
        raise _missing(completion_id)
    return {"id": completion_id, "object": "chat.completion.deleted", "deleted": True}
