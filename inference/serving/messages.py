"""Chat `messages` validation: OpenAI's message shapes normalised into what chat templates expect.

Source: OpenAI API reference, "Create chat completion" (`messages`: system, developer,
user, assistant, tool; content as a string or an array of parts); vLLM's
chat_utils for the template-facing shape (developer -> system, tool call
arguments parsed to objects so templates can `tojson` them).
"""
from __future__ import annotations

import json

from .errors import bad_request

ROLES = ("system", "developer", "user", "assistant", "tool")
TEXT_PARTS = ("text", "input_text", "output_text")
# Parts OpenAI defines that need a modality this server does not have.
MEDIA_PARTS = {"image_url": "image", "input_image": "image", "input_audio": "audio", "file": "file",
               "input_file": "file", "video_url": "video"}


def text_of(content, param: str) -> str:
    """A message's content as text: a string, or the concatenation of an array of text parts.

    Raises ApiError 400 naming the part (`param[i].type`) for image, audio or file parts
    (this model has no vision or audio) and for malformed parts.
    """
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{param} must be a string or an array of content parts.", param)
    texts = []
    for i, part in enumerate(content):
        p = f"{param}[{i}]"
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise bad_request(f"{p} must be a content part object with a 'type'.", p)
        kind = part["type"]
        if kind in TEXT_PARTS:
            if not isinstance(part.get("text"), str):
                raise bad_request(f"{p}.text must be a string.", f"{p}.text")
            texts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        elif kind in MEDIA_PARTS:
            raise bad_request(
                f"{p} is an {kind!r} part, but this model accepts text only: it has no "
                f"{MEDIA_PARTS[kind]} input.", f"{p}.type", code="unsupported_content_type")
        else:
            raise bad_request(f"Unknown content part type {kind!r} in {p}.", f"{p}.type",
                              code="unsupported_content_type")
    return "".join(texts)


def _tool_calls(calls, param: str) -> list[dict]:
    """An assistant message's tool_calls, with JSON-string arguments parsed for the template."""
    if not isinstance(calls, list):
        raise bad_request(f"{param} must be an array.", param)
    out = []
    for i, call in enumerate(calls):
        p = f"{param}[{i}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad_request(f"{p} must be {{'id', 'type': 'function', 'function': {{'name', 'arguments'}}}}.",
                              f"{p}.function")
        args = fn.get("arguments", "")
        if isinstance(args, str):
            try:
                parsed = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError:
                parsed = args
            args = parsed if isinstance(parsed, dict) else args
        out.append({**call, "type": call.get("type", "function"), "function": {**fn, "arguments": args}})
    return out


def normalize_message(m, i: int) -> dict:
    """One message in the template's shape. Raises ApiError 400 with `param` messages[i].<field>."""
    p = f"messages[{i}]"
    if not isinstance(m, dict):
        raise bad_request(f"{p} must be an object.", p)
    role = m.get("role")
    if role not in ROLES:
        raise bad_request(f"{p}.role must be one of {', '.join(ROLES)}; got {role!r}.", f"{p}.role")
    msg: dict = {"role": "system" if role == "developer" else role}
    content = m.get("content")
    if content is None:
        if role != "assistant":
            raise bad_request(f"{p}.content is required for role {role!r}.", f"{p}.content")
        msg["content"] = ""
    else:
        msg["content"] = text_of(content, f"{p}.content")
    if role == "tool":
        if not isinstance(m.get("tool_call_id"), str) or not m["tool_call_id"]:
            raise bad_request(f"{p}.tool_call_id is required for tool messages.", f"{p}.tool_call_id")
        msg["tool_call_id"] = m["tool_call_id"]
    if role == "assistant" and m.get("tool_calls") is not None:
        msg["tool_calls"] = _tool_calls(m["tool_calls"], f"{p}.tool_calls")
    if m.get("name") is not None:
        if not isinstance(m["name"], str):
            raise bad_request(f"{p}.name must be a string.", f"{p}.name")
        msg["name"] = m["name"]
    return msg


def check_tool_answers(messages: list[dict]) -> None:
    """Each tool message answers a call of the assistant message before its run of tool messages, by id (OpenAI
    answers a 400 for a tool message after anything else, and for a tool_call_id none of that message's
    tool_calls has). A call written without an id can be answered by any tool_call_id. Raises ApiError 400
    naming messages[i].role or messages[i].tool_call_id."""
    asked: tuple[int, list[dict]] | None = None  # the assistant message whose calls the tool messages answer
    for i, m in enumerate(messages):
        if m["role"] != "tool":
            asked = (i, m["tool_calls"]) if m["role"] == "assistant" and m.get("tool_calls") else None
            continue
        if asked is None:
            raise bad_request(f"messages[{i}] has role 'tool', but it does not follow an assistant message with "
                              "'tool_calls': a tool message answers one of those calls.", f"messages[{i}].role")
        at, calls = asked
        ids = [c.get("id") for c in calls]
        if m["tool_call_id"] not in ids and all(isinstance(x, str) and x for x in ids):
            raise bad_request(f"messages[{i}].tool_call_id {m['tool_call_id'][:64]!r} is not the id of a call in "
                              f"messages[{at}].tool_calls.", f"messages[{i}].tool_call_id")


def normalize_messages(data) -> list[dict]:
    """`messages` (a non-empty array) in the template's shape, each tool message answering a call
    (check_tool_answers). Raises ApiError 400 naming the field."""
    if not isinstance(data, list):
        raise bad_request("'messages' must be an array of message objects.", "messages")
    if not data:
        raise bad_request("'messages' must contain at least one message.", "messages")
    messages = [normalize_message(m, i) for i, m in enumerate(data)]
    check_tool_answers(messages)
    return messages
