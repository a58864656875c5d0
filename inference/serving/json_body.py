"""The one strict JSON body parser of every JSON route: UTF-8, RFC 8259 JSON, a depth limit, Unicode text only.

Python's json module accepts what is not JSON (NaN, Infinity, numbers that overflow to
inf, lone UTF-16 surrogates such as "\\ud800") and fails in ways that are not a client's
error (RecursionError past ~1,000 levels, ValueError past 4,300 digits). Each of those is a
400 here, naming the field (`messages[0].content`, `metadata.a`) where a value is at fault,
so nothing downstream (tokenizers, SSE encoders, the database) ever sees one. So is U+0000
in a string: PostgreSQL can store it neither in text nor in jsonb, and stored requests,
responses and conversations hold the request's text.

Source: RFC 8259 (JSON: no NaN or Infinity; strings are Unicode text, so an unpaired
surrogate escape is not a character), OpenAI's API (bodies are UTF-8 JSON objects; bad input
is a 400 invalid_request_error).
"""
from __future__ import annotations

import json
import math
import re
from itertools import accumulate

from .errors import bad_request

# Deeper than any request this server reads needs (a tool schema nested 50 levels is ~105); shallow
# enough that every recursive step after parsing (serializers, templates, llguidance) has room.
MAX_JSON_DEPTH = 128
# Escapes of a UTF-16 surrogate (valid pairs decode to one character, lone ones stay surrogates) and of
# U+0000; JSON has no other way to put either in a string (raw control characters are invalid there).
_SUSPECT_ESCAPE = re.compile(r"\\u(?:[dD][89a-fA-F]|0000)")
# After escapes are gone and all but brackets and quotes deleted, a JSON string is two quotes.
_QUOTED = re.compile(rb'"[^"]*"')
# bytes.translate: "[" and "{" -> 1, "]" and "}" -> -1 (as int8); other bytes are deleted first.
_DEPTH_STEPS = bytes(1 if c in b"[{" else 255 if c in b"]}" else 0 for c in range(256))
_NOT_STRUCTURE = bytes(c for c in range(256) if c not in b'[]{}"')


class _Rejected:
    """What the decoder hooks put in place of a value that is not JSON (found afterwards, with its path)."""

    __slots__ = ("why",)

    def __init__(self, why: str):
        self.why = why


def parse_json_body(raw: bytes) -> dict:
    """The request body (bytes) as a JSON object (dict).

    Raises ApiError 400 (code invalid_json) for bytes that are not UTF-8, text that is not JSON
    (NaN and Infinity included), nesting deeper than MAX_JSON_DEPTH and a body that is not an
    object; and a 400 whose `param` is the value's path for an integer literal longer than
    Python's int-string limit (sys.get_int_max_str_digits()), a number that overflows a double,
    and a string or key holding a lone UTF-16 surrogate or U+0000.
    """
    try:
        text = (raw or b"").decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request(f"The request body is not valid UTF-8 (byte {exc.start}: {exc.reason}).",
                          code="invalid_json") from None
    check_depth(raw or b"")
    rejected: list[_Rejected] = []

    def reject(why: str):
        marker = _Rejected(why)
        rejected.append(marker)
        return marker

    def number(literal: str):
        value = float(literal)
        return value if math.isfinite(value) else reject(f"the number {literal[:40]} is too large for a double")

    def constant(name: str):
        return reject(f"{name} is not JSON")

    def integer(literal: str):
        try:
            return int(literal)
        except ValueError:  # past sys.get_int_max_str_digits()
            return reject(f"an integer literal of {len(literal)} digits is too long")

    try:
        body = _decode(text, parse_float=number, parse_constant=constant)
    except ValueError:  # an integer literal past Python's int-string limit: decode again to find its path
        body = _decode(text, parse_float=number, parse_constant=constant, parse_int=integer)
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.", code="invalid_json")
    if rejected or (_SUSPECT_ESCAPE.search(text) if "\\u" in text else None):
        _raise_first_problem(body)
    return body


def _decode(text: str, **hooks):
    """json's decoder with `hooks`; its syntax errors as ApiError 400 (other ValueErrors pass)."""
    try:
        return json.JSONDecoder(**hooks).decode(text)
    except json.JSONDecodeError as exc:
        raise bad_request(f"We could not parse the JSON body of your request: {exc}", code="invalid_json") from None
    except RecursionError:  # check_depth makes this unreachable; kept as the last guard
        raise _too_deep() from None


def _too_deep():
    return bad_request(f"The JSON body is nested more than {MAX_JSON_DEPTH} levels deep.", code="invalid_json")


def check_depth(raw: bytes) -> None:
    """Raise ApiError 400 (code invalid_json) when arrays and objects in the JSON text `raw` nest deeper than
    MAX_JSON_DEPTH, before parsing (the parser recurses per level; request bodies, batch input lines). Fewer
    brackets than the limit cannot nest past it, so most bodies cost two counts; others keep only their
    structure (escaped backslashes and quotes removed first, so every quote left delimits a string; UTF-8
    never repeats an ASCII byte inside a character), lose their strings, and have the brackets' running
    depth taken."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_JSON_DEPTH:
        return
    structure = raw.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_STRUCTURE)
    steps = _QUOTED.sub(b"", structure).translate(_DEPTH_STEPS, b'"')
    if max(accumulate(memoryview(steps).cast("b")), default=0) > MAX_JSON_DEPTH:
        raise _too_deep()


def _path(parent: str, key) -> str:
    if isinstance(key, int):
        return f"{parent}[{key}]"
    return f"{parent}.{key}" if parent else str(key)


def _text_problem(s: str) -> str | None:
    """Why `s` is not text this server takes (None when it is)."""
    if "\x00" in s:
        return "U+0000 (NUL), which this server cannot store"
    if s.isascii():
        return None
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return "a lone UTF-16 surrogate, which is not Unicode text"
    return None


def _raise_first_problem(body: dict) -> None:
    """Raise the 400 of the first rejected value, lone surrogate or U+0000 in `body` (depth-first, in order)."""
    stack: list[tuple[str, object]] = [("", body)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, _Rejected):
            raise bad_request(f"Invalid value for '{path}': {value.why}.", param=path or None)
        if isinstance(value, str):
            problem = _text_problem(value)
            if problem is not None:
                raise bad_request(f"Invalid value for '{path}': the string holds {problem}.", param=path or None)
        elif isinstance(value, dict):
            for key in value:
                problem = _text_problem(key)
                if problem is not None:
                    raise bad_request(f"Invalid key in '{path or 'the body'}': it holds {problem}.",
                                      param=path or None)
            stack.extend((_path(path, k), v) for k, v in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((_path(path, i), v) for i, v in reversed(list(enumerate(value))))


__all__ = ["MAX_JSON_DEPTH", "parse_json_body"]
