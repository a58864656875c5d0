"""Helpers of the batch tests against live servers: an input file of chat lines through the openai SDK, polling a
batch, and the one check every restart test makes (each line's result once, none lost, none run again)."""
from __future__ import annotations

import io
import json
import time

TERMINAL = ("completed", "failed", "expired", "cancelled")


def chat_lines(n: int, max_tokens: int = 8, prefix: str = "l") -> list[dict]:
    """n chat lines with custom_ids prefix0..prefix{n-1}; greedy, at least `max_tokens` tokens each."""
    return [{"custom_id": f"{prefix}{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": "smollm2-135m-instruct", "max_tokens": max_tokens, "temperature": 0,
                      "ignore_eos": True, "messages": [{"role": "user", "content": f"Count from {i} upwards."}]}}
            for i in range(n)]


def create_batch(client, rows: list[dict]):
    """Upload `rows` as a batch input file and create a chat batch of it; the Batch."""
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    file = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    return client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")


def wait_batch(client, batch_id: str, statuses=TERMINAL, timeout_s: float = 300, until=None):
    """Poll until the batch's status is in `statuses` (and `until(batch)` holds, if given); the Batch.
    Raises AssertionError on timeout."""
    deadline = time.monotonic() + timeout_s
    batch = None
    while time.monotonic() < deadline:
        try:
            batch = client.batches.retrieve(batch_id)
        except Exception:  # noqa: BLE001  (a server restarting under the poll)
            time.sleep(0.5)
            continue
        if batch.status in statuses and (until is None or until(batch)):
            return batch
        time.sleep(0.25)
    raise AssertionError(f"batch {batch_id} did not get there in {timeout_s} s: {batch}")


def check_every_line_once(client, batch, rows: list[dict], written_before: dict[str, str]) -> list[dict]:
    """The batch completed with one output line per input line (none missing, none twice), and each
    line written before the interruption (custom_id -> its output line's id) is the one kept: it
    was not run again. Returns the output lines."""
    assert batch.status == "completed", batch
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (
        len(rows), len(rows), 0), batch.request_counts
    out = [json.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()]
    ids = [row["custom_id"] for row in out]
    assert sorted(ids) == sorted(r["custom_id"] for r in rows) and len(set(ids)) == len(ids)
    kept = {row["custom_id"]: row["id"] for row in out}
    assert {c: kept[c] for c in written_before} == written_before
    assert batch.error_file_id is None
    return out
