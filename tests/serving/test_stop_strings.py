"""StopStringMatcher: a stop string is cut wherever the text is split, and never streamed in part."""
import itertools

import pytest

from inference.serving.stop import StopStringMatcher

TEXT = "Hello, world! END of text"


def splits(text: str, pieces: int):
    for cuts in itertools.combinations(range(1, len(text)), pieces - 1):
        bounds = (0, *cuts, len(text))
        yield [text[a:b] for a, b in zip(bounds, bounds[1:])]


@pytest.mark.parametrize("stops, include, expected", [
    (["END"], False, "Hello, world! "), (["END"], True, "Hello, world! END"),
    (["world", "Hello"], False, ""), ([", w", "! E"], False, "Hello"), (["zzz"], False, TEXT),
    (["d! END of"], False, "Hello, worl"),
])
def test_every_two_and_three_way_split_gives_the_same_text_and_no_partial_stop(stops, include, expected):
    for parts in itertools.chain(splits(TEXT, 2), splits(TEXT, 3)):
        m = StopStringMatcher(stops, include)
        out, matched = [], False
        for part in parts:
            piece, matched = m.feed(part)
            out.append(piece)
            if matched:
                break
        if not matched:
            out.append(m.flush())
        # Pieces are never taken back, so equal concatenations mean no stop string went out in part.
        assert "".join(out) == expected, parts
        assert matched == (expected != TEXT)


def test_it_holds_back_at_most_the_longest_stop_minus_one_characters():
    m = StopStringMatcher(["abcd", "xy"])
    out, _ = m.feed("123abc")
    assert out == "123" and m.pending == "abc"
    out, _ = m.feed("q")
    assert out == "abcq" and m.pending == ""
    out, _ = m.feed("zzzzzzx")
    assert out == "zzzzzz" and m.pending == "x"
