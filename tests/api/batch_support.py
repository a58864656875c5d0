"""Helpers of the Files and Batch API tests: files stored in a temporary folder, uploads, batches run in-process."""
from __future__ import annotations

import asyncio
import json

from django.core.files.uploadedfile import SimpleUploadedFile


def jsonl(*rows) -> bytes:
    """Input-file bytes: each row a dict (dumped) or raw bytes as they are."""
    return b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in rows)


def chat_line(custom_id: str, content: str = "Hi", **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": content}], **body}}


def upload(tc, data: bytes, purpose: str = "batch", filename: str = "in.jsonl", **fields):
    """POST /v1/files as the TenantClient `tc` (multipart)."""
    form = {"purpose": purpose, **fields}
    if data is not None:
        form["file"] = SimpleUploadedFile(filename, data, content_type="application/jsonl")
    return tc.client.post("/v1/files", form, headers=tc.headers)


def run_batch(rt, batch_id: str) -> str:
    """Claim and run the batch in this thread (what the runner thread or a worker does) on the process's
    registry (the test's: `rt` is its fake_rt / real_rt / embed_rt); its status."""
    from batches import execution
    from batches.runner import run_batch as run
    from inference.operations.registry import process_registry

    assert execution.claim(batch_id)
    return asyncio.run(run(batch_id, process_registry()))


def batch_of(tc, data: bytes, endpoint: str = "/v1/chat/completions", **extra) -> dict:
    """Upload `data` and create a batch of it; the Batch object."""
    file_id = upload(tc, data).json()["id"]
    answer = tc.post("/v1/batches", {"input_file_id": file_id, "endpoint": endpoint, "completion_window": "24h",
                                     **extra})
    assert answer.status_code == 200, answer.content
    return answer.json()


def lines_of(tc, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    answer = tc.client.get(f"/v1/files/{file_id}/content", headers=tc.headers)
    assert answer.status_code == 200
    return [json.loads(x) for x in b"".join(answer.streaming_content).splitlines()]
