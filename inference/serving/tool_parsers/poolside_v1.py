"""The `poolside_v1` tool parser: `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...`.

Source: the original server's behaviour doc, section 4, `poolside_v1`
(Poolside's Laguna models): a value that parses as JSON is JSON, otherwise a
raw string with its whitespace kept; values are typed by the schema; a
duplicate key or an incomplete key/value pair rejects the call; only this
format turns a bare `<tool_call>NAME</tool_call>` into a zero-argument call; a
value may contain `<`, `>` and `</X` up to `</arg_value>`. A new `<tool_call>`
outside a value abandons the open one. Leak markers: orphans `<arg_key>` /
`<arg_value>`, closes `</arg_key>` / `</arg_value>` / `</tool_call>`, envelope
`<tool_call>`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..markers import skip_whitespace
from ..sanitizer import LeakMarkers
from .base import ParsedCall, ParseResult, Rejected, ToolParser
from .extent import TagEnvelopeExtent
from .schema import type_raw_value

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
KEY, KEY_END = "<arg_key>", "</arg_key>"
VALUE, VALUE_END = "<arg_value>", "</arg_value>"


@dataclass(slots=True)
class ArgEnvelope:
    """A region read as NAME + key/value pairs; `error` says why it is not well formed."""

    raw_name: str
    pairs: list[tuple[str, str]] = field(default_factory=list)
    error: str | None = None
    closed: bool = True


def read_arg_envelope(region: str) -> ArgEnvelope:
    """Split a `<tool_call>` region into its name text and raw key/value pairs."""
    closed = region.endswith(CLOSE)
    body = region[len(OPEN):len(region) - len(CLOSE) if closed else len(region)]
    first_tag = min((i for i in (body.find(t) for t in (KEY, KEY_END, VALUE, VALUE_END)) if i >= 0),
                    default=len(body))
    env = ArgEnvelope(raw_name=body[:first_tag].strip(), closed=closed)
    pos, seen = first_tag, set()
    while (pos := skip_whitespace(body, pos)) < len(body):
        if not body.startswith(KEY, pos):
            env.error = "text outside a key/value pair"
            break
        k_end = body.find(KEY_END, pos)
        v_open = body.find(VALUE, pos)
        if k_end < 0 or (0 <= v_open < k_end):
            env.error = "an incomplete key/value pair"
            break
        key = body[pos + len(KEY):k_end].strip()
        pos = skip_whitespace(body, k_end + len(KEY_END))
        v_end = body.find(VALUE_END, pos)
        if not body.startswith(VALUE, pos) or v_end < 0:
            env.error = f'an incomplete key/value pair: argument "{key}" has no value'
            break
        if key in seen:
            env.error = f'argument "{key}" appears twice'
            break
        seen.add(key)
        env.pairs.append((key, body[pos + len(VALUE):v_end]))
        pos = v_end + len(VALUE_END)
    return env


class PoolsideV1ToolParser(ToolParser):
    """Key/value calls, values JSON-or-raw and typed by the schema (see the module doc)."""

    name = "poolside_v1"
    start_markers = (OPEN,)
    leak_markers = LeakMarkers(orphan_open=(KEY, VALUE), close=(KEY_END, VALUE_END, CLOSE),
                               envelope_open=(OPEN,), envelope_close=(CLOSE,))

    def _new_scanner(self) -> TagEnvelopeExtent:
        # Ends at </tool_call>, or just before a new <tool_call> (abandoned); values are opaque.
        return TagEnvelopeExtent(OPEN, CLOSE, VALUE, VALUE_END, abandon_on_open=True)

    def _parse(self, region: str) -> ParseResult:
        env = read_arg_envelope(region)
        if not env.closed:
            return Rejected("the call was abandoned for another <tool_call>", env.raw_name or None)
        if env.error:
            return Rejected(env.error, env.raw_name or None)
        if not env.raw_name:
            return Rejected("a call without a name")
        props = self.schemas.properties(env.raw_name)
        arguments = {k: type_raw_value(v, props.get(k), untyped="json", unwrap_json_string=True)
                     for k, v in env.pairs}
        return [ParsedCall(env.raw_name, arguments)]
