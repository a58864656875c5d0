"""ToolParser: the streaming state machine every tool-call format shares (content, call, verdict).

A format subclass says where a call region starts (`_find_start`), where it
ends (`_new_scanner`), and what it means (`_parse`). The base class turns
regions into deltas under one set of rules:

- Text outside call regions is Content: the text with the calls cut out.
  Only text that could still start a call is held back, plus trailing
  whitespace until it is known not to end the content. Whitespace is
  dropped where a cut call leaves it at an edge of the content: before the
  first content when a call came first, after the last content when any call
  was cut (so calls separated only by newlines leave no content). Whitespace
  between content and a call stays, llama3_json's `;` between two calls goes,
  and a turn without calls keeps its text exactly.
- A call is delivered only when its region is complete: ToolCallStart, then
  one ToolCallArgs whose fragment is the whole arguments object as compact
  JSON. Nothing about a call is sent before it closes, so a call cut off by the
  end of generation is never half-delivered.
- A region that ends at `finish()` without closing is not a call. For the
  tag formats (hermes, qwen3_coder, mistral, poolside_v1) it is dropped and
  recorded in `rejected`: its markup is unmistakably a call, and the original
  server cuts orphan tool markup out of content. For the speculative formats
  (llama3_json, pythonic), whose opener is ordinary text until proven
  otherwise, it stays content. glm47 (fail-closed) overrides: it delivers a
  refused call.
- A complete region that does not yield a valid call (bad JSON, a bare name,
  arguments that are not an object, an unknown tool) is dropped and recorded
  in `rejected`; nothing is turned into content, nothing is repaired.
- `tool_choice` "none" (or no tools at all): no calls; tag-format markup is
  still taken out of content. Speculative formats detect nothing without tools.
- At most `max_calls` calls (1 when `parallel_tool_calls` is false); the
  opener of one more call sets `should_stop` and the parser stops: the
  response should end (the original server's
  METRALE_MAX_TOOL_CALLS_PER_RESPONSE, default 12: "the 13th trips the stop
  flag").
"""
from __future__ import annotations

import json
import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Protocol

from ..deltas import Content, StreamDelta, ToolCallArgs, ToolCallStart
from ..markers import WHITESPACE, next_marker
from ..sanitizer import LeakMarkers
from .schema import ToolSchemas

DEFAULT_MAX_CALLS = 12
_ID_ALPHABET = string.ascii_letters + string.digits


def new_call_id() -> str:
    """A tool call id in OpenAI's shape: `call_` and 24 random letters and digits."""
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


@dataclass(slots=True)
class ParsedCall:
    """One call read from a region. refused: a fail-closed verdict, delivered whatever its name."""

    name: str
    arguments: dict
    refused: bool = False


@dataclass(slots=True)
class Rejected:
    """A region that is tool markup but not a valid call; dropped and recorded."""

    reason: str
    name: str | None = None


class NotACall:
    """A speculative region (llama3_json, pythonic) that turned out to be ordinary text."""


NOT_A_CALL = NotACall()
ParseResult = list[ParsedCall] | Rejected | NotACall


class Scanner(Protocol):
    def advance(self, region: str) -> int | None:
        """The end (exclusive) of the complete call region, or None while more text is needed."""


class ToolParser:
    """Per-request streaming tool-call parser (see the module doc for the rules).

    tools: the request's OpenAI function tools; tool_choice: "auto",
    "required", "none" or a named function; id_factory: makes call ids
    (default `new_call_id`; inject one for deterministic tests).

    Use: `feed(text)` and `finish()` return StreamDeltas (Content,
    ToolCallStart, ToolCallArgs); `calls` lists the delivered calls as
    {"id", "name", "arguments"} with arguments a JSON object string;
    `rejected` lists {"name", "reason"} for markup that was not delivered;
    `should_stop` tells the caller to end the response.
    """

    name: ClassVar[str] = ""
    leak_markers: ClassVar[LeakMarkers] = LeakMarkers()
    start_markers: ClassVar[tuple[str, ...]] = ()
    # Speculative formats: the opener is ordinary text until the region parses as a call.
    speculative: ClassVar[bool] = False
    # What may sit between two calls: dropped there and after the last call (see module doc).
    separators: ClassVar[str] = WHITESPACE

    def __init__(self, tools: list[dict] | None = None, *, tool_choice: str | dict | None = "auto",
                 parallel_tool_calls: bool = True, max_calls: int = DEFAULT_MAX_CALLS,
                 id_factory: Callable[[], str] | None = None):
        self.schemas = ToolSchemas(tools, tool_choice)
        self.calls_enabled = tool_choice != "none" and bool(self.schemas.names)
        self.max_calls = max_calls if parallel_tool_calls else min(max_calls, 1)
        self.calls: list[dict] = []
        self.rejected: list[dict] = []
        self.should_stop = False
        self._new_id = id_factory or new_call_id
        self._detecting = not self.speculative or bool(self.schemas.names)
        self._buf = ""
        self._scanner: Scanner | None = None   # set while inside a call region
        self._pending = ""                     # trailing whitespace (separators) not yet sent
        self._content_started = False          # some non-whitespace content was sent
        self._after_call = False               # only separators since the last call region
        self._cut_any = False                  # some call region was cut out of the text

    # -- the streaming interface -------------------------------------------------------------

    @property
    def in_call(self) -> bool:
        """True while the text fed so far ends inside an open call region."""
        return self._scanner is not None

    def feed(self, text: str) -> list[StreamDelta]:
        """Deltas for text that is certain now; a possible call opener or an open call is held."""
        if self.should_stop or not text:
            return []
        self._buf += text
        return self._drain(final=False)

    def finish(self) -> list[StreamDelta]:
        """Deltas for everything still held, at the end of generation (see the module doc)."""
        if self.should_stop:
            return []
        out = self._drain(final=True)
        if self._scanner is not None and not self.should_stop:
            region, self._buf, self._scanner = self._buf, "", None
            self._truncated(region, out)
        if self._pending and not self._cut_any:
            out.append(Content(self._pending))
        self._pending = ""
        return out

    # -- what a format defines ---------------------------------------------------------------

    def _find_start(self, buf: str, final: bool) -> tuple[int, int]:
        """(start, hold): start is where a call region certainly begins (-1 if none); text from
        hold (== len(buf) when nothing is pending) could still begin one. Default: the literal
        `start_markers`."""
        j, marker = next_marker(buf, self.start_markers, final=final)
        return (j, j) if marker is not None else (-1, j)

    def _new_scanner(self) -> Scanner:
        raise NotImplementedError

    def _parse(self, region: str) -> ParseResult:
        raise NotImplementedError

    # -- the state machine -------------------------------------------------------------------

    def _drain(self, final: bool) -> list[StreamDelta]:
        out: list[StreamDelta] = []
        while self._buf and not self.should_stop:
            if self._scanner is None:
                start, hold = self._find_start(self._buf, final) if self._detecting \
                    else (-1, len(self._buf))
                if start < 0:
                    self._content(self._buf[:hold], out)
                    self._buf = self._buf[hold:]
                    break
                self._content(self._buf[:start], out)
                self._buf = self._buf[start:]
                at_limit = self.calls_enabled and len(self.calls) >= self.max_calls
                if at_limit and not self.speculative:
                    self._stop()
                    break
                self._scanner = self._new_scanner()
            end = self._scanner.advance(self._buf)
            if end is None:
                break
            region, self._buf, self._scanner = self._buf[:end], self._buf[end:], None
            self._complete(region, out)
        return out

    def _complete(self, region: str, out: list[StreamDelta]) -> None:
        result = self._parse(region)
        if isinstance(result, NotACall):
            self._content(region, out)
            return
        self._call_boundary()
        if isinstance(result, Rejected):
            self._reject(result, out)
            return
        for call in result:
            if self.should_stop:
                break
            self._accept(call, out)

    def _truncated(self, region: str, out: list[StreamDelta]) -> None:
        """A region still open at the end of generation."""
        if self.speculative:
            self._content(region, out)
        else:
            self._call_boundary()
            self._reject(Rejected("the call was cut off before it closed"), out)

    def _reject(self, rejected: Rejected, out: list[StreamDelta]) -> None:
        self.rejected.append({"name": rejected.name, "reason": rejected.reason})

    def _accept(self, call: ParsedCall, out: list[StreamDelta]) -> None:
        if not self.calls_enabled:
            self._reject(Rejected("tool_choice is none or no tools were given", call.name), out)
            return
        if not call.refused and call.name not in self.schemas.allowed:
            offered = ", ".join(self.schemas.allowed) or "none"
            self._reject(Rejected(f'tool "{call.name}" is not offered; offered: {offered}',
                                  call.name), out)
            return
        if len(self.calls) >= self.max_calls:
            self._stop()
            return
        index = len(self.calls)
        call_id = self._new_id()
        arguments = json.dumps(call.arguments, ensure_ascii=False, separators=(",", ":"))
        out.append(ToolCallStart(index=index, id=call_id, name=call.name))
        out.append(ToolCallArgs(index=index, fragment=arguments))
        self.calls.append({"id": call_id, "name": call.name, "arguments": arguments})

    def _stop(self) -> None:
        self.should_stop = True
        self._buf = ""
        self._scanner = None

    # -- content and the whitespace next to calls --------------------------------------------

    def _call_boundary(self) -> None:
        """A call region was cut out here."""
        if not self._content_started:
            self._pending = ""
        elif self._after_call:   # only separators since the previous call: keep their whitespace
            self._pending = "".join(c for c in self._pending if c in WHITESPACE)
        self._after_call = True
        self._cut_any = True

    def _content(self, text: str, out: list[StreamDelta]) -> None:
        if not text:
            return
        text = self._pending + text
        if self._after_call:
            if not text.lstrip(self.separators):
                self._pending = text
                return
            self._after_call = False
        body = text.rstrip(WHITESPACE)
        self._pending = text[len(body):]
        if body:
            if not self._content_started and self._cut_any:
                body = body.lstrip(WHITESPACE)
            out.append(Content(body))
            self._content_started = True
