"""The `mistral` tool parser: `[TOOL_CALLS]` + JSON list, or `[TOOL_CALLS]NAME[ARGS]{json}`.

Source: vLLM's `mistral` parser (both tokenizer generations: before v11 a
JSON list `[{"name", "arguments"}]` after the marker; from v11 one
`[TOOL_CALLS]NAME[ARGS]{...}` per call, optionally `[CALL_ID]ID` before
`[ARGS]`, whose id we replace with ours); the original server's `mistral`.
`[TOOL_CALLS]` is a control token: the detokenizer must keep special tokens
for this parser to see it. Leak markers: a hallucinated
`[TOOL_RESULTS]...[/TOOL_RESULTS]` block and a stray `[ARGS]` / `[CALL_ID]`.

Streamed arguments (base.py): the `NAME[ARGS]{...}` form streams (`_MistralStream` commits
at the object's `{` after `[ARGS]`); the JSON-list form stays one-shot, since one bad element
rejects the whole list.
"""
from __future__ import annotations

import json

from ..markers import next_marker, skip_whitespace
from ..sanitizer import LeakMarkers
from .base import ParsedCall, ParseResult, Rejected, ToolParser
from .extent import JsonExtent
from .json_stream import ArgumentsStream
from .jsoncalls import calls_from_json, decode_first
from .schema import coerce_arguments

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"


class _MistralScanner:
    """After the marker: a JSON list/object, or NAME up to `[ARGS]` and then a JSON object."""

    def __init__(self):
        self._pos = len(TOOL_CALLS)
        self._phase = "head"   # head -> json, or head -> name -> args -> json
        self._json: JsonExtent | None = None

    def advance(self, buf: str) -> int | None:
        if self._phase == "name":
            j, marker = next_marker(buf, (ARGS,), start=self._pos)
            self._pos = j if marker is None else j + len(ARGS)
            if marker is None:
                return None
            self._phase = "args"
        if self._phase in ("head", "args"):
            i = self._pos = skip_whitespace(buf, self._pos)
            if i == len(buf):
                return None
            if buf[i] == "{" or (buf[i] == "[" and self._phase == "head"):
                self._json = JsonExtent(i)
                self._phase = "json"
            elif self._phase == "args":
                return i   # `[ARGS]` not followed by a JSON object: malformed, the region ends
            else:
                self._phase = "name"
                return self.advance(buf)
        return self._json.advance(buf)


class _MistralStream:
    """A `[TOOL_CALLS]NAME[ARGS]{...}` region read as it grows: `name` at the `{`, then its JSON."""

    def __init__(self, schemas):
        self._schemas = schemas
        self._arguments: ArgumentsStream | None = None
        self._dead = False
        self.name: str | None = None

    def advance(self, region: str) -> str:
        if self._arguments is not None:
            return self._arguments.advance(region)
        if self._dead:
            return ""
        head = skip_whitespace(region, len(TOOL_CALLS))
        if head == len(region):
            return ""
        j = region.find(ARGS, head)
        if region[head] in "{[" or j < 0:
            self._dead = region[head] in "{["
            return ""
        i = skip_whitespace(region, j + len(ARGS))
        if i == len(region):
            return ""
        name = region[head:j].partition(CALL_ID)[0].strip()
        if region[i] != "{" or not name:
            self._dead = True
            return ""
        self.name = name
        self._arguments = ArgumentsStream(i, self._schemas.properties(name))
        return self._arguments.advance(region)


class MistralToolParser(ToolParser):
    """`[TOOL_CALLS]` calls in either Mistral tokenizer generation's spelling."""

    name = "mistral"
    start_markers = (TOOL_CALLS,)
    leak_markers = LeakMarkers(orphan_open=("[TOOL_RESULTS]",),
                               close=("[/TOOL_RESULTS]", ARGS, CALL_ID))

    def _new_scanner(self) -> _MistralScanner:
        return _MistralScanner()

    def _new_stream(self) -> _MistralStream:
        return _MistralStream(self.schemas)

    def _parse(self, region: str) -> ParseResult:
        body = region[len(TOOL_CALLS):].lstrip()
        if body[:1] in ("{", "["):
            try:
                return calls_from_json(decode_first(body), self.schemas)
            except ValueError:
                return Rejected("the calls are not valid JSON")
        head, sep, args_text = body.partition(ARGS)
        name = head.partition(CALL_ID)[0].strip()
        if not sep or not name:
            return Rejected("expected NAME[ARGS]{...} after [TOOL_CALLS]", name or None)
        try:
            arguments = json.loads(args_text)
        except ValueError:
            return Rejected("the arguments are not a JSON object", name)
        if not isinstance(arguments, dict):
            return Rejected("the arguments are not a JSON object", name)
        return [ParsedCall(name, coerce_arguments(arguments, self.schemas.parameters(name)))]
