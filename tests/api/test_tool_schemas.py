"""Forced tool calls (tool_choice "required" or a named function) with schemas the grammar cannot serve:
each is a 400 naming the tool's parameters, on chat and on Responses, whatever the number of tools."""
import pytest

from .fake_engine import call

GOOD = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
# Kinds llguidance refuses: unknown keywords and formats, unsatisfiable, unresolvable references, a regex
# it cannot run, numbers it cannot represent, malformed keyword values.
REFUSED = [
    {"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}, "required": ["a"]},
    {"not": {"type": "string"}}, {"type": "string", "format": "nope"},
    {"type": "object", "properties": {"a": {"type": "integer", "minimum": 5, "maximum": 1}}, "required": ["a"]},
    {"anyOf": []}, {"type": "object", "properties": {"a": False}, "required": ["a"]},
    {"$ref": "#/$defs/missing"}, {"$ref": "http://example.com/schema.json"},
    {"type": "object", "properties": {"a": {"type": "string", "pattern": "(?=a)b"}}, "required": ["a"]},
    {"type": "object", "properties": {"a": {"type": "number", "multipleOf": 0}}, "required": ["a"]},
    {"type": "object", "properties": {"a": {"type": "integer", "minimum": 10**400}}, "required": ["a"]},
    {"type": ["object", 5]}, {"type": "object", "properties": [1, 2]}, {"type": "object", "required": "a"},
    {"type": "strin"}, {"if": {"type": "string"}, "then": {"minLength": 2}},
]


def tools_with(bad: dict, at: int, count: int, flat: bool) -> list[dict]:
    tools = []
    for i in range(count):
        params = bad if i == at else GOOD
        fn = {"name": f"tool_{i}", "parameters": params}
        tools.append({"type": "function", **fn} if flat else {"type": "function", "function": fn})
    return tools


@pytest.mark.parametrize("schema", REFUSED, ids=[str(s)[:50] for s in REFUSED])
@pytest.mark.parametrize("count, at", [(1, 0), (3, 2), (64, 41)])
def test_chat_names_the_tool_whose_schema_cannot_be_forced(fake_rt, schema, count, at):
    tools = tools_with(schema, at, count, flat=False)
    for choice in ("required", {"type": "function", "function": {"name": f"tool_{at}"}}):
        answer = call("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                       "tools": tools, "tool_choice": choice, "max_tokens": 4})
        assert answer.status == 400, answer.body[:300]
        err = answer.json()["error"]
        assert err["param"] == f"tools[{at}].function.parameters" and err["code"] == "invalid_tool_schema", err
    assert fake_rt.engine.submissions == []


@pytest.mark.parametrize("schema", REFUSED[:6], ids=[str(s)[:50] for s in REFUSED[:6]])
@pytest.mark.parametrize("flat", [True, False])
def test_responses_names_the_tool_as_it_was_sent(fake_rt, schema, flat):
    tools = tools_with(schema, 1, 3, flat=flat)
    answer = call("POST", "/v1/responses", {"input": "hi", "tools": tools, "tool_choice": "required",
                                            "max_output_tokens": 4})
    assert answer.status == 400, answer.body[:300]
    assert answer.json()["error"]["param"] == ("tools[1].parameters" if flat else "tools[1].function.parameters")


def test_a_refused_schema_that_is_not_forced_is_not_checked(fake_rt):
    tools = tools_with(REFUSED[0], 1, 3, flat=False)
    for choice in ("auto", {"type": "function", "function": {"name": "tool_0"}}):
        answer = call("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                       "tools": tools, "tool_choice": choice, "max_tokens": 4})
        assert answer.status == 200, answer.body[:300]


def test_many_good_tools_can_all_be_forced(fake_rt):
    fake_rt.engine.max_model_len = 32768  # their descriptions fill the prompt
    answer = call("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                   "tools": tools_with(GOOD, 0, 200, flat=False),
                                                   "tool_choice": "required", "max_tokens": 4})
    assert answer.status == 200, answer.body[:300]
