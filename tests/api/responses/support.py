"""Helpers for the in-process Responses and Conversations API tests: the prompt the engine was given,
and an SSE parser."""

from __future__ import annotations

import json

from asgiref.sync import async_to_sync


def prompt_of(engine, i: int = -1) -> str:
    """The prompt of the engine's i-th submission, as text (special tokens kept)."""
    return engine.tokenizer.decode(engine.submissions[i].prompt_token_ids, skip_special_tokens=False)


async def _collect(chunks) -> list[bytes]:
    return [chunk async for chunk in chunks]


def sse_events(response) -> list[dict]:
    """The events of a Responses SSE body; checks each `event:` line names its data's type."""
    body = b"".join(async_to_sync(_collect)(response.streaming_content)).decode()
    assert "[DONE]" not in body
    events = []
    for frame in body.split("\n\n"):
        if not frame.strip():
            continue
        lines = dict(line.split(": ", 1) for line in frame.split("\n"))
        data = json.loads(lines["data"])
        assert lines["event"] == data["type"]
        events.append(data)
    return events
