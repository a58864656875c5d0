"""Reading calls out of JSON: `{"name": ..., "arguments" | "parameters": {...}}`, alone or listed.

Shared by hermes, llama3_json and mistral. Arguments given as a JSON string
holding an object (some models double-encode) are decoded; a missing or
empty arguments value is `{}`; string values are coerced to the schema's types.
"""
from __future__ import annotations

import json
from typing import Any

from .base import ParsedCall, Rejected
from .schema import ToolSchemas, coerce_arguments


def call_from_json(item: Any, schemas: ToolSchemas) -> ParsedCall | Rejected:
    """One call from a decoded JSON object, or why it is not one."""
    if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
        return Rejected("the call is not an object with a string \"name\"")
    name = item["name"]
    args = item.get("arguments", item.get("parameters"))
    if args is None or (isinstance(args, str) and not args.strip()):
        args = {}
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return Rejected("the arguments are not a JSON object", name)
    if not isinstance(args, dict):
        return Rejected("the arguments are not a JSON object", name)
    return ParsedCall(name, coerce_arguments(args, schemas.parameters(name)))


def calls_from_json(value: Any, schemas: ToolSchemas) -> list[ParsedCall] | Rejected:
    """The calls in a decoded object or list of objects; any bad one rejects them all."""
    items = value if isinstance(value, list) else [value]
    if not items:
        return Rejected("an empty list of calls")
    calls = []
    for item in items:
        call = call_from_json(item, schemas)
        if isinstance(call, Rejected):
            return call
        calls.append(call)
    return calls


def decode_first(text: str) -> Any:
    """The first JSON value in text (leading whitespace skipped, trailing text ignored).

    Raises ValueError when text does not start with a JSON value.
    """
    stripped = text.lstrip()
    value, _ = json.JSONDecoder().raw_decode(stripped)
    return value
