"""Thin async views of the Files and Batch APIs: parse, scope to the tenant, call the store, answer JSON or the file's bytes.

Source: OpenAI API reference, "Files" and "Batch". Every view is an openai_endpoint (auth,
limits, errors); another tenant's id is a 404 (inference.stored.objects).
"""
from __future__ import annotations

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import transaction
from django.http import FileResponse, JsonResponse
from django.http.multipartparser import MultiPartParserError

from inference.http.api import openai_endpoint
from inference.serving.errors import ApiError, bad_request
from inference.serving.prepare import cpu_work
from inference.serving.protocol import validate
from inference.stored.objects import tenant_of

from . import execution, protocol, store


def db(fn, *args, **kwargs):
    """Run a store function on Django's thread for synchronous ORM work."""
    return sync_to_async(fn)(*args, **kwargs)


def _form(request):
    """The multipart form (fields, files), parsed by Django's upload handlers: a file over
    FILE_UPLOAD_MAX_MEMORY_SIZE is written to a temporary file as it is read, never held whole."""
    if request.content_type != "multipart/form-data":
        raise bad_request("Upload a file as multipart/form-data with the parts 'file' and 'purpose'.", "file")
    try:
        return request.POST, request.FILES
    except MultiPartParserError as exc:
        raise bad_request(f"The multipart body cannot be parsed: {exc}.", "file") from exc


@openai_endpoint
async def create_file(request):
    """POST /v1/files: multipart `file` (with a filename) and `purpose` (batch); optional
    expires_after[anchor] / expires_after[seconds]. Answers the FileObject; 413 for a file over
    METRALE["MAX_FILE_BYTES"]."""
    fields, files = await sync_to_async(_form, thread_sensitive=False)(request)
    purpose = protocol.check_purpose(fields.get("purpose"))
    upload = files.get("file")
    if upload is None or not upload.name:
        raise bad_request("'file' is required: a multipart part named 'file' with a filename.", "file")
    limit = settings.METRALE["MAX_FILE_BYTES"]
    if upload.size > limit:
        raise ApiError(413, f"The file is {upload.size} bytes; this server accepts files of at most {limit} "
                            "bytes.", param="file", code="file_too_large")
    expiry = protocol.expires_after_s(fields.get("expires_after[anchor]"), fields.get("expires_after[seconds]"),
                                      "expires_after")
    row = await db(store.create_file, tenant_of(request), upload, upload.name[:255], purpose, expiry)
    return JsonResponse(row.to_dict())


@openai_endpoint
async def list_files(request):
    """GET /v1/files: the tenant's files (purpose, after, limit, order)."""
    q = validate(protocol.FileListQuery, request.GET.dict())
    return JsonResponse(await db(store.list_files, tenant_of(request), purpose=q["purpose"], after=q["after"],
                                 limit=q["limit"], order=q["order"]))


@openai_endpoint
async def retrieve_file(request, file_id: str):
    """GET /v1/files/{id}: the FileObject."""
    return JsonResponse((await db(store.get_file, tenant_of(request), file_id)).to_dict())


@openai_endpoint
async def delete_file(request, file_id: str):
    """DELETE /v1/files/{id}: {id, object: file, deleted: true}."""
    return JsonResponse(await db(store.delete_file, tenant_of(request), file_id))


def _open(row):
    return row.content.open("rb")


@openai_endpoint
async def file_content(request, file_id: str):
    """GET /v1/files/{id}/content: the file's bytes (application/octet-stream), streamed from storage."""
    row = await db(store.get_file, tenant_of(request), file_id)
    handle = await db(_open, row)
    return FileResponse(handle, content_type="application/octet-stream", as_attachment=False,
                        filename=row.filename)


@openai_endpoint
async def create_batch(request):
    """POST /v1/batches: a new batch (status validating), started on a runner."""
    req = await cpu_work(protocol.parse_create_batch, request.body)
    batch = await db(_create_and_dispatch, tenant_of(request), req)
    return JsonResponse(batch.to_dict())


def _create_and_dispatch(tenant, req):
    with transaction.atomic():
        batch = store.create_batch(tenant, input_file_id=req["input_file_id"], endpoint=req["endpoint"],
                                   metadata=req["metadata"], output_expires_after_s=req["output_expires_after"])
        execution.dispatch(batch.id)
    return batch


@openai_endpoint
async def list_batches(request):
    """GET /v1/batches: the tenant's batches, newest first (after, limit)."""
    q = validate(protocol.BatchListQuery, request.GET.dict())
    return JsonResponse(await db(store.list_batches, tenant_of(request), after=q["after"], limit=q["limit"]))


@openai_endpoint
async def retrieve_batch(request, batch_id: str):
    """GET /v1/batches/{id}: the Batch object."""
    return JsonResponse((await db(store.get_batch, tenant_of(request), batch_id)).to_dict())


@openai_endpoint
async def cancel_batch(request, batch_id: str):
    """POST /v1/batches/{id}/cancel: the batch, now cancelling (400 once it has ended)."""
    return JsonResponse((await db(store.cancel_batch, tenant_of(request), batch_id)).to_dict())
