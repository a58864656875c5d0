"""Tool and thinking request fields: bad values are a 400 naming the field, good ones are served."""
import json

import pytest

from .test_validation_table import OK, check

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}

CHAT = [
    ({"tools": [WEATHER]}, OK), ({"tools": []}, OK),
    ({"tools": [{"type": "function", "function": {"description": "x"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "x" * 65}}]}, "tools[0].function.name"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
    ({"tools": [{"type": "function"}]}, "tools[0].function"),
    ({"tools": [{"type": "code_interpreter"}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}, "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "description": 5}}]},
     "tools[0].function.description"),
    ({"tools": [WEATHER], "tool_choice": "none"}, OK), ({"tools": [WEATHER], "tool_choice": "required"}, OK),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, OK),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "get_weather"}}, OK),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_time"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function"}}, "tool_choice"),
    ({"tools": [WEATHER], "parallel_tool_calls": False}, OK),
    ({"reasoning_effort": "low"}, OK), ({"reasoning_effort": "none"}, OK),
    ({"reasoning_effort": "extreme"}, "reasoning_effort"), ({"reasoning_effort": 3}, "reasoning_effort"),
    ({"thinking": {"type": "disabled"}}, OK), ({"thinking": {"type": "enabled", "budget_tokens": 64}}, OK),
    ({"thinking": {"budget_tokens": 0}}, OK), ({"thinking": "off"}, "thinking"),
    ({"thinking": {"type": "sometimes"}}, "thinking.type"),
    ({"thinking": {"budget_tokens": -1}}, "thinking.budget_tokens"),
    ({"thinking": {"budget_tokens": "many"}}, "thinking.budget_tokens"),
    ({"thinking_token_budget": 0}, OK), ({"thinking_token_budget": 128}, OK),
    ({"thinking_token_budget": -1}, "thinking_token_budget"), ({"max_thinking_tokens": 1.5}, "max_thinking_tokens"),
    ({"thinking_budget": "x"}, "thinking_budget"),
]


@pytest.mark.parametrize("fields, expected", CHAT, ids=[json.dumps(f)[:70] for f, _ in CHAT])
def test_chat_tool_and_thinking_field(fake_rt, fields, expected):
    check("/v1/chat/completions", {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "hi"}], **fields},
          expected)
