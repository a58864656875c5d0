"""Well-formedness of the server's streams, as the reliability tests check them: SSE parsing,
chat completion chunk streams, and Responses event streams (and the output a client builds)."""
from __future__ import annotations

import json

TERMINAL = ("response.completed", "response.incomplete", "response.failed")


def sse_data(body: str) -> list:
    """The `data:` payloads of an SSE body in order: parsed JSON, or "[DONE]"."""
    out = []
    for frame in body.split("\n\n"):
        for line in frame.split("\n"):
            if line.startswith("data: "):
                data = line[len("data: "):]
                out.append(data if data == "[DONE]" else json.loads(data))
    return out


def check_chat_stream(payloads: list, n: int = 1) -> dict[int, dict]:
    """Assert a whole chat.completion.chunk stream is well formed: one id throughout, each
    choice's first delta carries the role, finish_reason stays null until that choice's one
    finishing chunk, every index 0..n-1 finishes once, nothing follows `[DONE]`, which ends it.
    Returns {index: {"text", "finish_reason"}}; an in-band error raises AssertionError."""
    assert payloads and payloads[-1] == "[DONE]", payloads[-3:]
    chunks = payloads[:-1]
    assert "[DONE]" not in chunks
    errors = [c for c in chunks if "error" in c]
    assert not errors, errors
    assert len({c["id"] for c in chunks}) == 1
    choices: dict[int, dict] = {}
    for chunk in chunks:
        assert chunk["object"] == "chat.completion.chunk"
        for choice in chunk["choices"]:
            i = choice["index"]
            state = choices.get(i)
            if state is None:
                assert choice["delta"].get("role") == "assistant", f"choice {i} began without the role"
                state = choices[i] = {"text": "", "finish_reason": None}
            assert state["finish_reason"] is None, f"choice {i} went on after it finished"
            state["text"] += choice["delta"].get("content") or ""
            state["finish_reason"] = choice["finish_reason"]
    assert sorted(choices) == list(range(n))
    assert all(c["finish_reason"] is not None for c in choices.values()), choices
    return choices


def fold(events: list[dict]) -> list[dict]:
    """The output a client builds from Responses events: each item as its output_item.done gives
    it. Asserts items are added at indexes 0, 1, 2..., every added item is done, and each done
    item's text is what its deltas streamed."""
    added, done, text = {}, {}, {}
    for e in events:
        if e["type"] == "response.output_item.added":
            assert e["output_index"] == len(added)
            added[e["output_index"]] = e["item"]
        elif e["type"] == "response.output_item.done":
            done[e["output_index"]] = e["item"]
        elif e["type"] in ("response.output_text.delta", "response.refusal.delta",
                           "response.function_call_arguments.delta",
                           "response.reasoning_summary_text.delta"):
            text[e["output_index"]] = text.get(e["output_index"], "") + e["delta"]
    assert sorted(done) == sorted(added), "an item was left open"
    items = [done[i] for i in sorted(done)]
    for i, item in enumerate(items):
        if item["type"] == "message":
            got = "".join(p.get("text") or p.get("refusal") or "" for p in item["content"])
        elif item["type"] == "reasoning":
            got = "".join(s["text"] for s in item["summary"])
        else:
            got = item["arguments"]
        assert got == text.get(i, "")
    return items


def check_responses_stream(events: list[dict], starting_after: int = -1) -> dict:
    """Assert a whole Responses event stream is well formed: sequence numbers from
    starting_after + 1 up by one, response.created first (from the start), exactly one terminal
    event and it is the last, and its response's output is what the events built. Returns the
    final Response object."""
    assert [e["sequence_number"] for e in events] == \
        list(range(starting_after + 1, starting_after + 1 + len(events)))
    if starting_after < 0:
        assert events[0]["type"] == "response.created"
    terminals = [e for e in events if e["type"] in TERMINAL]
    assert len(terminals) == 1 and events[-1] is terminals[0], [e["type"] for e in events[-3:]]
    final = terminals[0]["response"]
    if starting_after < 0:
        assert final["output"] == fold(events)
    return final
