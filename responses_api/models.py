"""Stored responses (with their items and stream events) and conversations (with their items).

Each belongs to its tenant and expires `METRALE["STORE_TTL_S"]` seconds after it was created
(responses) or last written (conversations): see inference.stored.objects, and
store.purge_expired.
Source for the shapes: OpenAI API reference, "Responses" and "Conversations".
"""

from __future__ import annotations

import secrets

from django.db import models
from django.utils import timezone

from inference.stored.objects import StoredObject, expiry_from


def new_id(prefix: str) -> str:
    """A fresh object id in OpenAI's style: `<prefix>_` and 48 hex digits (e.g. `resp_…`)."""
    return f"{prefix}_{secrets.token_hex(24)}"


class Status(models.TextChoices):
    """A Response's status (OpenAI's `ResponseStatus`)."""

    QUEUED = "queued"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    INCOMPLETE = "incomplete"
    FAILED = "failed"
    CANCELLED = "cancelled"


UNFINISHED = (Status.QUEUED, Status.IN_PROGRESS)


class StoredResponse(StoredObject):
    """One response created with `store: true` (the default).

    `body` is the Response object as last sent (final once the status is terminal); `status`,
    `error` and `usage` columns are authoritative and make the admin list cheap to filter.
    `request` keeps the validated request parameters (the input itself is in ResponseItem).
    `worker` names the process generating an unfinished response (host:pid), and `updated_at`
    is its heartbeat; both serve the restart rule in store.fail_unfinished.
    """

    id = models.CharField(primary_key=True, max_length=64, editable=False)
    model = models.CharField(max_length=200)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.IN_PROGRESS)
    background = models.BooleanField(default=False)
    streamed = models.BooleanField(default=False, help_text="Its events are kept for replay.")
    previous_response = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="continuations")
    conversation = models.ForeignKey(
        "Conversation", null=True, blank=True, on_delete=models.SET_NULL, related_name="responses")
    request = models.JSONField(default=dict, blank=True)
    body = models.JSONField(default=dict, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    error = models.JSONField(null=True, blank=True)
    input_tokens = models.PositiveIntegerField(null=True, blank=True)
    output_tokens = models.PositiveIntegerField(null=True, blank=True)
    worker = models.CharField(max_length=200, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "stored response"
        indexes = [
            models.Index(fields=["tenant", "-created_at"], name="resp_tenant_created"),
            models.Index(fields=["status", "background"], name="resp_status_bg"),
        ]

    def __str__(self):
        return self.id

    @property
    def finished(self) -> bool:
        return self.status not in UNFINISHED

    def to_dict(self) -> dict:
        """The Response object (status and error from the columns, which a cancel or a restart
        may have changed after the body was written)."""
        body = dict(self.body)
        body["status"] = self.status
        if self.error is not None:
            body["error"] = self.error
        return body


class ResponseItem(models.Model):
    """One input or output item of a stored response, in order (inputs first)."""

    INPUT = "input"
    OUTPUT = "output"

    response = models.ForeignKey(StoredResponse, on_delete=models.CASCADE, related_name="items")
    position = models.PositiveIntegerField()
    direction = models.CharField(max_length=6, choices=[(INPUT, "input"), (OUTPUT, "output")])
    item_id = models.CharField(max_length=100, db_index=True)
    type = models.CharField(max_length=40)
    data = models.JSONField()

    class Meta:
        ordering = ["response", "position"]
        constraints = [models.UniqueConstraint(fields=["response", "position"],
                                               name="resp_item_position")]

    def __str__(self):
        return f"{self.direction} {self.position}: {self.type}"


class ResponseEvent(models.Model):
    """One streaming event of a streamed or background response, kept for replay and resume.

    `data` is the event exactly as sent (it includes `type` and `sequence_number`).
    """

    response = models.ForeignKey(StoredResponse, on_delete=models.CASCADE, related_name="events")
    sequence_number = models.PositiveIntegerField()
    type = models.CharField(max_length=60)
    data = models.JSONField()

    class Meta:
        ordering = ["response", "sequence_number"]
        constraints = [models.UniqueConstraint(fields=["response", "sequence_number"],
                                               name="resp_event_seq")]

    def __str__(self):
        return f"{self.sequence_number}: {self.type}"


class Conversation(StoredObject):
    """A conversation: ordered items that responses created with `conversation` read and extend."""

    id = models.CharField(primary_key=True, max_length=64, editable=False)
    metadata = models.JSONField(default=dict, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["tenant", "-created_at"], name="conv_tenant_created")]

    def __str__(self):
        return self.id

    def save(self, *args, **kwargs):
        self.expires_at = expiry_from(timezone.now())
        super().save(*args, **kwargs)

    def to_dict(self) -> dict:
        """OpenAI's Conversation object."""
        return {"id": self.id, "object": "conversation",
                "created_at": int(self.created_at.timestamp()), "metadata": self.metadata or {}}


class ConversationItem(models.Model):
    """One item of a conversation, in order. `data` is the item as the API returns it."""

    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="items")
    position = models.PositiveIntegerField()
    item_id = models.CharField(max_length=100)
    type = models.CharField(max_length=40)
    data = models.JSONField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["conversation", "position"]
        constraints = [
            models.UniqueConstraint(fields=["conversation", "position"], name="conv_item_position"),
            models.UniqueConstraint(fields=["conversation", "item_id"], name="conv_item_id"),
        ]

    def __str__(self):
        return f"{self.position}: {self.type}"
