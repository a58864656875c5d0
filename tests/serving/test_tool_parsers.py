"""Every tool-call format on scripted generations, split at every character boundary."""
from __future__ import annotations

import pytest

from .streaming import assert_split_invariant, make_pipeline
from .tool_call_cases import ALL_CASES


@pytest.mark.parametrize(("parser", "case", "text", "expected", "kwargs"), ALL_CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in ALL_CASES])
def test_it_gives_the_same_deltas_however_the_text_is_split(parser, case, text, expected, kwargs):
    got = assert_split_invariant(lambda: make_pipeline(tool_parser=parser, **kwargs), text)
    assert got == expected
