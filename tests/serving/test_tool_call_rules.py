"""The rules every tool-call format shares: tool_choice, limits, rejection, fail-closed verdicts, ids."""
from __future__ import annotations

import json
import re

import pytest

from inference.serving.tool_parsers import TOOL_PARSERS, choose_tool_parser, make_tool_parser
from inference.serving.tool_parsers.base import new_call_id
from inference.serving.tool_parsers.glm47 import resolve_tool_name

from .streaming import CALL, TOOLS, C, assert_split_invariant, make_pipeline
from .tool_call_cases import ALL_CASES

ONE_CALL = {c[0]: c[2] for c in ALL_CASES if c[1] == "one_call"}
TWO_CALLS = {c[0]: c[2] for c in ALL_CASES if c[1] == "parallel_calls"}
PARIS = {"city": "Paris", "days": 3}
OSLO = {"city": "Oslo", "days": 1}


def split_result(text, **kwargs):
    return assert_split_invariant(lambda: make_pipeline(**kwargs), text)


@pytest.mark.parametrize("parser", sorted(TOOL_PARSERS))
def test_it_makes_no_calls_and_keeps_markup_out_with_tool_choice_none(parser):
    text = "Sure.\n" + ONE_CALL[parser] + "\nBye."
    # Speculative formats too: a call to an offered tool is recognised, then dropped.
    assert split_result(text, tool_parser=parser, tool_choice="none") == [C("Sure.\n\nBye.")]


@pytest.mark.parametrize("tool_choice", ["none", "auto"])
@pytest.mark.parametrize("stream_arguments", [False, True])
def test_a_stray_opener_that_never_closes_leaves_the_answer_after_it(tool_choice, stream_arguments):
    # SmolLM2 after a tool result: a `<tool_call>`, a quoted word, then its answer, and no `</tool_call>`.
    text = 'Well.\n<tool_call>\n"sunny"\n\nThe weather in Paris is indeed sunny.'
    kwargs = {"tool_parser": "hermes", "tool_choice": tool_choice, "stream_arguments": stream_arguments}
    assert split_result(text, **kwargs) == [C('Well.\n"sunny"\n\nThe weather in Paris is indeed sunny.')]
    pipeline = make_pipeline(**kwargs)
    pipeline.feed(text)
    pipeline.finish()
    assert not pipeline.tool_parser.cut_off and pipeline.tool_calls == []
    assert pipeline.tool_parser.rejected == [{"name": None, "reason": "the opener began no call and never closed"}]
    # An envelope that began a JSON object is a call cut off: dropped, and the turn says so.
    cut = make_pipeline(**kwargs)
    assert [d for d in cut.feed('<tool_call>{"name": "get_weather", "argu') + cut.finish()] == []
    assert cut.tool_parser.cut_off


@pytest.mark.parametrize("parser", sorted(TOOL_PARSERS))
def test_it_keeps_one_call_without_parallel_tool_calls_and_asks_to_stop(parser):
    pipeline = make_pipeline(tool_parser=parser, parallel_tool_calls=False)
    deltas = pipeline.feed(TWO_CALLS[parser]) + pipeline.finish()
    assert [d.name for d in deltas if type(d).__name__ == "ToolCallStart"] == ["get_weather"]
    assert len(pipeline.tool_calls) == 1
    assert pipeline.should_stop


@pytest.mark.parametrize("parser", ["hermes", "qwen3_coder", "poolside_v1", "glm47", "mistral"])
def test_it_stops_at_the_opener_of_the_call_past_the_limit(parser):
    one = ONE_CALL[parser]
    pipeline = make_pipeline(tool_parser=parser, max_calls=2)
    pipeline.feed(one + one)
    assert not pipeline.should_stop
    # Only the opener of the third call: the parser already knows the response must end.
    opener = {"mistral": "[TOOL_CALLS]"}.get(parser, "<tool_call>")
    pipeline.feed(opener)
    assert pipeline.should_stop
    assert len(pipeline.tool_calls) == 2
    assert pipeline.feed("more text") == [] and pipeline.finish() == []


def test_it_allows_twelve_calls_by_default():
    pipeline = make_pipeline(tool_parser="hermes")
    deltas = pipeline.feed(ONE_CALL["hermes"] * 13)
    assert len(pipeline.tool_calls) == 12 and pipeline.should_stop
    assert sum(type(d).__name__ == "ToolCallStart" for d in deltas) == 12


@pytest.mark.parametrize("parser", ["hermes", "qwen3_coder", "poolside_v1", "mistral"])
def test_it_drops_a_call_to_an_unknown_tool_and_records_why(parser):
    text = ONE_CALL[parser].replace("get_weather", "get_wether")
    pipeline = make_pipeline(tool_parser=parser)
    assert split_result(text, tool_parser=parser) == []
    pipeline.feed(text)
    pipeline.finish()
    assert pipeline.tool_parser.rejected[0]["name"] == "get_wether"
    assert "not offered" in pipeline.tool_parser.rejected[0]["reason"]


@pytest.mark.parametrize("parser", ["llama3_json", "pythonic"])
def test_it_keeps_a_speculative_call_to_an_unknown_tool_as_content(parser):
    text = ONE_CALL[parser].replace("get_weather", "get_wether")
    assert split_result(text, tool_parser=parser) == [C(text)]


def test_it_restricts_calls_to_a_named_tool_choice():
    choice = {"type": "function", "function": {"name": "get_time"}}
    text = ONE_CALL["hermes"] + '<tool_call>{"name": "get_time"}</tool_call>'
    assert split_result(text, tool_parser="hermes", tool_choice=choice) == CALL(0, "get_time", {})


@pytest.mark.parametrize("text", [
    "<tool_call>get_time</tool_call>",                      # a bare name is not JSON
    '<tool_call>{"name": "get_weather", "arguments": [1]}</tool_call>',
    '<tool_call>{"name": "get_weather", "arguments": {"city": }</tool_call>',
])
def test_hermes_drops_envelopes_that_are_not_calls(text):
    # Whitespace next to cut markup is held and sent with the content that follows it.
    assert split_result("A " + text + " B", tool_parser="hermes") == [C("A  B")]


def test_hermes_decodes_arguments_sent_as_a_json_string():
    text = '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}</tool_call>'
    assert split_result(text, tool_parser="hermes") == CALL(0, "get_weather", {"city": "Paris"})


def test_only_poolside_v1_makes_a_bare_name_a_call():
    assert split_result("<tool_call>get_time</tool_call>", tool_parser="poolside_v1") \
        == CALL(0, "get_time", {})
    assert split_result("<tool_call>get_time</tool_call>", tool_parser="hermes") == []


@pytest.mark.parametrize(("text", "reason"), [
    ("<tool_call>get_weather<arg_key>city</arg_key><arg_value>a</arg_value>"
     "<arg_key>city</arg_key><arg_value>b</arg_value></tool_call>", 'argument "city" appears twice'),
    ("<tool_call>get_weather<arg_key>city</arg_key></tool_call>", "incomplete key/value pair"),
    ("<tool_call>get_weather<arg_key>city</arg_key><arg_value>a</tool_call>",
     "cut off"),   # </tool_call> inside an unfinished value does not close the call
])
def test_poolside_v1_rejects_duplicate_keys_and_incomplete_pairs(text, reason):
    pipeline = make_pipeline(tool_parser="poolside_v1")
    assert split_result(text, tool_parser="poolside_v1") == []
    pipeline.feed(text)
    pipeline.finish()
    assert reason in pipeline.tool_parser.rejected[0]["reason"]


def test_poolside_v1_keeps_raw_whitespace_and_takes_json_values():
    text = ("<tool_call>write_file<arg_key>path</arg_key><arg_value> a b \n</arg_value>"
            "<arg_key>extra</arg_key><arg_value>[1, 2]</arg_value></tool_call>")
    assert split_result(text, tool_parser="poolside_v1") == CALL(
        0, "write_file", {"path": " a b \n", "extra": [1, 2]})


def test_poolside_v1_drops_a_call_abandoned_for_another():
    text = ("<tool_call>get_weather<arg_key>city</arg_key>"
            "<tool_call>get_time</tool_call>")
    assert split_result(text, tool_parser="poolside_v1") == CALL(0, "get_time", {})


@pytest.mark.parametrize(("text", "name", "reason"), [
    ("<tool_call>get_wether<arg_key>city</arg_key><arg_value>P</arg_value></tool_call>",
     "get_wether",
     'tool "get_wether" is not offered; the offered tools are: get_weather, get_time, write_file'),
    ("<tool_call>get_weather<arg_key>town</arg_key><arg_value>P</arg_value></tool_call>",
     "get_weather",
     'argument "town" is not a parameter of get_weather; its parameters are: city, days, hot, ratio'),
    ("<tool_call>{not a name}</tool_call>", "unknown_tool",
     'tool "{not a name}" is not offered; the offered tools are: get_weather, get_time, write_file'),
    ("<tool_call>get_weather<arg_key>city</arg_key><arg_value>a</arg_value>"
     "<arg_key>city</arg_key><arg_value>b</arg_value></tool_call>", "get_weather",
     'argument "city" appears twice in <tool_call>get_weather<arg_key>city</arg_key><arg_value>a'
     '</arg_value><arg_key>city</arg_key><arg_value>b</arg_value></tool_call>; '
     "its parameters are: city, days, hot, ratio"),
])
def test_glm47_refuses_a_bad_call_under_the_resolved_name(text, name, reason):
    got = split_result("A " + text + " B", tool_parser="glm47")
    assert got == [C("A")] + CALL(0, name, {"_rejected_by_server": reason}) + [C("  B")]


def test_glm47_refuses_a_call_abandoned_for_another_and_delivers_both_in_order():
    first = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>P</arg_value>"
    got = split_result(first + "<tool_call>get_time</tool_call>", tool_parser="glm47")
    assert got == CALL(0, "get_weather", {"_rejected_by_server": (
        f"the call was abandoned for another <tool_call> before it closed: {first}; "
        "its parameters are: city, days, hot, ratio")}) + CALL(1, "get_time", {})


def test_glm47_keeps_string_values_as_written_and_types_the_rest():
    text = ("<tool_call>get_weather<arg_key>city</arg_key><arg_value>42</arg_value>"
            "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>")
    assert split_result(text, tool_parser="glm47") == CALL(0, "get_weather", {"city": "42", "days": 3})


def test_glm47_reasoning_is_closed_by_a_tool_call():
    text = "I will check.<tool_call>get_time</tool_call>"
    got = split_result(text, tool_parser="glm47", reasoning_parser="glm47",
                       started_in_reasoning=True)
    assert got == [("reasoning", "I will check.")] + CALL(0, "get_time", {})


@pytest.mark.parametrize(("emitted", "resolved"), [
    ("bash", "bash"), ("bash</arg_key>", "bash"), ("bash1635", None), ("bash.x", None),
    ("bash_tool", "bash_tool"), ("bash tool", "bash"), ("zsh", None),
])
def test_glm47_resolves_names_by_exact_then_longest_prefix(emitted, resolved):
    assert resolve_tool_name(emitted, ("bash", "bash_tool", "read")) == resolved


def test_it_coerces_only_where_unambiguous():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
              "properties": {"a": {"type": ["integer", "string"]}, "b": {"type": "integer"},
                             "c": {"type": "boolean"}, "d": {"type": "integer"}}}}}]
    text = '<tool_call>{"name": "f", "arguments": {"a": "1", "b": "x", "c": "maybe", "d": 2.0}}</tool_call>'
    got = assert_split_invariant(lambda: make_pipeline(tool_parser="hermes", tools=tools), text)
    assert json.loads(got[1][2]) == {"a": "1", "b": "x", "c": "maybe", "d": 2}


def test_call_ids_look_like_openais():
    assert re.fullmatch(r"call_[A-Za-z0-9]{24}", new_call_id())
    parser = make_tool_parser("hermes", TOOLS)
    parser.feed(ONE_CALL["hermes"])
    assert re.fullmatch(r"call_[A-Za-z0-9]{24}", parser.calls[0]["id"])
    assert parser.calls[0]["arguments"] == '{"city":"Paris","days":3}'


def test_unknown_parser_names_are_a_value_error():
    with pytest.raises(ValueError, match="known: glm47, hermes"):
        make_tool_parser("nope", TOOLS)


def test_without_tools_a_speculative_format_detects_nothing():
    text = ONE_CALL["llama3_json"]
    assert split_result(text, tool_parser="llama3_json", tools=None) == [C(text)]


@pytest.mark.parametrize(("model_type", "template", "expected"), [
    ("llama", None, None),
    ("qwen2", "...<tool_call>\n{\"name\": <function-name>, ...}\n</tool_call>...", "hermes"),
    ("qwen3_5", "<tool_call>\n<function=example>\n<parameter=x>\n", "qwen3_coder"),
    ("mistral", "[AVAILABLE_TOOLS]...[TOOL_CALLS]", "mistral"),
    ("glm4_moe", "<tool_call>{{ name }}<arg_key>{{ k }}</arg_key>", "glm47"),
    ("laguna", "<tool_call>{{ name }}<arg_key>{{ k }}</arg_key>", "poolside_v1"),
    ("llama4", "[func_name1(params_name1=params_value1...)]", "pythonic"),
    ("llama", '{"name": function name, "parameters": ...} <|start_header_id|>ipython', "llama3_json"),
    ("qwen3_next", None, "hermes"),
])
def test_it_chooses_a_default_parser_from_the_template_then_the_model_type(
        model_type, template, expected):
    assert choose_tool_parser(model_type, template) == expected


HUGE = "9" * 5000  # past Python's 4,300-digit limit on int(str)
HUGE_CASES = [(c[0], c[1], c[2].replace("3", HUGE)) for c in ALL_CASES if c[1] in ("one_call", "schema_coercion")]


@pytest.mark.parametrize(("parser", "case", "text"), HUGE_CASES, ids=[f"{c[0]}-{c[1]}" for c in HUGE_CASES])
def test_an_integer_past_the_digit_limit_never_raises(parser, case, text):
    pipeline = make_pipeline(tool_parser=parser)
    deltas = pipeline.feed(text) + pipeline.finish()  # no ValueError out of int()
    for call in pipeline.tool_calls:  # delivered with the digits as the model wrote them, or rejected
        days = json.loads(call["function"]["arguments"] if "function" in call else call["arguments"])["days"]
        assert days == HUGE
    assert pipeline.tool_calls or pipeline.rejected_tool_calls or deltas
