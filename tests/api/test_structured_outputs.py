"""Structured-output fields through the whole stack (scripted engine): each choice gets the compiled grammar."""
import json

import pytest

from inference.engine.grammar import GrammarCompiler, GrammarSpec
from inference.engine.grammar_state import GrammarState, StructuredOutput
from inference.engine.reasoning import ReasoningSpec, ReasoningTracker
from inference.serving.reasoning_spec import reasoning_spec
from inference.serving.thinking import Thinking

from .fake_engine import call, reply

USER = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
          "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}},
         {"type": "function", "function": {"name": "add", "parameters": {
             "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}]


def chat(**body):
    return call("POST", "/v1/chat/completions", {"model": "smollm2-135m-instruct", "messages": USER, **body})


def specs(fake_rt) -> list:
    return [s.params.structured.grammar.spec if s.params.structured else None for s in fake_rt.engine.submissions]


def test_json_schema_reaches_every_choice_compiled(fake_rt):
    fake_rt.engine.script = reply(fake_rt.tokenizer, '{"city": "Paris"}')
    body = chat(n=2, response_format={"type": "json_schema", "json_schema": {
        "name": "place", "schema": SCHEMA, "strict": True}}).json()
    assert [c["message"]["content"] for c in body["choices"]] == ['{"city": "Paris"}'] * 2
    assert specs(fake_rt) == [GrammarSpec.json_schema(SCHEMA)] * 2
    a, b = (s.params.structured for s in fake_rt.engine.submissions)
    assert a.grammar is b.grammar  # one compile, cached; each sequence gets its own matcher in the engine


@pytest.mark.parametrize("field, spec", [
    ({"response_format": {"type": "json_object"}}, GrammarSpec.json_schema({"type": "object"})),
    ({"structured_outputs": {"json_object": True}}, GrammarSpec.json_schema({"type": "object"})),
    ({"structured_outputs": {"json": json.dumps(SCHEMA)}}, GrammarSpec.json_schema(SCHEMA)),
    ({"structured_outputs": {"regex": "[a-z]+"}}, GrammarSpec("regex", "[a-z]+")),
    ({"structured_outputs": {"choice": ["yes", "no"]}}, GrammarSpec.choice(["yes", "no"])),
    ({"structured_outputs": {"grammar": 'root ::= "a"+'}}, GrammarSpec("ebnf", 'root ::= "a"+')),
    ({"response_format": {"type": "text"}}, None),
    ({"tools": TOOLS, "tool_choice": "auto"}, None),
    ({"tools": TOOLS, "tool_choice": "none", "response_format": {"type": "json_object"}},
     GrammarSpec.json_schema({"type": "object"})),
])
def test_each_mode_becomes_its_spec(fake_rt, field, spec):
    assert chat(**field).status == 200
    assert specs(fake_rt) == [spec]


def test_completions_take_response_format_and_structured_outputs(fake_rt):
    r = call("POST", "/v1/completions", {"model": "smollm2-135m-instruct", "prompt": "x", "structured_outputs": {"choice": ["a", "b"]}})
    assert r.status == 200, r.body
    r = call("POST", "/v1/completions", {"model": "smollm2-135m-instruct", "prompt": ["x", "y"],
                                         "response_format": {"type": "json_object"}})
    assert r.status == 200, r.body
    assert specs(fake_rt) == [GrammarSpec.choice(["a", "b"])] + [GrammarSpec.json_schema({"type": "object"})] * 2


@pytest.mark.parametrize("tool_format, marker", [("hermes", "<tool_call>"), ("llama3_json", '"parameters"')])
def test_a_forced_tool_call_compiles_the_tool_formats_grammar(fake_rt, settings, tool_format, marker):
    settings.METRALE = {**settings.METRALE, "TOOL_CALL_PARSER": tool_format}
    assert chat(tools=TOOLS, tool_choice="required").status == 200
    assert chat(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "add"}}).status == 200
    assert chat(tools=TOOLS, tool_choice="auto").status == 200
    required, named, auto = specs(fake_rt)
    assert required.kind == "lark" and marker in required.text and '"get_weather"' in required.text
    assert '"add"' in named.text and '"get_weather"' not in named.text
    assert auto is None
    # response_format describes the final answer; a forced call turn follows the tool grammar.
    assert chat(tools=TOOLS, tool_choice="required", response_format={"type": "json_object"}).status == 200
    assert specs(fake_rt)[-1] == required
    bad = chat(tools=TOOLS, tool_choice="required", structured_outputs={"regex": "x"})
    assert bad.status == 400 and bad.json()["error"]["param"] == "structured_outputs"


def test_smollm2_gets_the_hermes_call_grammar_with_its_fallback_parser(fake_rt):
    """SmolLM2's template shows no tool format: requests with tools get hermes (text_setup.py)."""
    assert chat(tools=TOOLS, tool_choice="required").status == 200
    (spec,) = specs(fake_rt)
    assert spec.kind == "lark" and "<tool_call>" in spec.text


def test_no_parser_means_no_call_grammar(fake_rt, settings):
    settings.METRALE = {**settings.METRALE, "TOOL_CALL_PARSER": "none"}
    assert chat(tools=TOOLS, tool_choice="required").status == 200
    assert specs(fake_rt) == [None]


def test_a_bad_tool_parameters_schema_is_a_400(fake_rt):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"type": "array", "uniqueItems": True}}}}}]
    r = chat(tools=tools, tool_choice="required")
    assert r.status == 400
    err = r.json()["error"]
    assert err["param"] == "tools[0].function.parameters" and "uniqueItems" in err["message"]  # names the tool


def test_the_error_names_the_field_and_the_problem(fake_rt):
    r = chat(response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": {
        "type": "object", "properties": {"n": {"type": "integer", "minimum": 5, "maximum": 1}}, "required": ["n"]}}})
    assert r.status == 400
    err = r.json()["error"]
    assert err["param"] == "response_format.json_schema.schema"
    assert "required property 'n' is unsatisfiable" in err["message"]
    assert not fake_rt.engine.submissions  # nothing ran


def test_the_reasoning_gate_follows_the_prompt(smollm2_tokenizer):
    tok = smollm2_tokenizer
    start, end = tuple(tok.encode("<think>")), tuple(tok.encode("</think>"))
    grammar = GrammarCompiler(tok).compile(GrammarSpec("regex", "[0-9]+"))

    def gate(prompt_text: str, parser: str | None = "think") -> str | None:
        spec = reasoning_spec(tok, parser, prompt_text, Thinking())
        if spec is None:
            return None
        return GrammarState(StructuredOutput(grammar), reasoning=ReasoningTracker(spec)).gate

    opened = reasoning_spec(tok, "think", "<think>\n", Thinking())
    assert opened == ReasoningSpec(start, end, starts_in_reasoning=True)
    assert gate("<think>\n") == "reasoning"
    closed = reasoning_spec(tok, "think", "assistant\n<think>\n\n</think>\n\n", Thinking())
    assert not closed.starts_in_reasoning and not closed.output_may_open
    assert gate("assistant\n<think>\n\n</think>\n\n") == "on"
    # `<think>` is several tokens in SmolLM2's vocabulary: the model cannot open it past the grammar.
    assert reasoning_spec(tok, "think", "assistant\n", Thinking()).output_may_open
    assert gate("assistant\n") == "on"
    assert gate("<think>\n", parser=None) is None


HUGE_SCHEMA = {"type": "object", "properties": {"x": {"const": "y" * (1 << 20)}}}  # a 1 MB const
MODEL = "smollm2-135m-instruct"
HUGE_CASES = [
    ("/v1/chat/completions", {"messages": USER, "response_format": {
        "type": "json_schema", "json_schema": {"name": "s", "schema": HUGE_SCHEMA}}}, "response_format.json_schema.schema"),
    ("/v1/chat/completions", {"messages": USER, "structured_outputs": {"json": HUGE_SCHEMA}}, "structured_outputs.json"),
    ("/v1/chat/completions", {"messages": USER, "tools": [
        TOOLS[0], {"type": "function", "function": {"name": "big", "parameters": HUGE_SCHEMA}}]},
     "tools[1].function.parameters"),
    ("/v1/completions", {"prompt": "Hi", "response_format": {
        "type": "json_schema", "json_schema": {"name": "s", "schema": HUGE_SCHEMA}}}, "response_format.json_schema.schema"),
    ("/v1/responses", {"input": "Hi", "text": {"format": {"type": "json_schema", "name": "s", "schema": HUGE_SCHEMA}}},
     "text.format.schema"),
    ("/v1/responses", {"input": "Hi", "tools": [{"type": "function", "name": "big", "parameters": HUGE_SCHEMA}]},
     "tools[0].parameters"),
    ("/v1/messages", {"max_tokens": 8, "messages": USER, "tools": [{"name": "big", "input_schema": HUGE_SCHEMA}]},
     "tools[0].input_schema"),
    ("/v1/messages", {"max_tokens": 8, "messages": USER, "output_config": {
        "format": {"type": "json_schema", "schema": HUGE_SCHEMA}}}, "output_config.format.schema"),
    # vLLM's other modes compile on the same grammar thread: the same bound.
    ("/v1/chat/completions", {"messages": USER, "structured_outputs": {"choice": ["x" * 700] * 100}},
     "structured_outputs.choice"),
    ("/v1/chat/completions", {"messages": USER, "structured_outputs": {"grammar": 'root ::= "' + "x" * 70_000 + '"'}},
     "structured_outputs.grammar"),
    ("/v1/completions", {"prompt": "Hi", "structured_outputs": {"regex": "a|" * 40_000 + "b"}},
     "structured_outputs.regex"),
]


@pytest.mark.parametrize(("path", "body", "param"), HUGE_CASES, ids=[c[2] for c in HUGE_CASES])
def test_a_schema_over_the_size_limit_is_a_400_naming_its_field_in_the_routes_shape(fake_rt, path, body, param):
    r = call("POST", path, {"model": MODEL, **body})
    assert r.status == 400, r.body[:300]
    if path == "/v1/messages":
        err = r.json()["error"]
        assert r.json()["type"] == "error" and err["type"] == "invalid_request_error"
    else:
        err = r.json()["error"]
        assert err["param"] == param and err["code"] == "schema_too_large"
    assert f"'{param}'" in err["message"] and "65536 bytes" in err["message"]
    assert not fake_rt.engine.submissions  # nothing compiled, nothing ran


def test_the_schema_size_limit_is_a_setting(fake_rt, settings):
    schema = {"type": "object", "properties": {"x": {"const": "y" * 200}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    fake_rt.engine.script = reply(fake_rt.tokenizer, '{"x": "' + "y" * 200 + '"}')
    assert chat(response_format=fmt).status == 200
    settings.METRALE = {**settings.METRALE, "MAX_SCHEMA_BYTES": 100}
    assert chat(response_format=fmt).json()["error"]["code"] == "schema_too_large"


def test_a_choice_list_past_what_the_parser_holds_is_a_400_and_the_panic_text_stays_out(fake_rt):
    from inference.engine.grammar import first_line

    r = call("POST", "/v1/chat/completions", {"model": MODEL, "messages": USER,
                                               "structured_outputs": {"choice": [f"c{i}" for i in range(1001)]}})
    assert r.status == 400 and r.json()["error"]["param"] == "structured_outputs.choice"
    assert "at most 1000" in r.json()["error"]["message"]
    assert first_line("Invalid choice list: panic: assertion failed\n<backtrace>\n 0: <unknown>") == \
        "Invalid choice list: panic: assertion failed"
