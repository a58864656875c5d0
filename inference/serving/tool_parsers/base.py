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
- One-shot delivery (the default here; served requests stream arguments, below): a call is
  delivered only when its region is complete: ToolCallStart, then one
  ToolCallArgs whose fragment is the whole arguments object as compact JSON
  (`json.dumps(..., ensure_ascii=False, separators=(",", ":"))`, after schema
  coercion). Nothing about a call is sent before it closes, so a call cut off by
  the end of generation is never half-delivered.
- Streamed arguments (`stream_arguments=True`, what every served request uses, streamed or
  blocking: a blocking answer joins the same deltas, so the two modes agree call for call),
  for the formats that define `_new_stream` (hermes, llama3_json, qwen3_coder,
  and mistral's `NAME[ARGS]{...}` form): a CallStream reads the open region.
  Once it knows the call's name and its arguments have begun (hermes /
  llama3_json: `"name"` read, then the `"arguments"` / `"parameters"` object
  opened; qwen3_coder: `<function=NAME>` read; mistral: the `{` after
  `[ARGS]`), the call is committed if that name is offered and the call limit
  allows it (else the region is read one-shot as before): ToolCallStart goes
  out, then ToolCallArgs pieces as they become final: `{`, each argument once
  its value is complete (coerced by its property schema), and a string value
  that no coercion can change while it is written (json_stream.py has the
  rules). The closing `}` waits for the region's end, where the one-shot
  `_parse` gives the verdict: a valid call whose compact arguments start with
  what was sent gets the rest as its last piece, so a call's pieces always
  join into exactly the one-shot arguments. A committed call is never
  withdrawn: when the verdict is not that call (invalid JSON, a repeated key,
  not a call after all: a committed llama3_json object is not content) or the
  region is cut off at `finish()`, nothing more is sent for it; it is recorded
  in `rejected`, not in `calls`, and the client keeps what it got (a prefix of
  an object, never closed, so it never parses as a complete one; vLLM and
  OpenAI also leave a cut-off call as sent, and OpenAI documents that a
  call's arguments may not be valid JSON). Any call region still open at
  `finish()` sets `cut_off`: the turn's finish reason is then the engine's
  (length at max_tokens), not tool_calls, whatever calls came before it.
  Call indices count started calls, so a call
  after a broken one does not reuse its index. The other formats stay
  one-shot: mistral's JSON list and pythonic's list are valid only as a whole
  (one bad element rejects them all, or makes pythonic's text content);
  poolside_v1's values are JSON-or-raw, and a repeated key or a stray text
  anywhere rejects the call; glm47 (fail-closed) replaces a call's arguments
  by a refusal that only its end can decide.
- A region that ends at `finish()` without closing is not a call (a committed
  streamed call stays as sent: above). For the
  tag formats (hermes, qwen3_coder, mistral, poolside_v1) it is dropped and
  recorded in `rejected`: its markup is unmistakably a call, and the original
  server cuts orphan tool markup out of content. An opener whose region never
  began a call (`_unclosed_content`: hermes' `<tool_call>` followed by no JSON
  object or array, e.g. a quoted word and then prose) is not cut off: the opener
  is dropped, recorded in `rejected`, and the text after it stays content, so an
  answer written after a stray tag (tools off, or after a tool result) is kept.
  For the speculative formats (llama3_json, pythonic), whose opener is ordinary text until proven
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

import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from ..deltas import Content, StreamDelta, ToolCallArgs, ToolCallStart
from ..markers import WHITESPACE, next_marker
from ..sanitizer import LeakMarkers
from .json_stream import compact
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


class CallStream(Protocol):
    """Reads one open call region as it grows (streamed arguments, see the module doc)."""

    name: str | None   # the call's name, once its arguments have begun

    def advance(self, region: str) -> str:
        """The arguments' newly final compact-JSON text (never before `name` is set)."""


@dataclass(slots=True)
class _OpenCall:
    """A committed streamed call: the pieces sent of its arguments."""

    index: int
    id: str
    name: str
    sent: list[str] = field(default_factory=list)


class ToolParser:
    """Per-request streaming tool-call parser (see the module doc for the rules).

    tools: the request's OpenAI function tools; tool_choice: "auto",
    "required", "none" or a named function; id_factory: makes call ids
    (default `new_call_id`; inject one for deterministic tests).

    Use: `feed(text)` and `finish()` return StreamDeltas (Content,
    ToolCallStart, ToolCallArgs); `calls` lists the delivered calls as
    {"id", "name", "arguments"} with arguments a JSON object string;
    `rejected` lists {"name", "reason"} for markup that was not delivered;
    `should_stop` tells the caller to end the response. stream_arguments: send a
    call's arguments as they are generated where the format can (module doc);
    `cut_off` tells that generation ended inside a call region (a streamed call left open, or a
    region still being read).
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
                 id_factory: Callable[[], str] | None = None, stream_arguments: bool = False):
        self.schemas = ToolSchemas(tools, tool_choice)
        self.stream_arguments = stream_arguments
        self.calls_enabled = tool_choice != "none" and bool(self.schemas.names)
        self.max_calls = max_calls if parallel_tool_calls else min(max_calls, 1)
        self.calls: list[dict] = []
        self.rejected: list[dict] = []
        self.should_stop = False
        self.cut_off = False
        self._started = 0                      # calls started (delivered, or streamed and broken)
        self._new_id = id_factory or new_call_id
        self._detecting = not self.speculative or bool(self.schemas.names)
        self._buf = ""
        self._scanner: Scanner | None = None   # set while inside a call region
        self._stream: CallStream | None = None # set while an open region is read as it grows
        self._open: _OpenCall | None = None    # the committed streamed call of that region
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
            stray = self._unclosed_content(region) if self._open is None else None
            if stray is not None:
                self._call_boundary()
                self._reject(Rejected("the opener began no call and never closed"), out)
                self._content(stray, out)
            else:
                self.cut_off = True
                if self._open is not None:
                    self._end_streamed(None, "the call was cut off before it closed", out)
                else:
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

    def _unclosed_content(self, region: str) -> str | None:
        """The text after the opener of `region`, a region still open at the end of generation, where it
        never began a call (it stays content; see the module doc); None where it did (a cut-off call).
        Default: None."""
        return None

    def _new_stream(self) -> CallStream | None:
        """A reader of the growing region, for formats whose arguments stream (None: one-shot)."""
        return None

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
                at_limit = self.calls_enabled and self._started >= self.max_calls
                if at_limit and not self.speculative:
                    self._stop()
                    break
                self._scanner = self._new_scanner()
                self._stream = self._new_stream() \
                    if self.stream_arguments and self.calls_enabled and not at_limit else None
            end = self._scanner.advance(self._buf)
            if end is None:
                self._stream_open_call(out)
                break
            region, self._buf, self._scanner = self._buf[:end], self._buf[end:], None
            self._complete(region, out)
        return out

    def _stream_open_call(self, out: list[StreamDelta]) -> None:
        """Commit the open region's call once its name is known, then send what became final."""
        if self._stream is None:
            return
        fragment = self._stream.advance(self._buf)
        if self._open is None:
            name = self._stream.name
            if name is None:
                return
            if name not in self.schemas.allowed or self._started >= self.max_calls:
                self._stream = None   # read whole at its end, as one-shot
                return
            self._open = _OpenCall(self._started, self._new_id(), name)
            self._started += 1
            out.append(ToolCallStart(index=self._open.index, id=self._open.id, name=name))
        if fragment:
            out.append(ToolCallArgs(index=self._open.index, fragment=fragment))
            self._open.sent.append(fragment)

    def _end_streamed(self, result: ParseResult | None, reason: str,
                      out: list[StreamDelta]) -> None:
        """The verdict on a committed streamed call: the rest of its arguments, or it stays
        broken (recorded in `rejected` with `reason`, or the verdict's own)."""
        call, self._open, self._stream = self._open, None, None
        self._call_boundary()
        if isinstance(result, list) and len(result) == 1 and not result[0].refused \
                and result[0].name == call.name:
            arguments, sent = compact(result[0].arguments), "".join(call.sent)
            if arguments.startswith(sent):
                if len(arguments) > len(sent):
                    out.append(ToolCallArgs(index=call.index, fragment=arguments[len(sent):]))
                self.calls.append({"id": call.id, "name": call.name, "arguments": arguments})
                return
            reason = "the arguments sent differ from the call's (a repeated key)"
        elif isinstance(result, Rejected):
            reason = result.reason
        self.rejected.append({"name": call.name, "reason": reason})

    def _complete(self, region: str, out: list[StreamDelta]) -> None:
        result = self._parse(region)
        if self._open is not None:
            self._end_streamed(result, "the region is not one call to the tool streamed", out)
            return
        self._stream = None
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
        if self._started >= self.max_calls:
            self._stop()
            return
        index = self._started
        self._started += 1
        call_id = self._new_id()
        arguments = compact(call.arguments)
        out.append(ToolCallStart(index=index, id=call_id, name=call.name))
        out.append(ToolCallArgs(index=index, fragment=arguments))
        self.calls.append({"id": call_id, "name": call.name, "arguments": arguments})

    def _stop(self) -> None:
        self.should_stop = True
        self._buf = ""
        self._scanner = self._stream = self._open = None

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
