"""The `qwen3_coder` tool parser: XML-style calls, `<function=NAME>` with `<parameter=KEY>` values.

The whole shape: `<tool_call><function=NAME><parameter=KEY>VALUE</parameter>...</function>`
then `</tool_call>`.

Source: vLLM's `qwen3_coder` parser (a value loses one leading and one
trailing newline; a string parameter keeps its text verbatim; other types are
read as JSON and typed by the schema; a parameter outside the schema stays a
string); the original server's `qwen3_coder` (default for qwen3_5(_moe),
qwen3_6_moe, holo3_1_moe, nemotron_h): a `</tool_call>` inside a
`<parameter=...>` value does not close the call, and its leak markers.
"""
from __future__ import annotations

from ..sanitizer import LeakMarkers
from .base import ParsedCall, ParseResult, Rejected, ToolParser
from .extent import TagEnvelopeExtent
from .schema import type_raw_value

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
FUNCTION = "<function="
PARAMETER = "<parameter="
PARAMETER_END = "</parameter>"


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
            raw = body[k + 1:e]
            raw = raw[1:] if raw.startswith("\n") else raw
            raw = raw[:-1] if raw.endswith("\n") else raw
            arguments[key] = type_raw_value(raw, props.get(key), untyped="string",
                                            unwrap_json_string=False)
            pos = e + len(PARAMETER_END)
        return [ParsedCall(name, arguments)]
