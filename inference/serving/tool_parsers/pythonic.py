"""The `pythonic` tool parser: a Python list of calls, `[get_weather(city="Paris"), get_time()]`.

Source: vLLM's `pythonic` parser (Llama 3.2 / Llama 4 / ToolACE style):
keyword arguments only, values Python literals (strings, numbers, True /
False / None, lists, dicts). Unlike vLLM, the list is found anywhere in the
text, not only at its start. Because `[` is ordinary content too, this format
is speculative: text from `[` followed by `name(` is held until the list
closes, and it becomes calls only if every element is a call to an offered
tool with literal keyword arguments; otherwise it is sent as content, as is a
list still open at the end of generation. Without tools nothing is held.
Leak markers: Llama 4's `<|python_start|>` / `<|python_end|>` around the list.
"""
from __future__ import annotations

import ast
import json
import re

from ..sanitizer import LeakMarkers
from .base import NOT_A_CALL, ParsedCall, ParseResult, ToolParser
from .extent import PythonListExtent
from .schema import coerce_arguments

_OPENER = re.compile(r"\[\s*[A-Za-z_][A-Za-z0-9_]*\s*(\()?")


def _list_start(buf: str, i: int) -> str:
    """Whether buf[i:] begins `[ name (` — "yes", "maybe" (too short to tell) or "no"."""
    m = _OPENER.match(buf, i)
    if m is None:
        rest = buf[i + 1:].lstrip()
        return "maybe" if not rest else "no"
    if m.group(1):
        return "yes"
    return "maybe" if m.end() == len(buf) else "no"


class _PythonicScanner:
    def __init__(self):
        self._extent = PythonListExtent(0)

    def advance(self, buf: str) -> int | None:
        return self._extent.advance(buf)


class PythonicToolParser(ToolParser):
    """A Python list of keyword-argument calls; see the module doc for when it is a call."""

    name = "pythonic"
    speculative = True
    leak_markers = LeakMarkers(close=("<|python_start|>", "<|python_end|>"))

    def _find_start(self, buf: str, final: bool) -> tuple[int, int]:
        pos = 0
        while (i := buf.find("[", pos)) >= 0:
            verdict = _list_start(buf, i)
            if verdict == "yes":
                return i, i
            if verdict == "maybe" and not final:
                return -1, i
            pos = i + 1
        return -1, len(buf)

    def _new_scanner(self) -> _PythonicScanner:
        return _PythonicScanner()

    def _parse(self, region: str) -> ParseResult:
        try:
            tree = ast.parse(region, mode="eval").body
        except (SyntaxError, ValueError):
            return NOT_A_CALL
        if not isinstance(tree, ast.List) or not tree.elts:
            return NOT_A_CALL
        calls = []
        for node in tree.elts:
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)) or node.args \
                    or node.func.id not in self.schemas.names:
                return NOT_A_CALL
            arguments = {}
            for kw in node.keywords:
                if kw.arg is None:
                    return NOT_A_CALL
                try:
                    arguments[kw.arg] = ast.literal_eval(kw.value)
                    json.dumps(arguments[kw.arg])   # sets, bytes, complex: not JSON
                except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                    return NOT_A_CALL
            name = node.func.id
            arguments = coerce_arguments(arguments, self.schemas.parameters(name))
            calls.append(ParsedCall(name, arguments))
        return calls
