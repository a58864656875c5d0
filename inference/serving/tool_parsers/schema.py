"""The request's tools as schemas: which names may be called; argument values typed by JSON Schema.

Source: the original server's behaviour doc, section 4, "Repair and backfill"
(string values coerced to schema types; booleans also accept 1/0/yes/no) and
`poolside_v1` (a value that parses as JSON is JSON, else a raw string); vLLM's
`qwen3_coder` parser (a parameter's text typed by its schema, a string
parameter kept verbatim). Coercion happens only where it is unambiguous: a
string is converted only when the schema does not also allow a string.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any

_INTEGER = re.compile(r"[+-]?\d+")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_TRUE = {"true", "1", "yes"}
_FALSE = {"false", "0", "no"}
_NO = object()   # "this string is not a value of that type"


class ToolSchemas:
    """Function tools of one request (OpenAI `tools` entries), looked up by name.

    tool_choice: "auto", "required", "none", or a named function
    (`{"type": "function", "function": {"name": ...}}` or the flat Responses
    form `{"type": "function", "name": ...}`), which limits `allowed` to it.
    """

    def __init__(self, tools: list[dict] | None, tool_choice: str | dict | None = "auto"):
        self._parameters: dict[str, dict] = {}
        for tool in tools or []:
            if tool.get("type", "function") != "function":
                continue
            fn = tool.get("function", tool)
            name = fn.get("name")
            if isinstance(name, str) and name:
                params = fn.get("parameters")
                self._parameters[name] = params if isinstance(params, dict) else {}
        self.names: tuple[str, ...] = tuple(self._parameters)
        if tool_choice == "none":
            self.allowed: tuple[str, ...] = ()
        elif isinstance(tool_choice, dict):
            fn = tool_choice.get("function", tool_choice)
            chosen = fn.get("name") if isinstance(fn, dict) else None
            self.allowed = tuple(n for n in self.names if n == chosen)
        else:
            self.allowed = self.names

    def parameters(self, name: str) -> dict:
        """The tool's `parameters` JSON Schema ({} when it declares none)."""
        return self._parameters.get(name, {})

    def properties(self, name: str) -> dict[str, dict]:
        """The tool's top-level argument schemas by name ({} when it declares none)."""
        props = self.parameters(name).get("properties")
        return props if isinstance(props, dict) else {}


def schema_types(schema: Any) -> list[str]:
    """The types a JSON Schema names (`type`: a string or a list; else from properties / items)."""
    if not isinstance(schema, dict):
        return []
    t = schema.get("type")
    if isinstance(t, str):
        return [t]
    if isinstance(t, list):
        return [x for x in t if isinstance(x, str)]
    if "properties" in schema:
        return ["object"]
    if "items" in schema:
        return ["array"]
    return []


def coerce_value(value: Any, schema: Any) -> Any:
    """A JSON value converted to the schema's type where unambiguous; otherwise unchanged.

    Strings become integer, number, boolean, null, object or array when the
    schema asks for one of those and not for a string; integral floats become
    integers for an integer schema; objects and arrays are coerced member by
    member through `properties` and `items`.
    """
    types = schema_types(schema)
    if isinstance(value, str):
        if not types or "string" in types:
            return value
        for t in types:
            converted = _from_string(value, t)
            if converted is not _NO:
                return converted
        return value
    if isinstance(value, bool):
        return value
    if isinstance(value, float) and "integer" in types and "number" not in types \
            and value.is_integer():
        return int(value)
    if isinstance(value, dict) and isinstance(schema, dict) \
            and isinstance(schema.get("properties"), dict):
        return coerce_arguments(value, schema)
    if isinstance(value, list) and isinstance(schema, dict) \
            and isinstance(schema.get("items"), dict):
        return [coerce_value(v, schema["items"]) for v in value]
    return value


def coerce_arguments(arguments: dict, parameters: dict) -> dict:
    """Each argument coerced by its property schema in `parameters`; unknown keys are kept as is."""
    props = parameters.get("properties") if isinstance(parameters, dict) else None
    if not isinstance(props, dict):
        return arguments
    return {k: coerce_value(v, props.get(k)) for k, v in arguments.items()}


def type_raw_value(raw: str, schema: Any, *, untyped: str, unwrap_json_string: bool) -> Any:
    """A value written as raw text in XML-style markup, typed by its property schema.

    untyped: what a value without a type becomes: "string" keeps the text
    (qwen3_coder, glm47), "json" takes it as JSON when it parses (poolside_v1).
    unwrap_json_string: for a string parameter, text that is a JSON string
    literal (`"x"`) becomes its content (poolside_v1); otherwise the text is kept.
    """
    types = schema_types(schema)
    if not types:
        if untyped == "json":
            parsed = _json_or_no(raw)
            return raw if parsed is _NO else parsed
        return raw
    if "string" in types:
        if unwrap_json_string:
            parsed = _json_or_no(raw)
            if isinstance(parsed, str):
                return parsed
        return raw
    parsed = _json_or_no(raw)
    return coerce_value(raw if parsed is _NO else parsed, schema)


def _json_or_no(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return _NO


def _int_or_no(s: str) -> Any:
    # Past sys.get_int_max_str_digits() (4,300 by default) int() raises ValueError (CPython's guard
    # against quadratic conversion, CVE-2020-10735): such digits stay the text the model wrote.
    try:
        return int(s)
    except ValueError:
        return _NO


def _from_string(text: str, t: str) -> Any:
    s = text.strip()
    if t == "integer" and _INTEGER.fullmatch(s):
        return _int_or_no(s)
    if t == "number" and _NUMBER.fullmatch(s):
        if _INTEGER.fullmatch(s):
            return _int_or_no(s)
        f = float(s)
        return f if math.isfinite(f) else _NO
    if t == "boolean":
        low = s.lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
    if t == "null" and s == "null":
        return None
    if t in ("object", "array"):
        parsed = _json_or_no(s)
        if isinstance(parsed, dict if t == "object" else list):
            return parsed
    return _NO
