"""Tenant-scoped ORM work of the Files and Batch APIs (synchronous; views run it with sync_to_async).

Every lookup starts from `owned_by(tenant)` (inference/stored/objects.py), so another tenant's
id is a 404. Status changes are conditional UPDATEs (`transition`), so the API's cancel and a
runner's progress never overwrite each other, and each `<status>_at` is set once, on entry.
"""
from __future__ import annotations

from datetime import timedelta

from django.core.files.base import ContentFile
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from inference.serving.errors import ApiError, not_found
from inference.stored.objects import cursor_page

from .models import ENTERED_AT, Batch, BatchResult, BatchUsage, Purpose, Status, StoredFile, new_id

COMPLETION_WINDOW = timedelta(hours=24)


def _file_not_found(file_id: str, param: str | None = None) -> ApiError:
    return not_found(f"No such File object: {file_id}", code="file_not_found", param=param)


def create_file(tenant, upload, filename: str, purpose: str, expires_after_s: int | None) -> StoredFile:
    """Store an uploaded file (a Django File: an UploadedFile, kept on disk while received) under
    a new `file-...` id. expires_after_s: seconds from now (None: METRALE["STORE_TTL_S"])."""
    now = timezone.now()
    row = StoredFile(id=new_id("file"), tenant=tenant, filename=filename, purpose=purpose, bytes=upload.size,
                     created_at=now,
                     expires_at=now + timedelta(seconds=expires_after_s) if expires_after_s else None)
    row.content.save(row.id, upload, save=False)
    try:
        row.save(force_insert=True)
    except BaseException:
        row.content.delete(save=False)
        raise
    return row


def create_output_file(tenant, filename: str, data: bytes, expires_after_s: int | None) -> StoredFile:
    """A batch's output or error file (purpose batch_output) holding `data`."""
    return create_file(tenant, ContentFile(data), filename, Purpose.BATCH_OUTPUT, expires_after_s)


def get_file(tenant, file_id: str, param: str | None = None) -> StoredFile:
    """The tenant's file. Raises ApiError 404 file_not_found (another tenant's id too)."""
    row = StoredFile.objects.owned_by(tenant).filter(pk=file_id).first()
    if row is None:
        raise _file_not_found(file_id, param)
    return row


def list_files(tenant, *, purpose: str | None, after: str | None, limit: int, order: str) -> dict:
    """A page of the tenant's files, newest first unless order is "asc"; `after` a file id."""
    rows = StoredFile.objects.owned_by(tenant)
    if purpose:
        rows = rows.filter(purpose=purpose)
    rows = _after(rows, StoredFile, tenant, after, descending=order != "asc")
    rows = rows.order_by(*(("created_at", "id") if order == "asc" else ("-created_at", "-id")))
    return cursor_page([r.to_dict() for r in rows[:limit + 1]], limit)


def delete_file(tenant, file_id: str) -> dict:
    """Delete the tenant's file and its content. Raises ApiError 404."""
    row = get_file(tenant, file_id)
    row.delete()
    row.content.delete(save=False)
    return {"id": file_id, "object": "file", "deleted": True}


def _after(rows, model, tenant, after: str | None, *, descending: bool):
    """`rows` past the object `after` in (created_at, id) order (OpenAI's cursor); an unknown
    cursor leaves nothing."""
    if not after:
        return rows
    cursor = model.objects.owned_by(tenant).filter(pk=after).values_list("created_at", "id").first()
    if cursor is None:
        return rows.none()
    at, pk = cursor
    if descending:
        return rows.filter(Q(created_at__lt=at) | Q(created_at=at, id__lt=pk))
    return rows.filter(Q(created_at__gt=at) | Q(created_at=at, id__gt=pk))


def create_batch(tenant, *, input_file_id: str, endpoint: str, metadata: dict | None,
                 output_expires_after_s: int | None) -> Batch:
    """A new batch in `validating`. Raises ApiError 404 for an unknown input file, 400 for one
    whose purpose is not batch."""
    source = get_file(tenant, input_file_id, param="input_file_id")
    if source.purpose != Purpose.BATCH:
        raise ApiError(400, f"The file {input_file_id} has purpose '{source.purpose}'; a batch's input file "
                            "must have purpose 'batch'.", param="input_file_id", code="invalid_input_file")
    now = timezone.now()
    return Batch.objects.create(id=new_id("batch"), tenant=tenant, endpoint=endpoint, input_file_id=input_file_id,
                                metadata=metadata, created_at=now, deadline_at=now + COMPLETION_WINDOW,
                                output_expires_after_s=output_expires_after_s)


def get_batch(tenant, batch_id: str) -> Batch:
    """The tenant's batch. Raises ApiError 404 batch_not_found."""
    row = Batch.objects.owned_by(tenant).filter(pk=batch_id).first()
    if row is None:
        raise not_found(f"No such Batch object: {batch_id}", code="batch_not_found")
    return row


def list_batches(tenant, *, after: str | None, limit: int) -> dict:
    """A page of the tenant's batches, newest first."""
    rows = _after(Batch.objects.owned_by(tenant), Batch, tenant, after, descending=True)
    return cursor_page([r.to_dict() for r in rows.order_by("-created_at", "-id")[:limit + 1]], limit)


def transition(batch_id: str, to: Status, *, only_from: tuple[Status, ...], **fields) -> bool:
    """Move the batch to `to` (setting its `<to>_at` now, and `fields`) if its status is one of
    `only_from`; whether it moved."""
    values = dict(fields, status=to)
    if to in ENTERED_AT:
        values[ENTERED_AT[to]] = timezone.now()
    return bool(Batch.objects.filter(pk=batch_id, status__in=only_from).update(**values))


def cancel_batch(tenant, batch_id: str) -> Batch:
    """Ask the tenant's batch to stop: `cancelling` now; its runner ends it `cancelled` with the
    lines finished so far. A batch already cancelling is answered as it is. Raises ApiError 404,
    and 400 batch_not_cancellable for a batch that has ended."""
    batch = get_batch(tenant, batch_id)
    if not transition(batch.id, Status.CANCELLING, only_from=(Status.VALIDATING, Status.IN_PROGRESS)):
        batch.refresh_from_db()
        if batch.status != Status.CANCELLING:
            raise ApiError(400, f"Batch {batch_id} is {batch.status}; only a validating or in-progress batch "
                                "can be cancelled.", code="batch_not_cancellable")
    batch.refresh_from_db()
    return batch


def record_result(batch: Batch, custom_id: str, line: int, failed: bool, data: str, usage) -> bool:
    """Write one finished line once: its result row, the batch's counts and usage, and the
    tenant's daily batch usage, in one transaction. usage: serving.deltas.Usage or None. Returns
    False (and changes nothing) when the line was written already."""
    with transaction.atomic():
        _, created = BatchResult.objects.get_or_create(batch=batch, custom_id=custom_id,
                                                       defaults={"line": line, "failed": failed, "data": data})
        if not created:
            return False
        prompt = usage.prompt_tokens if usage else 0
        completion = usage.completion_tokens if usage else 0
        Batch.objects.filter(pk=batch.pk).update(
            failed=F("failed") + int(failed), completed=F("completed") + int(not failed),
            input_tokens=F("input_tokens") + prompt, output_tokens=F("output_tokens") + completion,
            cached_tokens=F("cached_tokens") + (usage.cached_prompt_tokens if usage else 0),
            reasoning_tokens=F("reasoning_tokens") + (usage.reasoning_tokens if usage else 0))
        if usage:
            day = timezone.now().date()
            row, _ = BatchUsage.objects.get_or_create(tenant_id=batch.tenant_id, day=day)
            BatchUsage.objects.filter(pk=row.pk).update(requests=F("requests") + 1,
                                                        input_tokens=F("input_tokens") + prompt,
                                                        output_tokens=F("output_tokens") + completion)
    return True


def tokens_used_today(tenant_id: int) -> int:
    """The tenant's batch tokens (prompt + completion) so far this UTC day."""
    row = BatchUsage.objects.filter(tenant_id=tenant_id, day=timezone.now().date()).first()
    return row.total_tokens if row else 0


def done_custom_ids(batch_id: str) -> set[str]:
    """custom_ids of the batch's lines already written."""
    return set(BatchResult.objects.filter(batch_id=batch_id).values_list("custom_id", flat=True))


def write_files(batch: Batch) -> dict:
    """Assemble the output and error files from the written lines (input order); a file that
    would be empty is not made (its id stays null). Returns the batch fields to set."""
    fields = {}
    for failed, name, key in ((False, "output", "output_file_id"), (True, "error", "error_file_id")):
        if getattr(batch, key):
            continue  # made before a restart
        lines = list(BatchResult.objects.filter(batch=batch, failed=failed).order_by("line")
                     .values_list("data", flat=True))
        if lines:
            data = ("\n".join(lines) + "\n").encode()
            made = create_output_file(batch.tenant, f"{batch.id}_{name}.jsonl", data, batch.output_expires_after_s)
            Batch.objects.filter(pk=batch.pk).update(**{key: made.id})
            fields[key] = made.id
    return fields


def expired_files(now) -> int:
    """Delete files past their expires_at, with their content; how many."""
    count = 0
    for row in StoredFile.objects.expired(now):
        row.delete()
        row.content.delete(save=False)
        count += 1
    return count


ACTIVE = (Status.VALIDATING, Status.IN_PROGRESS, Status.FINALIZING, Status.CANCELLING)
