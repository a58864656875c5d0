"""Stored files, batches, each batch line's result, and each tenant's batch usage per day.

Source: OpenAI API reference, "Files" (FileObject) and "Batch" (the Batch object, its
status machine and request_counts); ../shared/reference/contracts-next.md section 2.
A file and a batch are StoredObjects (inference/stored/objects.py): owned by one tenant,
expiring. A batch's results are written one line at a time, keyed by (batch, custom_id), so a
batch picked up again after its worker died never runs or writes a line twice.
"""
from __future__ import annotations

import secrets
from datetime import datetime

from django.core.files.storage import storages
from django.db import models

from inference.stored.objects import StoredObject


def files_storage():
    """The storage uploaded and output files live in (settings.STORAGES["files"])."""
    return storages["files"]


def new_id(prefix: str) -> str:
    """An id in OpenAI's style: `file-<24 hex>`, `batch_<32 hex>`, `batch_req_<32 hex>`."""
    return f"{prefix}-{secrets.token_hex(12)}" if prefix == "file" else f"{prefix}_{secrets.token_hex(16)}"


def unix(moment: datetime | None) -> int | None:
    """Integer Unix seconds (OpenAI's timestamps), None for None."""
    return int(moment.timestamp()) if moment is not None else None


class Purpose(models.TextChoices):
    BATCH = "batch"
    BATCH_OUTPUT = "batch_output"


class StoredFile(StoredObject):
    """An uploaded file (purpose batch) or a batch's output or error file (purpose batch_output).
    `content` names it in the files storage; `bytes` is its size."""

    id = models.CharField(primary_key=True, max_length=40, editable=False)
    filename = models.CharField(max_length=255)
    purpose = models.CharField(max_length=32, choices=Purpose.choices)
    bytes = models.BigIntegerField()
    content = models.FileField(storage=files_storage, max_length=255)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = "file"

    def __str__(self):
        return self.id

    def to_dict(self) -> dict:
        """The FileObject."""
        return {"id": self.id, "object": "file", "bytes": self.bytes, "created_at": unix(self.created_at),
                "filename": self.filename, "purpose": self.purpose, "status": "processed",
                "expires_at": unix(self.expires_at), "status_details": None}


class Status(models.TextChoices):
    """A batch's status (OpenAI's Batch.status)."""

    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


TERMINAL = (Status.FAILED, Status.COMPLETED, Status.EXPIRED, Status.CANCELLED)
# Each status's `<status>_at` field, set once when the batch enters it.
ENTERED_AT = {Status.IN_PROGRESS: "in_progress_at", Status.FINALIZING: "finalizing_at",
              Status.COMPLETED: "completed_at", Status.FAILED: "failed_at", Status.EXPIRED: "expired_at",
              Status.CANCELLING: "cancelling_at", Status.CANCELLED: "cancelled_at"}


class Batch(StoredObject):
    """One batch: its input file, endpoint, status (with the time it entered each), counts,
    summed usage, output and error files, and the process that runs it (`worker`, a
    heartbeat.ServerProcess id; another process takes it over only once that one is gone), and with
    a broker when it was sent to the queue (`queued_at`; None while it was not: the broker was
    unreachable, so batches/execution.hand_on_orphans sends it again).
    `deadline_at` is the Batch object's `expires_at` (created + the 24 h completion window);
    StoredObject.expires_at is when the stored row is purged."""

    id = models.CharField(primary_key=True, max_length=64, editable=False)
    endpoint = models.CharField(max_length=64)
    input_file_id = models.CharField(max_length=40)
    completion_window = models.CharField(max_length=8, default="24h")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.VALIDATING, db_index=True)
    metadata = models.JSONField(null=True, blank=True)
    model = models.CharField(max_length=200, blank=True)
    errors = models.JSONField(null=True, blank=True, help_text="Line-level validation errors.")
    output_file_id = models.CharField(max_length=40, null=True, blank=True)
    error_file_id = models.CharField(max_length=40, null=True, blank=True)
    total = models.PositiveIntegerField(default=0)
    completed = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    input_tokens = models.BigIntegerField(default=0)
    cached_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)
    reasoning_tokens = models.BigIntegerField(default=0)
    deadline_at = models.DateTimeField()
    output_expires_after_s = models.PositiveIntegerField(null=True, blank=True)
    in_progress_at = models.DateTimeField(null=True, blank=True)
    finalizing_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    expired_at = models.DateTimeField(null=True, blank=True)
    cancelling_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    worker = models.CharField(max_length=200, null=True, blank=True,
                              help_text="The server or worker process running it.")
    queued_at = models.DateTimeField(null=True, blank=True,
                                     help_text="When it was last sent to the broker's queue (with a broker; "
                                               "empty: not sent yet, the next heartbeat sends it).")

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "batches"

    def __str__(self):
        return self.id

    def to_dict(self) -> dict:
        """The Batch object with every field OpenAI documents."""
        total_tokens = self.input_tokens + self.output_tokens
        return {
            "id": self.id, "object": "batch", "endpoint": self.endpoint,
            "errors": {"object": "list", "data": self.errors} if self.errors else None,
            "input_file_id": self.input_file_id, "completion_window": self.completion_window,
            "status": self.status, "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id, "created_at": unix(self.created_at),
            "in_progress_at": unix(self.in_progress_at), "expires_at": unix(self.deadline_at),
            "finalizing_at": unix(self.finalizing_at), "completed_at": unix(self.completed_at),
            "failed_at": unix(self.failed_at), "expired_at": unix(self.expired_at),
            "cancelling_at": unix(self.cancelling_at), "cancelled_at": unix(self.cancelled_at),
            "request_counts": {"total": self.total, "completed": self.completed, "failed": self.failed},
            "metadata": self.metadata, "model": self.model or None,
            "usage": {"input_tokens": self.input_tokens,
                      "input_tokens_details": {"cached_tokens": self.cached_tokens},
                      "output_tokens": self.output_tokens,
                      "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
                      "total_tokens": total_tokens},
        }


class BatchResult(models.Model):
    """One finished line of a batch: its output-file line (`failed`: it goes to the error file
    instead), written once (unique per batch and custom_id)."""

    batch = models.ForeignKey(Batch, on_delete=models.CASCADE, related_name="results")
    custom_id = models.CharField(max_length=512)
    line = models.PositiveIntegerField(help_text="1-based line number in the input file.")
    failed = models.BooleanField(default=False)
    data = models.TextField(help_text="The JSON line written to the output or error file.")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["batch", "custom_id"], name="batch_result_once")]
        ordering = ["batch", "line"]


class BatchUsage(models.Model):
    """One tenant's batch tokens on one UTC day: recorded per line, never charged to the
    interactive rate limits; METRALE["BATCH_TOKENS_PER_DAY"] caps it."""

    tenant = models.ForeignKey("inference.Tenant", on_delete=models.CASCADE, related_name="batch_usage")
    day = models.DateField()
    requests = models.PositiveIntegerField(default=0)
    input_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "day"], name="batch_usage_per_day")]
        ordering = ["-day"]
        verbose_name_plural = "batch usage"

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens
