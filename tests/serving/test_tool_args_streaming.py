"""Streamed tool-call arguments (hermes, llama3_json, qwen3_coder, mistral): pieces while the model writes
them, joining into the one-shot arguments; the formats that stay one-shot give their one-shot deltas.

Every split of every scripted generation (tool_call_cases.py) is run with `stream_arguments`:
the merged deltas equal the one-shot ones, except a call cut off after it was committed (it
stays as sent). For calls with several arguments, the pieces are checked one by one: more than
one, the first before the call's closing markup arrives, each split's pieces joining into the
one-shot string. The SmolLM2 token-boundary runs skip when its tokenizer is not cached.
"""
from __future__ import annotations

import json

import pytest

from inference.serving.deltas import ToolCallArgs, ToolCallStart
from inference.serving.tool_parsers.json_stream import ArgumentsStream, compact
from inference.serving.tool_parsers.schema import coerce_arguments

from .streaming import TOOLS, C, merge, make_pipeline, run, token_pieces
from .tool_call_cases import ALL_CASES

STREAMING = ("hermes", "llama3_json", "qwen3_coder", "mistral")

# The truncated cases of the streaming formats: the call is committed, then cut off.
CUT_OFF = {
    "hermes": [C("Checking."), ("call", 0, "call_0", "get_weather"), ("args", 0, '{"city":"Par')],
    "llama3_json": [C("Checking."), ("call", 0, "call_0", "get_weather"), ("args", 0, '{"city":"Par')],
    "qwen3_coder": [C("Checking."), ("call", 0, "call_0", "get_weather"), ("args", 0, '{"city":"Par')],
    "mistral": [C("Checking."), ("call", 0, "call_0", "get_weather"), ("args", 0, '{"city":"Par')],
}


def streamed(parser: str, **kwargs):
    return lambda: make_pipeline(tool_parser=parser, stream_arguments=True, **kwargs)


def splits(text: str):
    for k in range(len(text) + 1):
        yield [text[:k], text[k:]]
    yield list(text)


@pytest.mark.parametrize(("parser", "case", "text", "expected", "kwargs"), ALL_CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in ALL_CASES])
def test_it_streams_to_the_one_shot_deltas_however_the_text_is_split(parser, case, text, expected, kwargs):
    if case == "truncated_call" and parser in STREAMING:
        expected = CUT_OFF[parser]
    for pieces in splits(text):
        assert merge(run(streamed(parser, **kwargs), pieces)) == expected, pieces


# Several arguments each, coerced ones among them; the text before the closing markup.
SEVERAL = {
    "hermes": ('Sure.\n<tool_call>\n{"name": "write_file", "arguments": {"path": "dir/a.txt", '
               '"content": "line 1\\nline \\"2\\" \\u00e9\\ud83d\\ude00 ok", "options": {"mode": [1, 2]}}}\n',
               "</tool_call>"),
    "llama3_json": ('{"name": "get_weather", "parameters": {"city": "São Paulo", "days": "3", '
                    '"hot": "yes", "ratio": 0.5}', "}"),
    "qwen3_coder": ("<tool_call>\n<function=write_file>\n<parameter=path>\ndir/a.txt\n</parameter>\n"
                    "<parameter=content>\nline 1\nline \"2\" é </x>\n\n</parameter>\n"
                    "<parameter=options>\n{\"mode\": [1, 2]}\n</parameter>\n</function>\n",
                    "</tool_call>"),
    "mistral": ('Sure.[TOOL_CALLS]get_weather[CALL_ID]abc123[ARGS] {"city": "Lyon", "days": "2", '
                '"hot": false, "ratio": "0.25"', "}"),
}


def _fragments(deltas) -> list[str]:
    return [d.fragment for d in deltas if isinstance(d, ToolCallArgs)]


def _one_shot_arguments(parser: str, text: str) -> str:
    pipeline = make_pipeline(tool_parser=parser)
    pipeline.feed(text)
    pipeline.finish()
    [call] = pipeline.tool_calls
    return call["arguments"]


@pytest.mark.parametrize("parser", STREAMING)
def test_a_call_with_several_arguments_streams_pieces_before_it_closes(parser):
    head, close = SEVERAL[parser]
    one_shot = _one_shot_arguments(parser, head + close)
    pipeline = streamed(parser)()
    before = []
    for ch in head:
        before += pipeline.feed(ch)
    starts = [d for d in before if isinstance(d, ToolCallStart)]
    assert len(starts) == 1
    pieces = _fragments(before)
    assert len(pieces) > 2, "arguments go out while the call is still open"
    assert one_shot.startswith("".join(pieces)) and "".join(pieces) != one_shot
    after = pipeline.feed(close) + pipeline.finish()
    assert "".join(pieces + _fragments(after)) == one_shot
    assert pipeline.tool_calls == [{"id": "call_0", "name": starts[0].name, "arguments": one_shot}]


@pytest.mark.parametrize("parser", STREAMING)
def test_every_split_of_a_call_joins_into_the_one_shot_arguments(parser):
    text = "".join(SEVERAL[parser])
    one_shot = _one_shot_arguments(parser, text)
    for pieces in splits(text):
        deltas = run(streamed(parser), pieces)
        assert "".join(_fragments(deltas)) == one_shot, pieces


@pytest.mark.parametrize("parser", STREAMING)
def test_token_splits_stream_several_pieces_that_join_into_the_one_shot_arguments(smollm2_tokenizer, parser):
    text = "".join(SEVERAL[parser])
    pieces = token_pieces(smollm2_tokenizer, text)
    assert "".join(pieces) == text
    deltas = run(streamed(parser), pieces)
    assert len(_fragments(deltas)) > 2
    assert "".join(_fragments(deltas)) == _one_shot_arguments(parser, text)


@pytest.mark.parametrize(("parser", "case", "text", "expected", "kwargs"),
                         [c for c in ALL_CASES if c[0] in STREAMING],
                         ids=[f"{c[0]}-{c[1]}" for c in ALL_CASES if c[0] in STREAMING])
def test_token_splits_of_the_scripted_cases_stream_the_one_shot_deltas(
        smollm2_tokenizer, parser, case, text, expected, kwargs):
    if case == "truncated_call":
        expected = CUT_OFF[parser]
    assert merge(run(streamed(parser, **kwargs), token_pieces(smollm2_tokenizer, text))) == expected


def test_one_shot_delivery_still_gives_one_piece_per_call():
    head, close = SEVERAL["hermes"]
    deltas = run(lambda: make_pipeline(tool_parser="hermes"), list(head + close))
    assert len(_fragments(deltas)) == 1


# -- calls that go wrong after they were committed ------------------------------------------

def _streamed_run(parser: str, text: str, **kwargs):
    pipeline = streamed(parser, **kwargs)()
    out = []
    for ch in text:
        out += pipeline.feed(ch)
    return pipeline, merge(out + pipeline.finish())


def test_a_cut_off_call_stays_as_sent_and_is_not_delivered():
    pipeline, merged = _streamed_run("hermes", '<tool_call>{"name": "get_weather", "arguments": '
                                               '{"city": "Oslo", "days": 2, "hot"')
    assert merged == [("call", 0, "call_0", "get_weather"), ("args", 0, '{"city":"Oslo","days":2')]
    assert pipeline.tool_calls == [] and pipeline.tool_call_cut_off
    assert pipeline.rejected_tool_calls == [{"name": "get_weather",
                                             "reason": "the call was cut off before it closed"}]


def test_a_region_cut_before_its_call_began_still_ends_the_turn_for_length():
    # A whole call, then one cut inside its opener: nothing of it was sent, but the turn was cut.
    whole = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>\n'
    pipeline, merged = _streamed_run("hermes", whole + '<tool_call>{"na')
    assert merged == [("call", 0, "call_0", "get_weather"), ("args", 0, '{"city":"Oslo"}')]
    assert [c["name"] for c in pipeline.tool_calls] == ["get_weather"] and pipeline.tool_call_cut_off


def test_a_repeated_key_leaves_the_call_broken_and_the_next_call_takes_the_next_index():
    text = ('<tool_call>{"name": "get_weather", "arguments": {"city": "A", "days": 1, "city": "B"}}'
            '</tool_call><tool_call>{"name": "get_time", "arguments": {}}</tool_call>')
    pipeline, merged = _streamed_run("hermes", text)
    assert merged == [("call", 0, "call_0", "get_weather"), ("args", 0, '{"city":"A","days":1'),
                      ("call", 1, "call_1", "get_time"), ("args", 1, "{}")]
    assert [c["name"] for c in pipeline.tool_calls] == ["get_time"]
    assert pipeline.rejected_tool_calls[0]["name"] == "get_weather"
    assert not pipeline.tool_call_cut_off


def test_a_malformed_envelope_after_committed_arguments_is_not_delivered():
    # The one-shot path rejects it (the outer object never closes before </tool_call>).
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}</tool_call> after'
    pipeline, merged = _streamed_run("hermes", text)
    assert merged == [("call", 0, "call_0", "get_weather"), ("args", 0, '{"city":"Rome"'), C("after")]
    assert pipeline.tool_calls == []


def test_a_committed_llama3_json_object_that_turns_out_invalid_is_not_content():
    text = '{"name": "get_weather", "parameters": {"city": "Rome"} oops} more'
    pipeline, merged = _streamed_run("llama3_json", text)
    assert merged[:2] == [("call", 0, "call_0", "get_weather"), ("args", 0, '{"city":"Rome"')]
    assert pipeline.tool_calls == [] and "oops" not in json.dumps(merged)


@pytest.mark.parametrize(("parser", "text"), [
    ("hermes", '<tool_call>{"name": "nope", "arguments": {"a": 1}}</tool_call>'),
    ("hermes", '<tool_call>{"arguments": {"city": "Rome"}, "name": "get_weather"}</tool_call>'),
    ("hermes", '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Rome\\"}"}</tool_call>'),
    ("hermes", '<tool_call>[{"name": "get_weather", "arguments": {"city": "Rome"}}]</tool_call>'),
    ("qwen3_coder", "<tool_call>\n<function=nope>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>"),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Rome"}}]'),
])
def test_calls_that_cannot_stream_are_read_whole_as_before(parser, text):
    """An unoffered name, the name after the arguments, string arguments, a list of calls."""
    one_shot = merge(run(lambda: make_pipeline(tool_parser=parser), [text]))
    for pieces in splits(text):
        deltas = run(streamed(parser), pieces)
        assert merge(deltas) == one_shot
        assert len(_fragments(deltas)) <= 1


def test_the_call_limit_is_kept_while_streaming():
    call = '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    pipeline, merged = _streamed_run("hermes", call * 3, parallel_tool_calls=False)
    assert merged == [("call", 0, "call_0", "get_time"), ("args", 0, "{}")]
    assert pipeline.should_stop


# -- the arguments writer itself -----------------------------------------------------------

PROPS = TOOLS[0]["function"]["parameters"]["properties"]
OBJECTS = [
    '{}', '{ }', '{"city": "Paris"}',
    '{"city": "a\\"b\\\\c\\/d\\b\\f\\n\\r\\t\\u0001\\u00e9\\u2028 \\ud83d\\ude00 \\ud83d x \\ude00 '
    '\\ud800\\ud800\\udc00", "days": "3", "hot": "no", "ratio": "1e2"}',
    '{"days": 3.0, "ratio": 2, "x": NaN, "y": -Infinity, "z": [1, {"q": "}"}], "n": null, "t": true}',
    '{"é": "ü€", "k" : [ ] , "w" :{"days": "4"} }',
    '{"city": "\\ud83d"}',
]


@pytest.mark.parametrize("text", OBJECTS)
def test_the_arguments_writer_gives_the_one_shot_json_on_every_split(text):
    one_shot = compact(coerce_arguments(json.loads(text), {"properties": PROPS}))
    for pieces in splits(text):
        stream, buf, sent = ArgumentsStream(0, PROPS), "", ""
        for piece in pieces:
            buf += piece
            sent += stream.advance(buf)
        assert not stream.failed
        assert sent + "}" == one_shot, pieces


@pytest.mark.parametrize(("text", "sent_before"), [
    ('{"a": 1, "a": 2}', '{"a":1'), ('{"a": tru }', "{"), ('{"a": "\x01"}', '{"a":"'), ('{"a" 1}', "{"),
    ('{"a": 1,}', '{"a":1'), ('{"a": "\\x"}', '{"a":"'), ('{"a": 01}', "{")])
def test_the_arguments_writer_stops_where_json_or_the_one_shot_dict_would_disagree(text, sent_before):
    stream, buf, sent = ArgumentsStream(0, {}), "", ""
    for ch in text:
        buf += ch
        sent += stream.advance(buf)
    assert stream.failed
    assert sent == sent_before
