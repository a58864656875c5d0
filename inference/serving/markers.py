"""Literal marker search for streaming parsers: act on complete markers, hold back possible ones.

Every streaming parser here (reasoning tags, tool-call openers, the content
sanitizer) looks for fixed strings in text that arrives in arbitrary pieces.
`next_marker` decides, from the text seen so far, either "a marker starts at
j and no other marker can start before it" or "text before `hold` is plain;
text from `hold` might still become a marker". Deciding only on certainties is
what makes a parser's output independent of where the text was split.
"""
from __future__ import annotations

from collections.abc import Sequence

WHITESPACE = " \t\r\n\f\v"


def partial_start(buf: str, markers: Sequence[str], start: int = 0) -> int:
    """The smallest i >= start where buf[i:] is a proper prefix of a marker; len(buf) if none."""
    if not markers:
        return len(buf)
    longest = max(len(m) for m in markers)
    for i in range(max(start, len(buf) - longest + 1), len(buf)):
        tail = buf[i:]
        for m in markers:
            if len(tail) < len(m) and m.startswith(tail):
                return i
    return len(buf)


def find_marker(buf: str, markers: Sequence[str], start: int = 0) -> tuple[int, str] | None:
    """The earliest complete marker at or after start as (index, marker); ties go to the longest."""
    best: tuple[int, str] | None = None
    for m in markers:
        j = buf.find(m, start)
        if j != -1 and (best is None or j < best[0] or (j == best[0] and len(m) > len(best[1]))):
            best = (j, m)
    return best


def next_marker(buf: str, markers: Sequence[str], start: int = 0,
                final: bool = False) -> tuple[int, str | None]:
    """The next certain marker in buf[start:], or how far the text is certainly plain.

    Returns (j, marker) when `marker` starts at j and no marker could still start
    before j; otherwise (hold, None): buf[start:hold] is plain text and buf[hold:]
    may still become a marker. With final=True nothing more will arrive, so
    hold == len(buf).
    """
    found = find_marker(buf, markers, start)
    hold = len(buf) if final else partial_start(buf, markers, start)
    if found is not None and found[0] < hold:
        return found
    return hold, None


def skip_whitespace(buf: str, pos: int) -> int:
    """The first index >= pos that is not whitespace (len(buf) if none)."""
    n = len(buf)
    while pos < n and buf[pos] in WHITESPACE:
        pos += 1
    return pos
