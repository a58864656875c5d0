"""`tools` and `tool_choice` of chat and Responses: validated into the shapes templates and parsers use.

Source: OpenAI API reference, "Create chat completion" (`tools`: function tools
`{type: "function", function: {name, description?, parameters?, strict?}}`,
names of 1 to 64 letters, digits, `_` or `-`; `tool_choice`: none, auto,
required, or `{type: "function", function: {name}}`) and "Create a model response"
(the same, flat: `{type: "function", name, ...}`); vLLM answers `required`
or a named function without tools, and a name that is not among the tools,
with a 400, and so does this server.
"""
from __future__ import annotations

import re

from .errors import bad_request
from .fields import StrictField
from .schema_size import check_schema_size

TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
TOOL_CHOICES = ("none", "auto", "required")


def _function_of(tool, p: str, flat: bool) -> tuple[dict, str]:
    """(the function object, its param prefix) of one tool: `{type, function: {...}}` (chat), or with
    `flat` also `{type, name, ...}` (Responses)."""
    if not isinstance(tool, dict):
        raise bad_request(f"'{p}' must be an object.", p)
    if tool.get("type") != "function":
        raise bad_request(f"'{p}.type' must be 'function'; got {tool.get('type')!r}: this server runs "
                          "function tools only.", f"{p}.type", code="unsupported_tool_type")
    if flat and "function" not in tool:
        return tool, p
    fn = tool.get("function")
    if not isinstance(fn, dict):
        raise bad_request(f"'{p}.function' must be an object with a 'name'.", f"{p}.function")
    return fn, f"{p}.function"


def _function(fn: dict, p: str) -> dict:
    """{name, description, parameters, strict} of a function object, each checked (None where unset)."""
    name = fn.get("name")
    if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
        raise bad_request(f"'{p}.name' must be 1 to 64 letters, digits, '_' or '-'; got {name!r}.", f"{p}.name")
    params = fn.get("parameters")
    if params is not None and not isinstance(params, dict):
        raise bad_request(f"'{p}.parameters' must be a JSON Schema object.", f"{p}.parameters")
    if params is not None:
        check_schema_size(params, f"{p}.parameters")
    description = fn.get("description")
    if description is not None and not isinstance(description, str):
        raise bad_request(f"'{p}.description' must be a string.", f"{p}.description")
    strict = fn.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise bad_request(f"'{p}.strict' must be a boolean.", f"{p}.strict")
    return {"name": name, "description": description, "parameters": params, "strict": strict}


def validate_tools(data, *, flat: bool = False) -> list[dict]:
    """`tools`: function tools, each {type: "function", function: {name, description?, parameters?,
    strict?}}; with `flat` (Responses) also {type: "function", name, ...}.

    Returns chat's shape, {type, function: {name, description (when set), parameters (an empty
    object schema when unset), strict (when set)}}, or with `flat` Responses' shape, {type, name,
    description, parameters, strict} (None where unset). Raises ApiError 400 naming the field
    (`tools[i].function.name`, `tools[i].name`, ...): not an array, a non-function tool, a
    missing, malformed or repeated name, parameters that are not an object, a description that
    is not a string, a strict that is not a boolean.
    """
    if not isinstance(data, list):
        raise bad_request("'tools' must be an array of tools.", "tools")
    tools, names = [], set()
    for i, tool in enumerate(data):
        fn, p = _function_of(tool, f"tools[{i}]", flat)
        checked = _function(fn, p)
        if checked["name"] in names:
            raise bad_request(f"Tool name {checked['name']!r} is used twice.", f"{p}.name")
        names.add(checked["name"])
        if flat:
            tools.append({"type": "function", **checked})
            continue
        out = {"name": checked["name"]}
        if checked["description"]:
            out["description"] = checked["description"]
        out["parameters"] = checked["parameters"] if checked["parameters"] is not None else {
            "type": "object", "properties": {}}
        if checked["strict"] is not None:
            out["strict"] = checked["strict"]
        tools.append({"type": "function", "function": out})
    return tools


def validate_tool_choice(data, *, flat: bool = False) -> str | dict:
    """`tool_choice`: "none", "auto", "required" or a function, given as {"type": "function",
    "function": {"name"}} (chat) or {"type": "function", "name"} (Responses); either form is
    accepted and returned in chat's form, or with `flat` in Responses' form.
    Raises ApiError 400 (param tool_choice) for anything else."""
    if isinstance(data, str) and data in TOOL_CHOICES:
        return data
    if isinstance(data, dict) and data.get("type") == "function":
        fn = data.get("function") if isinstance(data.get("function"), dict) else data
        name = fn.get("name")
        if isinstance(name, str) and name:
            return {"type": "function", "name": name} if flat else {"type": "function", "function": {"name": name}}
    raise bad_request("'tool_choice' must be 'none', 'auto', 'required' or "
                      "{\"type\": \"function\", \"function\": {\"name\": ...}}.", "tool_choice")


def tool_names(tools: list[dict] | None) -> list[str]:
    """The names of validated tools, in either shape."""
    return [t["function"]["name"] if "function" in t else t["name"] for t in tools or []]


def chosen_name(tool_choice) -> str | None:
    """The function a validated tool_choice names, in either shape (None for none, auto, required)."""
    if not isinstance(tool_choice, dict):
        return None
    return tool_choice["function"]["name"] if "function" in tool_choice else tool_choice["name"]


def check_tool_choice(tools: list[dict] | None, tool_choice) -> None:
    """Cross-field rules: `required` and a named function need tools; the name must be one of them
    (validated tools and tool_choice, in either shape). Raises ApiError 400 (param tool_choice)."""
    names = tool_names(tools)
    if tool_choice == "required" and not names:
        raise bad_request("tool_choice 'required' needs at least one tool in 'tools'.", "tool_choice")
    name = chosen_name(tool_choice)
    if name is not None and name not in names:
        offered = ", ".join(names) or "none"
        raise bad_request(f"tool_choice names the function {name!r}, which is not in 'tools' "
                          f"(offered: {offered}).", "tool_choice")


class ToolsField(StrictField):
    """`tools`: see validate_tools (flat: Responses' shape)."""

    def __init__(self, *, flat: bool = False, **kw):
        super().__init__(**kw)
        self.flat = flat

    def to_internal_value(self, data):
        return validate_tools(data, flat=self.flat)


class ToolChoiceField(StrictField):
    """`tool_choice`: see validate_tool_choice (flat: Responses' shape)."""

    def __init__(self, *, flat: bool = False, **kw):
        super().__init__(**kw)
        self.flat = flat

    def to_internal_value(self, data):
        return validate_tool_choice(data, flat=self.flat)
