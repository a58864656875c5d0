"""The content sanitizer: leak markers removed, only possible markers held, same result for any split."""
from __future__ import annotations

import pytest

from inference.serving.sanitizer import ContentSanitizer, LeakMarkers

POOLSIDE = LeakMarkers(orphan_open=("<arg_key>", "<arg_value>"),
                       close=("</arg_key>", "</arg_value>", "</tool_call>"),
                       envelope_open=("<tool_call>",), envelope_close=("</tool_call>",))


def sanitize(pieces, markers=POOLSIDE) -> str:
    sanitizer = ContentSanitizer(markers)
    return "".join(sanitizer.feed(p) for p in pieces) + sanitizer.flush()


@pytest.mark.parametrize(("text", "expected"), [
    ("a <arg_key>k</arg_key> b", "a  b"),
    ("a </tool_call> b </arg_value>", "a  b "),
    ("a <arg_value>v b", "a "),                          # suppressed to the end: dropped at flush
    ("a <tool_call>x<arg_key>k</arg_key></tool_call> b", "a <tool_call>x<arg_key>k</arg_key></tool_call> b"),
    ("a </arg_", "a "),                                  # a partial tag at the end is cut
    ("a <", "a <"),                                      # a lone < is kept
    ("x < y > z <b>", "x < y > z <b>"),
    ("", ""),
])
def test_it_removes_leak_markers_for_any_split(text, expected):
    assert sanitize([text]) == expected
    for k in range(len(text) + 1):
        assert sanitize([text[:k], text[k:]]) == expected, k
    assert sanitize(list(text)) == expected


def test_it_holds_back_only_what_could_become_a_marker():
    sanitizer = ContentSanitizer(POOLSIDE)
    assert sanitizer.feed("hello <arg") == "hello "
    assert sanitizer.feed("ument") == "<argument"
    assert sanitizer.feed(" <") == " "
    assert sanitizer.flush() == "<"


def test_without_markers_text_passes_unchanged_and_unbuffered():
    sanitizer = ContentSanitizer(LeakMarkers())
    assert sanitizer.feed("</tool_call> <") == "</tool_call> <"
    assert sanitizer.flush() == ""


def test_flush_ends_suppression():
    sanitizer = ContentSanitizer(POOLSIDE)
    assert sanitizer.feed("a <arg_key>secret") == "a "
    assert sanitizer.flush() == ""
    assert sanitizer.feed("b") == "b"
