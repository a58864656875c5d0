"""Helpers for the in-process Anthropic Messages tests: requests through the whole ASGI stack, and a raw SSE
reader that checks the framing Anthropic's SDK depends on."""
from __future__ import annotations

import json

from ..fake_engine import Answer, call

USER = [{"role": "user", "content": "hi"}]


def messages(**body) -> Answer:
    """POST /v1/messages with a default model, max_tokens and messages, overridden by `body`."""
    return call("POST", "/v1/messages", {"model": "smollm2-135m-instruct", "max_tokens": 32, "messages": USER, **body},
                headers={"anthropic-version": "2023-06-01"})


def sse_frames(answer: Answer) -> list[tuple[str, dict]]:
    """(event name, data) of every frame of an Anthropic SSE body. Every frame must have exactly one
    `event:` line naming its data's type and one `data:` line, and there is no [DONE]."""
    text = answer.body.decode()
    assert "[DONE]" not in text
    frames = []
    for frame in text.split("\n\n"):
        if not frame.strip():
            continue
        lines = frame.split("\n")
        assert len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "), frame
        name, data = lines[0][len("event: "):], json.loads(lines[1][len("data: "):])
        assert data["type"] == name, frame
        frames.append((name, data))
    return frames


def check_event_order(frames: list[tuple[str, dict]]) -> None:
    """message_start first, message_stop last, blocks with contiguous indices and one open at a time,
    a signature_delta just before a thinking block stops, tool input that joins into JSON."""
    names = [n for n, _ in frames if n != "ping"]
    assert names[0] == "message_start" and names[-1] == "message_stop"
    assert names[-2] == "message_delta"
    open_index, next_index, kinds, partial, last_delta = None, 0, {}, {}, {}
    for name, data in frames:
        if name == "content_block_start":
            assert open_index is None and data["index"] == next_index
            open_index, next_index = data["index"], next_index + 1
            kinds[open_index] = data["content_block"]["type"]
        elif name == "content_block_delta":
            assert data["index"] == open_index
            last_delta[open_index] = data["delta"]["type"]
            if data["delta"]["type"] == "input_json_delta":
                partial[open_index] = partial.get(open_index, "") + data["delta"]["partial_json"]
        elif name == "content_block_stop":
            assert data["index"] == open_index
            if kinds[open_index] == "thinking":
                assert last_delta[open_index] == "signature_delta"
            if kinds[open_index] == "tool_use":
                json.loads(partial.get(open_index) or "{}")
            open_index = None
        elif name in ("message_delta", "message_stop"):
            assert open_index is None
