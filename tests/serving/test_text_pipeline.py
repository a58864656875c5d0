"""TextPipeline end to end: reasoning then tool calls then sanitizer, split where real tokens split.

The token-boundary tests use SmolLM2-135M-Instruct's tokenizer from the model
cache ($METRALE_HOME/models/smollm2-135m-instruct/tokenizer.json, written by
`manage.py pull_model smollm2-135m-instruct`) and skip when it is not there.
"""
from __future__ import annotations

import pytest

from inference.serving.deltas import Content, ToolCallArgs, ToolCallStart

from .streaming import (
    CALL, C, R, merge, make_pipeline, run, token_pieces)
from .tool_call_cases import ALL_CASES


@pytest.mark.parametrize(("parser", "case", "text", "expected", "kwargs"), ALL_CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in ALL_CASES])
def test_it_gives_the_same_deltas_split_at_smollm2_token_boundaries(
        smollm2_tokenizer, parser, case, text, expected, kwargs):
    pieces = token_pieces(smollm2_tokenizer, text)
    assert "".join(pieces) == text
    assert len(pieces) > 1
    factory = lambda: make_pipeline(tool_parser=parser, **kwargs)  # noqa: E731
    assert merge(run(factory, pieces)) == merge(run(factory, [text])) == expected


def test_reasoning_is_never_parsed_for_calls_and_content_is_sanitized():
    text = ("<think>\nTry <tool_call>get_time</tool_call>?\n</think>\n\n"
            "Stray </arg_value> markup.\n<tool_call>get_time</tool_call>")
    pieces = list(text)
    factory = lambda: make_pipeline(reasoning_parser="think", tool_parser="poolside_v1")  # noqa: E731
    assert merge(run(factory, pieces)) == [
        R("Try <tool_call>get_time</tool_call>?"), C("Stray  markup.")] + CALL(0, "get_time", {})


def test_held_content_goes_out_before_the_call_that_follows_it():
    pipeline = make_pipeline(tool_parser="poolside_v1")
    deltas = pipeline.feed("Text <arg_") + pipeline.feed("value")
    assert deltas == [Content("Text ")]
    deltas = pipeline.feed("> dropped</arg_value><tool_call>get_time</tool_call>")
    assert [type(d) for d in deltas] == [ToolCallStart, ToolCallArgs]


def test_without_parsers_text_passes_through():
    pipeline = make_pipeline()
    assert pipeline.feed("a <tool_call> b") == [Content("a <tool_call> b")]
    assert pipeline.finish() == []
    assert pipeline.tool_calls == [] and not pipeline.should_stop and not pipeline.in_reasoning


TAGGED_FILE = {"path": "a", "content": "<think>x</think>"}
CALLS_WITH_THINK_TAGS = {
    "hermes": '<tool_call>{"name": "write_file", "arguments": '
              '{"path": "a", "content": "<think>x</think>"}}</tool_call>',
    "qwen3_coder": "<tool_call>\n<function=write_file>\n<parameter=path>\na\n</parameter>\n"
                   "<parameter=content>\n<think>x</think>\n</parameter>\n</function>\n</tool_call>",
    "poolside_v1": "<tool_call>write_file<arg_key>path</arg_key><arg_value>a</arg_value>"
                   "<arg_key>content</arg_key><arg_value><think>x</think></arg_value></tool_call>",
    "glm47": "<tool_call>write_file<arg_key>path</arg_key><arg_value>a</arg_value>"
             "<arg_key>content</arg_key><arg_value><think>x</think></arg_value></tool_call>",
    "llama3_json": '{"name": "write_file", "parameters": {"path": "a", "content": "<think>x</think>"}}',
    "pythonic": '[write_file(path="a", content="<think>x</think>")]',
}


@pytest.mark.parametrize("parser", sorted(CALLS_WITH_THINK_TAGS))
def test_reasoning_tags_inside_a_call_are_the_calls_text(parser):
    from .streaming import assert_split_invariant
    text = "<think>plan</think>" + CALLS_WITH_THINK_TAGS[parser] + "<think>more</think>Done."
    got = assert_split_invariant(
        lambda: make_pipeline(reasoning_parser="think", tool_parser=parser), text)
    assert got == [R("plan")] + CALL(0, "write_file", TAGGED_FILE) + [R("\n\nmore"), C("Done.")]
