"""The `hermes` tool parser: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

Used by Qwen2.5 / Qwen3, Hermes 2-3 and SmolLM3.

Source: vLLM's `hermes` parser; the original server's `hermes` (default for
qwen3_next, qwen3_vl_moe). A `</tool_call>` inside a JSON string does not
close the call; a list of call objects inside one envelope is accepted; a bare
name inside the envelope is not JSON and is dropped, not made a call; an
envelope that never closes and holds no JSON object or array (a `<tool_call>`
followed by prose) leaves that prose as content.
"""
from __future__ import annotations

from ..markers import skip_whitespace
from ..sanitizer import LeakMarkers
from .base import ParseResult, Rejected, ToolParser
from .extent import JsonExtent
from .jsoncalls import JsonCallStream, calls_from_json, decode_first

OPEN = "<tool_call>"
CLOSE = "</tool_call>"


class _HermesScanner:
    """The envelope ends at the `</tool_call>` after the JSON value (the first one if no JSON)."""

    def __init__(self):
        self._pos = len(OPEN)
        self._json: JsonExtent | None = None
        self._close_from: int | None = None   # search for CLOSE from here

    def advance(self, buf: str) -> int | None:
        if self._close_from is None:
            if self._json is None:
                i = skip_whitespace(buf, self._pos)
                self._pos = i
                if i == len(buf):
                    return None
                if buf[i] not in "{[":
                    self._close_from = i
                else:
                    self._json = JsonExtent(i, stop=CLOSE)
            if self._json is not None:
                end = self._json.advance(buf)
                if end is None:
                    return None
                if self._json.stopped:
                    return end + len(CLOSE)
                self._close_from = end
        j = buf.find(CLOSE, self._close_from)
        if j < 0:
            self._close_from = max(self._close_from, len(buf) - len(CLOSE) + 1)
            return None
        return j + len(CLOSE)


class HermesToolParser(ToolParser):
    """`<tool_call>` + JSON object(s) + `</tool_call>`; any number of envelopes per turn."""

    name = "hermes"
    start_markers = (OPEN,)
    # The original declares no markers for hermes; we also drop a stray `</tool_call>` and a
    # hallucinated `<tool_response>` block (Qwen templates wrap tool results in it).
    leak_markers = LeakMarkers(orphan_open=("<tool_response>",),
                               close=(CLOSE, "</tool_response>"))

    def _new_scanner(self) -> _HermesScanner:
        return _HermesScanner()

    def _new_stream(self) -> JsonCallStream:
        return JsonCallStream(self.schemas, OPEN)

    def _unclosed_content(self, region: str) -> str | None:
        """An unclosed envelope whose payload is not a JSON object or array (a quoted word, prose) began no
        call: the text after `<tool_call>` stays content."""
        body = region[len(OPEN):]
        i = skip_whitespace(body, 0)
        return body[i:] if i < len(body) and body[i] not in "{[" else None

    def _parse(self, region: str) -> ParseResult:
        body = region[len(OPEN):]
        if body.endswith(CLOSE):
            body = body[:-len(CLOSE)]
        try:
            value = decode_first(body)
        except ValueError:
            return Rejected("the envelope does not hold a JSON call object")
        return calls_from_json(value, self.schemas)
