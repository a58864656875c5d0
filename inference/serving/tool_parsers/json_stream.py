"""Incremental JSON for streamed tool-call arguments: an object's members written as compact JSON.

A call's arguments are sent while the model writes them (base.py, "streamed
arguments"). What is sent must be final and must join into exactly the string
the one-shot path gives: `json.dumps(arguments, ensure_ascii=False,
separators=(",", ":"))` after schema coercion. So the text is read the way
`json` reads it and written the way `json.dumps` writes it:

- `JsonObjectReader` finds one object's top-level members in growing text
  (keys decoded, each value's extent), keeping its position between calls so
  each character is looked at about once; text that is not JSON stops it.
- `ArgumentsStream` writes `{`, then each member as soon as its value is
  complete (`"a":1`, then `,"b":"x"`), the value decoded by `json.loads` and
  coerced by its property schema (schema.coerce_value); a string value that no
  coercion can change (its schema has no type, or allows string) is written
  while it is open, character by character, re-escaped as `json.dumps`
  escapes (escapes are per character, so pieces join into the whole). An
  escape sequence is written only once complete, and a high-surrogate `\\uD8xx`
  only together with what follows it (`json` joins it with a following low
  surrogate). The closing `}` is never written here: it comes with the call's
  verdict, so a call that ends broken never reads as a complete object.
- A repeated key stops the stream (the one-shot dict keeps the first position
  with the last value, which text already sent cannot become).
"""
from __future__ import annotations

import json
import re
from typing import Any

from .extent import JsonExtent
from .schema import coerce_value, schema_types

_JSON_WS = " \t\n\r"
_STRING_STOP = re.compile(r'["\\]')
_SCALAR_END = re.compile(r'[,}\]\s"{\[:]')


def compact(value: Any) -> str:
    """value as the one-shot path writes arguments: compact JSON, non-ASCII kept."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _skip_ws(buf: str, pos: int) -> int:
    n = len(buf)
    while pos < n and buf[pos] in _JSON_WS:
        pos += 1
    return pos


def safe_string_end(raw: str, pos: int) -> int:
    """The largest i >= pos such that raw[:i] (a JSON string's text, no quotes, complete escapes
    up to pos) decodes piecewise: it ends between escape sequences and not after a high-surrogate
    `\\uXXXX` whose partner may follow."""
    n = len(raw)
    while True:
        i = raw.find("\\", pos)
        if i < 0:
            return n
        if i + 1 >= n:
            return i
        if raw[i + 1] != "u":
            pos = i + 2
            continue
        if i + 6 > n:
            return i
        try:
            code = int(raw[i + 2:i + 6], 16)
        except ValueError:
            return i + 6   # not an escape json accepts: decoding it fails, which stops the stream
        if not 0xD800 <= code <= 0xDBFF:
            pos = i + 6
            continue
        if i + 6 == n or (raw[i + 6] == "\\" and i + 12 > n):
            return i
        if raw.startswith("\\u", i + 6):
            try:
                low = int(raw[i + 8:i + 12], 16)
            except ValueError:
                low = -1
            pos = i + 12 if 0xDC00 <= low <= 0xDFFF else i + 6
        else:
            pos = i + 6


class JsonObjectReader:
    """The top-level members of one JSON object that starts at `start` (its `{`) in growing text.

    `advance(buf)` reads as far as buf allows. `members` lists the complete ones as
    (key, value_start, value_end), in order; while a value is being read, `open_value` is (key,
    its first index), and for a string `open_string` is (key, index after its opening quote)
    and `scanned` how far its text is known to hold only complete escapes. `closed` is set at
    the object's `}`; `error` when the text is not JSON (then nothing more is read).
    """

    def __init__(self, start: int):
        self._pos = start
        self._state = "open"
        self._key: str | None = None
        self._token = 0
        self._nested: JsonExtent | None = None
        self.members: list[tuple[str, int, int]] = []
        self.open_value: tuple[str, int] | None = None
        self.open_string: tuple[str, int] | None = None
        self.closed = False
        self.error = False

    @property
    def scanned(self) -> int:
        return self._pos

    def advance(self, buf: str) -> None:
        while not (self.closed or self.error) and self._step(buf):
            pass

    def _fail(self) -> bool:
        self.error = True
        self.open_value = self.open_string = None
        return False

    def _string_end(self, buf: str) -> int | None:
        """Index after the closing quote of the string being read, or None while it is open."""
        while True:
            m = _STRING_STOP.search(buf, self._pos)
            if m is None:
                self._pos = len(buf)
                return None
            if m.group() == "\\":
                if m.end() >= len(buf):
                    self._pos = m.start()
                    return None
                self._pos = m.end() + 1
                continue
            self._pos = m.end()
            return m.end()

    def _step(self, buf: str) -> bool:
        """One transition; False when more text is needed (or on error)."""
        state = self._state
        if state in ("in_key", "in_string"):
            end = self._string_end(buf)
            if end is None:
                return False
            if state == "in_key":
                try:
                    self._key = json.loads(buf[self._token:end])
                except ValueError:
                    return self._fail()
                self._state = "colon"
            else:
                self.open_string = None
                self._member(self._token, end)
            return True
        if state == "in_nested":
            end = self._nested.advance(buf)
            if end is None:
                return False
            self._pos = end
            self._member(self._token, end)
            return True
        if state == "in_scalar":
            m = _SCALAR_END.search(buf, self._pos)
            if m is None:
                self._pos = len(buf)
                return False
            if m.start() == self._token:
                return self._fail()
            self._pos = m.start()
            self._member(self._token, m.start())
            return True
        i = _skip_ws(buf, self._pos)
        self._pos = i
        if i == len(buf):
            return False
        ch = buf[i]
        if state == "open":
            if ch != "{":
                return self._fail()
            self._state, self._pos = "first", i + 1
        elif state in ("first", "key"):
            if ch == "}" and state == "first":
                self.closed, self._pos = True, i + 1
            elif ch == '"':
                self._state, self._token, self._pos = "in_key", i, i + 1
            else:
                return self._fail()
        elif state == "colon":
            if ch != ":":
                return self._fail()
            self._state, self._pos = "value", i + 1
        elif state == "value":
            self._token = i
            self.open_value = (self._key, i)
            if ch == '"':
                self._state, self._pos = "in_string", i + 1
                self.open_string = (self._key, i + 1)
            elif ch in "{[":
                self._state, self._nested = "in_nested", JsonExtent(i)
            else:
                self._state = "in_scalar"
        else:   # after a value
            if ch == ",":
                self._state, self._pos = "key", i + 1
            elif ch == "}":
                self.closed, self._pos = True, i + 1
            else:
                return self._fail()
        return True

    def _member(self, start: int, end: int) -> None:
        self.members.append((self._key, start, end))
        self.open_value = None
        self._state = "after"


def streams_as_text(schema: Any) -> bool:
    """Whether no coercion can change a string value of this property schema (coerce_value)."""
    types = schema_types(schema)
    return not types or "string" in types


class ArgumentsStream:
    """The compact JSON of one arguments object, written as its members arrive (module doc).

    start: the index of the object's `{` in the text `advance` is given; properties: the
    tool's property schemas by name ({} when it declares none). `advance(buf)` returns the
    newly final text (never the closing `}`); `failed` is set when the text stopped being a
    JSON object that can be written this way (nothing more is written then).
    """

    def __init__(self, start: int, properties: dict[str, Any]):
        self._reader = JsonObjectReader(start)
        self._props = properties
        self._done = 0                   # members written
        self._keys: set[str] = set()
        # An open string being written: (its content's start, written up to).
        self._string: tuple[int, int] | None = None
        self._started = False
        self.failed = False

    def advance(self, buf: str) -> str:
        if self.failed:
            return ""
        out = [] if self._started else ["{"]
        self._started = True
        reader = self._reader
        reader.advance(buf)
        try:
            for key, start, end in reader.members[self._done:]:
                self._done += 1
                if self._string is not None and self._string[0] == start + 1:
                    out.append(self._string_piece(buf, end - 1, final=True) + '"')
                    self._string = None
                    continue
                out.append(self._key_prefix(key) + compact(coerce_value(json.loads(buf[start:end]),
                                                                        self._props.get(key))))
            if reader.open_string is not None:
                key, content = reader.open_string
                if self._string is None and streams_as_text(self._props.get(key)):
                    out.append(self._key_prefix(key) + '"')
                    self._string = (content, content)
                if self._string is not None:
                    out.append(self._string_piece(buf, reader.scanned))
        except ValueError:   # a value json rejects, or a repeated key: send nothing more
            self.failed = True
            return ""
        if reader.error:
            self.failed = True
        return "".join(out)

    def _key_prefix(self, key: str) -> str:
        if key in self._keys:
            raise ValueError(f"repeated key {key!r}")
        sep = "," if self._keys else ""
        self._keys.add(key)
        return sep + compact(key) + ":"

    def _string_piece(self, buf: str, upto: int, final: bool = False) -> str:
        """The open string's newly safe characters, re-escaped; `upto`: where its known text ends
        (final: its closing quote, so all of it is safe). Only the new text is looked at."""
        content, written = self._string
        raw = buf[written:upto]
        end = len(raw) if final else safe_string_end(raw, 0)
        if end <= 0:
            return ""
        self._string = (content, written + end)
        return compact(json.loads('"' + raw[:end] + '"'))[1:-1]
