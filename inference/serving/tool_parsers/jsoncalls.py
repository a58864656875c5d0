"""Reading calls out of JSON: `{"name": ..., "arguments" | "parameters": {...}}`, alone or listed.

Shared by hermes, llama3_json and mistral. Arguments given as a JSON string
holding an object (some models double-encode) are decoded; a missing or
empty arguments value is `{}`; string values are coerced to the schema's types.
`JsonCallStream` reads such an object as it arrives, for streamed arguments
(base.py): it commits once `"name"` is read and then an `"arguments"` /
`"parameters"` object opens; any other shape (a list of calls, arguments as a
string, the name after the arguments) is left to the one-shot reading.
"""
from __future__ import annotations

import json
from typing import Any

from ..markers import skip_whitespace
from .base import ParsedCall, Rejected
from .json_stream import ArgumentsStream, JsonObjectReader
from .schema import ToolSchemas, coerce_arguments

_ARGUMENT_KEYS = ("arguments", "parameters")


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


class JsonCallStream:
    """One call object read as it grows: `name` once its arguments object has opened, then
    `advance(region)` gives their compact JSON as it becomes final (json_stream.ArgumentsStream).

    prefix: what may come before the object in the region (`<tool_call>`, `<|python_tag|>`),
    whitespace after it skipped. A region that does not hold an object never sets `name`.
    """

    def __init__(self, schemas: ToolSchemas, prefix: str):
        self._schemas = schemas
        self._prefix = prefix
        self._outer: JsonObjectReader | None = None
        self._seen = 0
        self._name: str | None = None
        self._arguments: ArgumentsStream | None = None
        self._dead = False
        self.name: str | None = None

    def advance(self, region: str) -> str:
        if self._arguments is not None:
            return self._arguments.advance(region)
        if self._dead:
            return ""
        if self._outer is None:
            i = skip_whitespace(region, len(self._prefix) if region.startswith(self._prefix) else 0)
            if i == len(region):
                return ""
            if region[i] != "{":
                self._dead = True
                return ""
            self._outer = JsonObjectReader(i)
        outer = self._outer
        outer.advance(region)
        for key, start, end in outer.members[self._seen:]:
            self._seen += 1
            if key == "name":
                try:
                    name = json.loads(region[start:end])
                except ValueError:
                    name = None
                self._name = name if isinstance(name, str) and name else None
            elif key in _ARGUMENT_KEYS:   # arguments before a name, or not an object: one-shot
                self._dead = True
        opened = outer.open_value
        if outer.error or outer.closed:
            self._dead = True
        elif self._name is not None and opened is not None and opened[0] in _ARGUMENT_KEYS \
                and region[opened[1]] == "{":
            self.name = self._name
            self._arguments = ArgumentsStream(opened[1], self._schemas.properties(self._name))
            return self._arguments.advance(region)
        return ""
