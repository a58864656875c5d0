"""Chat `tools`, `tool_choice` and `parallel_tool_calls`: validated into the shapes templates and parsers use.

Source: OpenAI API reference, "Create chat completion" (`tools`: function tools
`{type: "function", function: {name, description?, parameters?, strict?}}`,
names of 1 to 64 letters, digits, `_` or `-`; `tool_choice`: none, auto,
required, or `{type: "function", function: {name}}`); vLLM answers `required`
or a named function without tools, and a name that is not among the tools,
with a 400, and so does this server.
"""
from __future__ import annotations

import re

from .errors import bad_request
from .fields import StrictField

TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
TOOL_CHOICES = ("none", "auto", "required")


def _function_of(tool, p: str) -> dict:
    if not isinstance(tool, dict):
        raise bad_request(f"'{p}' must be an object.", p)
    if tool.get("type") != "function":
        raise bad_request(f"'{p}.type' must be 'function'; got {tool.get('type')!r}: this server runs "
                          "function tools only.", f"{p}.type", code="unsupported_tool_type")
    fn = tool.get("function")
    if not isinstance(fn, dict):
        raise bad_request(f"'{p}.function' must be an object with a 'name'.", f"{p}.function")
    return fn


def validate_tools(data) -> list[dict]:
    """`tools` in OpenAI's chat shape, each {type, function: {name, description?, parameters, strict?}}
    with `parameters` defaulted to an empty object schema.

    Raises ApiError 400 naming the field (`tools[i].function.name`, ...): not an array, a
    non-function tool, a missing, malformed or repeated name, parameters that are not an object.
    """
    if not isinstance(data, list):
        raise bad_request("'tools' must be an array of tools.", "tools")
    tools, names = [], set()
    for i, tool in enumerate(data):
        p = f"tools[{i}]"
        fn = _function_of(tool, p)
        name = fn.get("name")
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
            raise bad_request(f"'{p}.function.name' must be 1 to 64 letters, digits, '_' or '-'; got "
                              f"{name!r}.", f"{p}.function.name")
        if name in names:
            raise bad_request(f"Tool name {name!r} is used twice.", f"{p}.function.name")
        names.add(name)
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise bad_request(f"'{p}.function.parameters' must be a JSON Schema object.",
                              f"{p}.function.parameters")
        description = fn.get("description")
        if description is not None and not isinstance(description, str):
            raise bad_request(f"'{p}.function.description' must be a string.", f"{p}.function.description")
        out = {"name": name}
        if description:
            out["description"] = description
        out["parameters"] = params if params is not None else {"type": "object", "properties": {}}
        if fn.get("strict") is not None:
            out["strict"] = fn["strict"]
        tools.append({"type": "function", "function": out})
    return tools


def validate_tool_choice(data) -> str | dict:
    """`tool_choice`: "none", "auto", "required" or {"type": "function", "function": {"name"}} (the flat
    Responses form {"type": "function", "name"} is accepted too and given in the chat form).
    Raises ApiError 400 (param tool_choice) for anything else."""
    if data in TOOL_CHOICES:
        return data
    if isinstance(data, dict) and data.get("type") == "function":
        fn = data.get("function") if isinstance(data.get("function"), dict) else data
        name = fn.get("name")
        if isinstance(name, str) and name:
            return {"type": "function", "function": {"name": name}}
    raise bad_request("'tool_choice' must be 'none', 'auto', 'required' or "
                      "{\"type\": \"function\", \"function\": {\"name\": ...}}.", "tool_choice")


def check_tool_choice(tools: list[dict] | None, tool_choice) -> None:
    """Cross-field rules: `required` and a named function need tools; the name must be one of them.
    Raises ApiError 400 (param tool_choice)."""
    names = [t["function"]["name"] for t in tools or []]
    if tool_choice == "required" and not names:
        raise bad_request("tool_choice 'required' needs at least one tool in 'tools'.", "tool_choice")
    if isinstance(tool_choice, dict):
        name = tool_choice["function"]["name"]
        if name not in names:
            offered = ", ".join(names) or "none"
            raise bad_request(f"tool_choice names the function {name!r}, which is not in 'tools' "
                              f"(offered: {offered}).", "tool_choice")


class ToolsField(StrictField):
    """`tools`: see validate_tools."""

    def to_internal_value(self, data):
        return validate_tools(data)


class ToolChoiceField(StrictField):
    """`tool_choice`: see validate_tool_choice."""

    def to_internal_value(self, data):
        return validate_tool_choice(data)
