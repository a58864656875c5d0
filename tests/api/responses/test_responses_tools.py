"""Tools and reasoning on POST /v1/responses through the real pipeline: a scripted engine emits the real
SmolLM2 token ids of a generation; the tool parser and reasoning parser turn them into items."""
import json

from ..fake_engine import reply
from .support import prompt_of, sse_events

WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "Weather in a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                               "days": {"type": "integer"}}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": "2"}}\n</tool_call>'


def test_a_function_call_streams_as_a_function_call_item(api, engine):
    engine.script = reply(engine.tokenizer, "Checking.\n" + CALL)
    events = sse_events(api.post("/v1/responses", {"input": "Weather in Paris?", "tools": [WEATHER_TOOL],
                                                       "stream": True}))
    types = [e["type"] for e in events]
    assert "response.function_call_arguments.delta" in types and "response.function_call_arguments.done" in types
    final = events[-1]["response"]
    assert events[-1]["type"] == "response.completed"
    message, fc = final["output"]
    assert message["content"][0]["text"] == "Checking."
    assert fc["type"] == "function_call" and fc["name"] == "get_weather" and fc["call_id"].startswith("call_")
    assert json.loads(fc["arguments"]) == {"city": "Paris", "days": 2}
    added = [e["item"] for e in events if e["type"] == "response.output_item.added"]
    assert [i["type"] for i in added] == ["message", "function_call"]
    assert "# Tools" in prompt_of(engine) and '"name": "get_weather"' in prompt_of(engine)


def test_blocking_gives_the_same_call_and_max_tool_calls_caps_them(api, engine):
    engine.script = reply(engine.tokenizer, CALL + "\n" + CALL)
    body = api.post("/v1/responses", {"input": "x", "tools": [WEATHER_TOOL]}).json()
    assert [o["type"] for o in body["output"]] == ["function_call", "function_call"]
    body = api.post("/v1/responses", {"input": "x", "tools": [WEATHER_TOOL], "max_tool_calls": 1}).json()
    assert [o["type"] for o in body["output"]] == ["function_call"]
    assert body["status"] == "completed"


def test_tool_choice_none_leaves_markup_out_and_makes_no_call(api, engine):
    engine.script = reply(engine.tokenizer, "Fine. " + CALL)
    body = api.post("/v1/responses", {"input": "x", "tools": [WEATHER_TOOL], "tool_choice": "none"}).json()
    assert [o["type"] for o in body["output"]] == ["message"]
    assert body["output"][0]["content"][0]["text"] == "Fine."


def test_reasoning_becomes_a_reasoning_item_and_effort_none_caps_it_at_zero(api, engine, settings):
    settings.METRALE = {**settings.METRALE, "REASONING_PARSER": "think"}
    engine.script = reply(engine.tokenizer, "<think>Two plus two.</think>4")
    body = api.post("/v1/responses", {"input": "2+2?"}).json()
    reasoning, message = body["output"]
    assert reasoning["type"] == "reasoning" and reasoning["summary"][0]["text"] == "Two plus two."
    assert message["content"][0]["text"] == "4"
    assert body["usage"]["output_tokens_details"]["reasoning_tokens"] > 0
    assert engine.submissions[-1].params.reasoning.budget_tokens is None
    api.post("/v1/responses", {"input": "2+2?", "reasoning": {"effort": "none"}})
    assert engine.submissions[-1].params.reasoning.budget_tokens == 0
    api.post("/v1/responses", {"input": "2+2?", "thinking_token_budget": 9, "reasoning": {"effort": "none"}})
    assert engine.submissions[-1].params.reasoning.budget_tokens == 9
