"""The official openai SDK (in-process over httpx's ASGI transport, against the scripted SmolLM2 token ids):
the stream helper accumulates a streamed tool call into the blocking response's tool_calls, and a tool round
trip renders through the real chat template."""
import json

import httpx
import pytest

from .asgi_client import serve, site_handler
from .fake_engine import reply

openai = pytest.importorskip("openai")

MODEL = "smollm2-135m-instruct"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Forecast for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}
USER = {"role": "user", "content": "Weather in Paris and Lyon?"}
CALLS = ('Checking both.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n'
         '</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call>')


def run_with_client(fn):
    async def main():
        transport = httpx.ASGITransport(app=site_handler())
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            client = openai.AsyncOpenAI(base_url="http://testserver/v1", api_key="unused", http_client=http,
                                        max_retries=0)
            return await fn(client)
    return serve(main)


def calls_of(message) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls]


def test_the_stream_helper_accumulates_the_same_tool_calls_as_the_blocking_response(fake_rt):
    fake_rt.engine.script = reply(fake_rt.tokenizer, CALLS)

    async def both(client):
        kw = dict(model=MODEL, messages=[USER], tools=[WEATHER], temperature=0)
        blocking = await client.chat.completions.create(**kw)
        async with client.chat.completions.stream(**kw) as stream:
            done_events = [e async for e in stream if e.type == "tool_calls.function.arguments.done"]
            final = await stream.get_final_completion()
        return blocking, done_events, final

    blocking, done_events, final = run_with_client(both)
    expected = [("get_weather", {"city": "Paris", "days": 2}), ("get_weather", {"city": "Lyon"})]
    assert calls_of(blocking.choices[0].message) == calls_of(final.choices[0].message) == expected
    assert [e.index for e in done_events] == [0, 1] and [e.name for e in done_events] == ["get_weather"] * 2
    streamed = final.choices[0].message
    assert all(c.id.startswith("call_") and len(c.id) == 29 and c.type == "function" for c in streamed.tool_calls)
    assert streamed.content == blocking.choices[0].message.content == "Checking both."
    assert final.choices[0].finish_reason == blocking.choices[0].finish_reason == "tool_calls"


def test_a_tool_round_trip_through_the_sdk_renders_through_the_chat_template(fake_rt):
    fake_rt.engine.script = reply(fake_rt.tokenizer, [CALLS, "Sunny in Paris, rain in Lyon."])

    async def round_trip(client):
        first = await client.chat.completions.create(model=MODEL, messages=[USER], tools=[WEATHER])
        message = first.choices[0].message
        results = [{"role": "tool", "tool_call_id": c.id, "content": "sunny" if i == 0 else "rain"}
                   for i, c in enumerate(message.tool_calls)]
        history = [USER, message.model_dump(exclude_none=True), *results]
        second = await client.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER])
        return second

    second = run_with_client(round_trip)
    assert second.choices[0].message.content == "Sunny in Paris, rain in Lyon."
    assert second.choices[0].finish_reason == "stop"
    prompt = fake_rt.tokenizer.decode(fake_rt.engine.submissions[1].prompt_token_ids, skip_special_tokens=False)
    assert ('<|im_start|>assistant\nChecking both.\n<tool_call>\n{"name": "get_weather", "arguments": '
            '{"city": "Paris", "days": 2}}\n</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": '
            '{"city": "Lyon"}}\n</tool_call><|im_end|>\n<|im_start|>tool\nsunny<|im_end|>\n'
            '<|im_start|>tool\nrain<|im_end|>\n<|im_start|>assistant\n') in prompt
