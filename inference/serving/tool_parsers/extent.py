"""Incremental scanners that find where a bracketed JSON value or Python list ends in growing text.

A tool call's text arrives a few characters at a time; rescanning it from the
start on every piece would cost O(n^2) for a long call (a file written through
a tool). These scanners keep their position and state between calls and jump
between interesting characters with a regex, so each character is looked at
about once. They only find the extent (bracket depth and string literals);
parsing is done once, on the complete text, by `json` or `ast`.
"""
from __future__ import annotations

import re

from ..markers import next_marker


class JsonExtent:
    """Finds the end of one JSON object or array that starts at `start` (a `{` or `[`).

    stop: a literal (e.g. `</tool_call>`) that, seen outside a string before
    the value closes, ends the value early: the value is malformed and the
    envelope ends there. `advance(buf)` returns the end index (exclusive), or
    None while more text is needed; `stopped` tells whether the stop literal
    ended it (then the end index is where the literal starts).
    """

    _OUTSIDE = re.compile(r'[{}\[\]"<]')
    _INSIDE = re.compile(r'["\\]')

    def __init__(self, start: int, stop: str | None = None):
        self._pos = start
        self._depth = 0
        self._in_string = False
        self._stop = stop
        self.stopped = False

    def advance(self, buf: str) -> int | None:
        while True:
            if self._in_string:
                m = self._INSIDE.search(buf, self._pos)
                if m is None:
                    self._pos = len(buf)
                    return None
                if m.group() == "\\":
                    if m.end() >= len(buf):   # the escaped character has not arrived yet
                        self._pos = m.start()
                        return None
                    self._pos = m.end() + 1
                    continue
                self._in_string = False
                self._pos = m.end()
                continue
            m = self._OUTSIDE.search(buf, self._pos)
            if m is None:
                self._pos = len(buf)
                return None
            ch, i = m.group(), m.start()
            if ch == "<":
                if self._stop is None or self._depth == 0:
                    self._pos = i + 1
                    continue
                if buf.startswith(self._stop, i):
                    self.stopped = True
                    return i
                if self._stop.startswith(buf[i:]):   # maybe the stop literal; wait
                    self._pos = i
                    return None
                self._pos = i + 1
                continue
            self._pos = i + 1
            if ch == '"':
                self._in_string = True
            elif ch in "{[":
                self._depth += 1
            else:
                self._depth -= 1
                if self._depth <= 0:
                    return i + 1


class PythonListExtent:
    """Finds the end of a Python list expression starting at `start` (a `[`), strings included.

    Handles single, double and triple quotes with backslash escapes; the
    bracket kinds are not matched against each other (`ast` checks that).
    `advance(buf)` returns the end index (exclusive) or None while more text
    is needed.
    """

    _OUTSIDE = re.compile(r"[\[\](){}'\"]")

    def __init__(self, start: int):
        self._pos = start
        self._depth = 0
        self._quote = ""   # "", or the closing delimiter: ', ", ''' or \"\"\"

    def advance(self, buf: str) -> int | None:
        while True:
            if self._quote:
                i = self._pos
                q = self._quote
                j_quote = buf.find(q, i)
                j_escape = buf.find("\\", i)
                if j_escape != -1 and (j_quote == -1 or j_escape < j_quote):
                    if j_escape + 1 >= len(buf):
                        self._pos = j_escape
                        return None
                    self._pos = j_escape + 2
                    continue
                if j_quote == -1:
                    # Keep the last len(q)-1 characters: they may start the closing delimiter.
                    self._pos = max(i, len(buf) - len(q) + 1)
                    return None
                self._pos = j_quote + len(q)
                self._quote = ""
                continue
            m = self._OUTSIDE.search(buf, self._pos)
            if m is None:
                self._pos = len(buf)
                return None
            ch, i = m.group(), m.start()
            if ch in "'\"":
                if buf.startswith(ch * 3, i):
                    self._quote = ch * 3
                elif len(buf) - i < 3 and buf[i:] == ch * (len(buf) - i):
                    self._pos = i   # could still be a triple quote
                    return None
                else:
                    self._quote = ch
                self._pos = i + len(self._quote)
                continue
            self._pos = i + 1
            if ch in "[({":
                self._depth += 1
            else:
                self._depth -= 1
                if self._depth <= 0:
                    return i + 1


class TagEnvelopeExtent:
    """Finds the end of a tag-delimited call whose values are opaque between `value_open` and
    `value_close` (so a closing tag inside a value does not end the call).

    The envelope starts with `open_tag` at index 0 and ends after `close_tag`; with
    `abandon_on_open`, a new `open_tag` outside a value ends it just before that tag (the open
    call is abandoned). `advance(buf)` returns the end index (exclusive) or None while more
    text is needed; it resumes where the last call stopped.
    """

    def __init__(self, open_tag: str, close_tag: str, value_open: str, value_close: str,
                 abandon_on_open: bool = False):
        self._open, self._close = open_tag, close_tag
        self._value_open, self._value_close = value_open, value_close
        self._markers = (value_open, close_tag, open_tag) if abandon_on_open else (value_open, close_tag)
        self._pos = len(open_tag)
        self._in_value = False

    def advance(self, buf: str) -> int | None:
        while True:
            if self._in_value:
                j = buf.find(self._value_close, self._pos)
                if j < 0:
                    self._pos = max(self._pos, len(buf) - len(self._value_close) + 1)
                    return None
                self._pos = j + len(self._value_close)
                self._in_value = False
                continue
            j, marker = next_marker(buf, self._markers, start=self._pos)
            if marker is None:
                self._pos = j
                return None
            if marker == self._close:
                return j + len(self._close)
            if marker == self._open:
                return j
            self._pos = j + len(self._value_open)
            self._in_value = True
