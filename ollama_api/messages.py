"""/api/chat's `messages` and `tools`: Ollama's shapes validated (ApiError 400 naming the field).

Source: Ollama's api/types.go (Message: role, content, thinking, images, tool_calls, tool_name, tool_call_id;
ToolCall: function {name, arguments: an object}; Tool, whose property `type` is a string or strings) and the
`ollama` client (_types.py, _utils.convert_function_to_tool: it drops empty fields, so "" content arrives as a
missing key, and writes a Python function's parameter types joined with ", ").
"""
from __future__ import annotations

import json

from rest_framework import serializers

from inference.serving.errors import bad_request
from inference.serving.fields import StrictField
from inference.serving.tool_fields import validate_tools

ROLES = ("system", "user", "assistant", "tool")


def _arguments(value, p: str) -> dict:
    """A tool call's `arguments`: an object (Ollama's form), or a JSON string holding one (what OpenAI-minded
    clients send)."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError:
            value = None
    if not isinstance(value, dict):
        raise bad_request(f"'{p}' must be an object.", p)
    return value


def _tool_calls(calls, p: str) -> list[dict]:
    if not isinstance(calls, list):
        raise bad_request(f"'{p}' must be an array.", p)
    out = []
    for i, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad_request(f"'{p}[{i}]' must be {{\"function\": {{\"name\", \"arguments\"}}}}.", f"{p}[{i}].function")
        call_id = call.get("id")
        if call_id is not None and not isinstance(call_id, str):
            raise bad_request(f"'{p}[{i}].id' must be a string.", f"{p}[{i}].id")
        out.append({"id": call_id, "name": fn["name"],
                    "arguments": _arguments(fn.get("arguments", {}), f"{p}[{i}].function.arguments")})
    return out


def _string(m: dict, key: str, p: str) -> str | None:
    value = m.get(key)
    if value is not None and not isinstance(value, str):
        raise bad_request(f"'{p}.{key}' must be a string.", f"{p}.{key}")
    return value


def validate_message(m, i: int) -> dict:
    """One chat message: {role (lowercased), content ("" when absent: the client drops empty fields), thinking,
    images, tool_calls [{id, name, arguments}], tool_name, tool_call_id}. Raises ApiError 400 naming it."""
    p = f"messages[{i}]"
    if not isinstance(m, dict):
        raise bad_request(f"'{p}' must be an object.", p)
    role = m.get("role")
    if not isinstance(role, str) or role.lower() not in ROLES:
        raise bad_request(f"'{p}.role' must be one of {', '.join(ROLES)}; got {json.dumps(role)[:40]}.", f"{p}.role")
    images = m.get("images")
    if images is not None:
        if not isinstance(images, list) or not all(isinstance(x, str) for x in images):
            raise bad_request(f"'{p}.images' must be an array of base64 strings.", f"{p}.images")
    message = {"role": role.lower(), "content": _string(m, "content", p) or "", "images": images or [],
               "thinking": _string(m, "thinking", p), "tool_name": _string(m, "tool_name", p),
               "tool_call_id": _string(m, "tool_call_id", p), "tool_calls": []}
    if m.get("tool_calls") is not None:
        message["tool_calls"] = _tool_calls(m["tool_calls"], f"{p}.tool_calls")
    return message


class MessagesField(StrictField):
    """`messages`: an array (empty: the request only loads the model) of messages (validate_message)."""

    def to_internal_value(self, data):
        if not isinstance(data, list):
            raise serializers.ValidationError("must be an array of message objects.")
        return [validate_message(m, i) for i, m in enumerate(data)]


def _comma_types(schema):
    """A schema with the `ollama` client's comma-joined property types ("string, integer", from a Python
    function's annotations) as the list of types JSON Schema means."""
    if isinstance(schema, dict):
        out = {k: _comma_types(v) for k, v in schema.items()}
        if isinstance(out.get("type"), str) and "," in out["type"]:
            out["type"] = [t.strip() for t in out["type"].split(",") if t.strip()]
        return out
    if isinstance(schema, list):
        return [_comma_types(v) for v in schema]
    return schema


class ToolsField(StrictField):
    """`tools`: function tools in chat's shape ({type: function, function: {name, description, parameters}};
    `type` may be left out), comma-joined property types read as lists; [] means none. Returns chat's shape
    (serving/tool_fields.validate_tools) or None."""

    def to_internal_value(self, data):
        if isinstance(data, list):
            data = [{"type": "function", **t} if isinstance(t, dict) and "type" not in t else t for t in data]
        tools = validate_tools(_comma_types(data))
        return tools or None
