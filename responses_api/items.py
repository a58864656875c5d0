"""Responses items -> chat messages for the chat template.

Rules (OpenAI's Responses <-> Chat Completions mapping, as vLLM applies it):
- message items keep their role (developer becomes system, as in the chat surface) and their
  text parts joined;
- a function_call becomes an assistant message with `tool_calls`, joining the assistant message
  just before it (text then calls is one chat turn; consecutive calls are parallel calls);
- a function_call_output becomes a tool message with its `tool_call_id`;
- reasoning items are dropped from the prompt (the model reasons afresh each turn).
Earlier `instructions` never reach here: only the current request's become the system message.
Tools and earlier calls reach the prompt through inference.serving.tool_prompt, as on chat.
"""

from __future__ import annotations

import json


def _text(parts: list[dict]) -> str:
    return "".join(p.get("text") or p.get("refusal") or "" for p in parts)


def _arguments(arguments: str):
    """Call arguments as the template expects them: a JSON object when they are one (as
    transformers documents for tool_calls), else the string as given."""
    try:
        value = json.loads(arguments)
    except (TypeError, ValueError):
        return arguments
    return value if isinstance(value, dict) else arguments


def items_to_messages(items: list[dict]) -> list[dict]:
    """Chat messages for normalized items (see protocol.normalize_item), in order."""
    messages: list[dict] = []
    for item in items:
        kind = item["type"]
        if kind == "message":
            role = "system" if item["role"] == "developer" else item["role"]
            messages.append({"role": role, "content": _text(item["content"])})
        elif kind == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": _arguments(item["arguments"])}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item["call_id"],
                             "content": item["output"]})
    return messages
