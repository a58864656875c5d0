"""SmolLM2 with tools on a live daphne server and the openai SDK: nothing breaks on a real model, and the
stream helper accumulates the same message (content or tool calls) as the greedy blocking response."""
import json

import pytest

pytestmark = pytest.mark.e2e

MODEL = "smollm2-135m-instruct"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris? Use the get_weather tool."}]


def summary(message) -> tuple:
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]
    return message.content, calls


def test_smollm2_with_tools_streams_the_same_message_as_blocking(openai_client):
    kw = dict(model=MODEL, messages=ASK, tools=[WEATHER], max_tokens=40, temperature=0)
    blocking = openai_client.chat.completions.create(**kw)
    with openai_client.chat.completions.stream(**kw) as stream:
        final = stream.get_final_completion()
    choice = blocking.choices[0]
    assert summary(final.choices[0].message) == summary(choice.message)
    assert final.choices[0].finish_reason == choice.finish_reason
    assert (choice.finish_reason == "tool_calls") == bool(choice.message.tool_calls)
    if choice.message.tool_calls:
        assert all(isinstance(json.loads(c.function.arguments), dict) for c in choice.message.tool_calls)
    else:
        assert "<tool_call>" not in (choice.message.content or "")
