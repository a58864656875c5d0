"""The `llama3_json` tool parser: bare JSON `{"name", "parameters"}` objects, `;`-separated.

Source: vLLM's `llama3_json` parser (Llama 3.1/3.2 JSON tool calling; an
optional `<|python_tag|>` before the object; "arguments" accepted for
"parameters"). Unlike vLLM, an object is found anywhere in the text, not only
at its start. Because a JSON object is also ordinary content, this format is
speculative: text from a `{` followed by `"name":` is held until the object
closes, and it becomes a call only if it is `{"name": <an offered tool>,
"parameters" | "arguments": {...}}`; otherwise it is sent as content, as is an
object still open at the end of generation. Without tools nothing is held.
"""
from __future__ import annotations

import re

from ..markers import WHITESPACE, skip_whitespace
from ..sanitizer import LeakMarkers
from .base import NOT_A_CALL, ParseResult, Rejected, ToolParser
from .extent import JsonExtent
from .jsoncalls import JsonCallStream, call_from_json, decode_first

PYTHON_TAG = "<|python_tag|>"
_CANDIDATE = re.compile(r"[{<]")
_NAME_KEY = '"name"'


def _object_start(buf: str, i: int) -> str:
    """Whether buf[i:] begins `{ "name" :` — "yes", "maybe" (too short to tell) or "no"."""
    j = skip_whitespace(buf, i + 1)
    if j == len(buf):
        return "maybe"
    tail = buf[j:j + len(_NAME_KEY)]
    if not _NAME_KEY.startswith(tail):
        return "no"
    if len(tail) < len(_NAME_KEY):
        return "maybe"
    j = skip_whitespace(buf, j + len(_NAME_KEY))
    if j == len(buf):
        return "maybe"
    return "yes" if buf[j] == ":" else "no"


class _Llama3Scanner:
    """One JSON object, after an optional `<|python_tag|>`; a tag not followed by `{` is alone."""

    def __init__(self):
        self._json: JsonExtent | None = None

    def advance(self, buf: str) -> int | None:
        if self._json is None:
            i = 0
            if buf.startswith(PYTHON_TAG):
                i = skip_whitespace(buf, len(PYTHON_TAG))
                if i == len(buf):
                    return None
                if buf[i] != "{":
                    return len(PYTHON_TAG)
            self._json = JsonExtent(i)
        return self._json.advance(buf)


class Llama3JsonToolParser(ToolParser):
    """Bare JSON calls; see the module doc for when an object is a call."""

    name = "llama3_json"
    speculative = True
    separators = WHITESPACE + ";"
    leak_markers = LeakMarkers(close=(PYTHON_TAG,))

    def _find_start(self, buf: str, final: bool) -> tuple[int, int]:
        pos = 0
        while (m := _CANDIDATE.search(buf, pos)) is not None:
            i = m.start()
            if buf[i] == "<":
                if buf.startswith(PYTHON_TAG, i):
                    return i, i
                if not final and PYTHON_TAG.startswith(buf[i:]):
                    return -1, i
            else:
                verdict = _object_start(buf, i)
                if verdict == "yes":
                    return i, i
                if verdict == "maybe" and not final:
                    return -1, i
            pos = i + 1
        return -1, len(buf)

    def _new_scanner(self) -> _Llama3Scanner:
        return _Llama3Scanner()

    def _new_stream(self) -> JsonCallStream:
        return JsonCallStream(self.schemas, PYTHON_TAG)

    def _parse(self, region: str) -> ParseResult:
        body = region[len(PYTHON_TAG):] if region.startswith(PYTHON_TAG) else region
        try:
            value = decode_first(body)
        except ValueError:
            return NOT_A_CALL
        if not isinstance(value, dict) or value.get("name") not in self.schemas.names:
            return NOT_A_CALL
        call = call_from_json(value, self.schemas)
        return NOT_A_CALL if isinstance(call, Rejected) else [call]
