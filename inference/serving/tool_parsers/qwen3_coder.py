"""The `qwen3_coder` tool parser: XML-style calls, `<function=NAME>` with `<parameter=KEY>` values.

The whole shape: `<tool_call><function=NAME><parameter=KEY>VALUE</parameter>...</function>`
then `</tool_call>`.

Source: vLLM's `qwen3_coder` parser (a value loses one leading and one
trailing newline; a string parameter keeps its text verbatim; other types are
read as JSON and typed by the schema; a parameter outside the schema stays a
string); the original server's `qwen3_coder` (default for qwen3_5(_moe),
qwen3_6_moe, holo3_1_moe, nemotron_h): a `</tool_call>` inside a
`<parameter=...>` value does not close the call, and its leak markers.

Streamed arguments (base.py): `_Qwen3Stream` commits at `<function=NAME>`, writes `{`, then each
parameter: a string one (schema type string or none) while its text arrives (its first newline
dropped, a last newline and a possible `</parameter>` held back), any other at `</parameter>`,
typed as `_parse` types it.
"""
from __future__ import annotations

from ..markers import partial_start
from ..sanitizer import LeakMarkers
from .base import ParsedCall, ParseResult, Rejected, ToolParser
from .extent import TagEnvelopeExtent
from .json_stream import compact, streams_as_text
from .schema import ToolSchemas, type_raw_value

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
FUNCTION = "<function="
PARAMETER = "<parameter="
PARAMETER_END = "</parameter>"


def _raw_value(text: str) -> str:
    """A parameter's text as `_parse` keeps it: one leading and one trailing newline dropped."""
    text = text[1:] if text.startswith("\n") else text
    return text[:-1] if text.endswith("\n") else text


class _Qwen3Stream:
    """A `<tool_call>` region read as it grows (module doc): `name`, then `advance` -> JSON text."""

    def __init__(self, schemas: ToolSchemas):
        self._schemas = schemas
        self._props: dict = {}
        self._pos = len(OPEN)        # where the next marker is looked for
        self._keys: set[str] = set()
        self._key: str | None = None  # the parameter whose value is open
        self._sep = ""               # what goes before it: "," after the first
        self._value = 0              # where its text starts
        self._text = False           # it is written while it arrives
        self._shown = 0              # where the written part of its text ends (an index)
        self._dead = False
        self.name: str | None = None

    def advance(self, region: str) -> str:
        if self._dead:
            return ""
        out = []
        if self.name is None:
            f = region.find(FUNCTION, len(OPEN))
            g = region.find(">", f + len(FUNCTION)) if f >= 0 else -1
            if g < 0:
                return ""
            name = region[f + len(FUNCTION):g].strip()
            if not name:
                self._dead = True
                return ""
            self.name, self._props, self._pos = name, self._schemas.properties(name), g + 1
            out.append("{")
        while True:
            if self._key is None:
                p = region.find(PARAMETER, self._pos)
                k = region.find(">", p + len(PARAMETER)) if p >= 0 else -1
                if k < 0:
                    break
                key = region[p + len(PARAMETER):k].strip()
                if key in self._keys:   # the one-shot dict keeps its first place: stop here
                    self._dead = True
                    break
                self._sep = "," if self._keys else ""
                self._keys.add(key)
                self._key, self._value, self._shown = key, k + 1, -1
                self._text = streams_as_text(self._props.get(key))
                self._pos = k + 1
                if self._text:
                    out.append(self._sep + compact(key) + ':"')
            e = region.find(PARAMETER_END, self._pos)
            if e < 0:
                self._pos = max(self._pos, len(region) - len(PARAMETER_END) + 1)
                if self._text:
                    out.append(self._text_piece(region))
                break
            raw = _raw_value(region[self._value:e])
            if self._text:
                written = max(0, self._shown - self._value - (region[self._value] == "\n"))
                out.append(compact(raw[written:])[1:-1] + '"')
            else:
                value = type_raw_value(raw, self._props.get(self._key), untyped="string",
                                       unwrap_json_string=False)
                out.append(self._sep + compact(self._key) + ":" + compact(value))
            self._key, self._pos = None, e + len(PARAMETER_END)
        return "".join(out)

    def _text_piece(self, region: str) -> str:
        """The open string parameter's newly certain text, JSON-escaped (only new text is read)."""
        if len(region) == self._value:
            return ""
        if self._shown < 0:   # its first character decides where its text starts
            self._shown = self._value + (1 if region[self._value] == "\n" else 0)
        end = partial_start(region, (PARAMETER_END,), self._shown)
        if end > self._shown and region[end - 1] == "\n":
            end -= 1   # may be the newline _parse drops before </parameter>
        if end <= self._shown:
            return ""
        piece, self._shown = region[self._shown:end], end
        return compact(piece)[1:-1]


class Qwen3CoderToolParser(ToolParser):
    """XML-style calls whose parameter values are typed by the tool's JSON schema."""

    name = "qwen3_coder"
    start_markers = (OPEN,)
    leak_markers = LeakMarkers(
        orphan_open=(PARAMETER, FUNCTION, "<tool_use>", "<tool_response>"),
        close=(PARAMETER_END, "</function>", CLOSE, "</tool_use>", "</tool_response>"),
    )

    def _new_scanner(self) -> TagEnvelopeExtent:
        # Outside a value </tool_call> ends the envelope; inside one only </parameter> counts.
        return TagEnvelopeExtent(OPEN, CLOSE, PARAMETER, PARAMETER_END)

    def _new_stream(self) -> _Qwen3Stream:
        return _Qwen3Stream(self.schemas)

    def _parse(self, region: str) -> ParseResult:
        body = region[len(OPEN):-len(CLOSE)]
        f = body.find(FUNCTION)
        g = body.find(">", f + len(FUNCTION)) if f >= 0 else -1
        if g < 0:
            return Rejected("no <function=NAME> in the call")
        name = body[f + len(FUNCTION):g].strip()
        if not name:
            return Rejected("an empty function name")
        props = self.schemas.properties(name)
        arguments = {}
        pos = g + 1
        while (p := body.find(PARAMETER, pos)) >= 0:
            k = body.find(">", p + len(PARAMETER))
            e = body.find(PARAMETER_END, k + 1) if k >= 0 else -1
            if e < 0:
                return Rejected("a <parameter=...> without its close tag", name)
            key = body[p + len(PARAMETER):k].strip()
            raw = _raw_value(body[k + 1:e])
            arguments[key] = type_raw_value(raw, props.get(key), untyped="string",
                                            unwrap_json_string=False)
            pos = e + len(PARAMETER_END)
        return [ParsedCall(name, arguments)]
