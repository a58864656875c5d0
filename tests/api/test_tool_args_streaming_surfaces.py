"""Streamed tool-call arguments on every surface, against the scripted SmolLM2 token ids of a hermes call.

A streamed call's arguments arrive in several pieces (chat tool_calls deltas, Anthropic
input_json_delta events, Responses function_call_arguments.delta events) that join into exactly the
blocking response's arguments; the official SDKs' stream helpers accumulate the same call. A call
cut off by max_tokens stays as sent on all three, unclosed, and the turn ends for length
(finish_reason length, stop_reason max_tokens, status incomplete); the blocking answer holds the same cut
call (the stream's accumulation).
"""
import json

import httpx
import pytest

from .anthropic.support import sse_frames
from .asgi_client import serve, site_handler
from .fake_engine import call, reply

MODEL = "smollm2-135m-instruct"
USER = [{"role": "user", "content": "Write it."}]
PARAMETERS = {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"},
                                               "lines": {"type": "integer"}}}
CHAT_TOOL = {"type": "function", "function": {"name": "write_file", "parameters": PARAMETERS}}
RESPONSES_TOOL = {"type": "function", "name": "write_file", "parameters": PARAMETERS}
ANTHROPIC_TOOL = {"name": "write_file", "input_schema": PARAMETERS}
ARGUMENTS_TEXT = ('{"path": "notes/today.txt", "content": "First line of the file.\\nSecond line, '
                  'with \\"quotes\\" and é.", "lines": "2"}')
CALL = f'Writing it.\n<tool_call>\n{{"name": "write_file", "arguments": {ARGUMENTS_TEXT}}}\n</tool_call>'
ARGUMENTS = json.dumps({"path": "notes/today.txt",
                        "content": 'First line of the file.\nSecond line, with "quotes" and é.', "lines": 2},
                       ensure_ascii=False, separators=(",", ":"))
# Where max_tokens cuts the call: inside the content string.
CUT = CALL[:CALL.index("Second line")]


def _chat(**body):
    return call("POST", "/v1/chat/completions", {"model": MODEL, "messages": USER, "tools": [CHAT_TOOL],
                                                  "max_tokens": 200, **body})


def _messages(**body):
    return call("POST", "/v1/messages", {"model": MODEL, "messages": USER, "tools": [ANTHROPIC_TOOL],
                                         "max_tokens": 200, **body}, headers={"anthropic-version": "2023-06-01"})


def _responses(**body):
    return call("POST", "/v1/responses", {"model": MODEL, "input": "Write it.", "tools": [RESPONSES_TOOL],
                                          "max_output_tokens": 200, **body})


def _chat_pieces(answer) -> tuple[list[str], list[str]]:
    """(argument pieces, finish reasons) of a chat stream's one call."""
    pieces, reasons = [], []
    for event in answer.events():
        if event == "[DONE]" or not event["choices"]:
            continue
        choice = event["choices"][0]
        for tc in choice["delta"].get("tool_calls") or []:
            assert tc["index"] == 0
            if "id" not in tc:
                pieces.append(tc["function"]["arguments"])
        if choice["finish_reason"]:
            reasons.append(choice["finish_reason"])
    return pieces, reasons


def _anthropic_pieces(answer) -> tuple[list[str], dict]:
    """(input_json_delta pieces, the message_delta event) of a Messages stream."""
    frames = sse_frames(answer)
    pieces = [d["delta"]["partial_json"] for n, d in frames
              if n == "content_block_delta" and d["delta"]["type"] == "input_json_delta"]
    return pieces, next(d for n, d in frames if n == "message_delta")


def _responses_pieces(answer) -> tuple[list[str], list[dict]]:
    events = answer.events()
    return [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"], events


def _tokens_of(tokenizer, text: str) -> int:
    return len(tokenizer.encode(text))


def test_chat_streams_the_arguments_in_pieces_that_join_into_the_blocking_ones(fake_rt):
    fake_rt.engine.script = reply(fake_rt.tokenizer, CALL)
    blocking = _chat().json()["choices"][0]
    assert blocking["message"]["tool_calls"][0]["function"]["arguments"] == ARGUMENTS
    pieces, reasons = _chat_pieces(_chat(stream=True))
    assert len(pieces) > 3 and "".join(pieces) == ARGUMENTS
    assert reasons == [blocking["finish_reason"]] == ["tool_calls"]


def test_anthropic_streams_several_input_json_deltas_that_parse_to_the_blocking_input(fake_rt):
    fake_rt.engine.script = reply(fake_rt.tokenizer, CALL)
    blocking = _messages().json()
    [tool_use] = [b for b in blocking["content"] if b["type"] == "tool_use"]
    pieces, delta = _anthropic_pieces(_messages(stream=True))
    assert len(pieces) > 3
    assert json.loads("".join(pieces)) == tool_use["input"] == json.loads(ARGUMENTS)
    assert "".join(pieces) == ARGUMENTS
    assert delta["delta"]["stop_reason"] == blocking["stop_reason"] == "tool_use"


def test_responses_streams_argument_deltas_and_done_carries_the_whole(fake_rt):
    fake_rt.engine.script = reply(fake_rt.tokenizer, CALL)
    blocking = _responses().json()
    [item] = [o for o in blocking["output"] if o["type"] == "function_call"]
    pieces, events = _responses_pieces(_responses(stream=True))
    [done] = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    [final] = [o for o in events[-1]["response"]["output"] if o["type"] == "function_call"]
    assert len(pieces) > 3
    assert "".join(pieces) == done["arguments"] == final["arguments"] == item["arguments"] == ARGUMENTS


def test_a_call_cut_off_by_max_tokens_stays_as_sent_on_every_surface(fake_rt):
    fake_rt.engine.script = reply(fake_rt.tokenizer, CALL)
    n = _tokens_of(fake_rt.tokenizer, CUT)
    sent = ARGUMENTS[:ARGUMENTS.index("Second line")]

    pieces, reasons = _chat_pieces(_chat(stream=True, max_tokens=n))
    assert "".join(pieces).startswith(sent[:-2]) and ARGUMENTS.startswith("".join(pieces))
    assert reasons == ["length"]
    blocking = _chat(max_tokens=n).json()["choices"][0]
    [cut_call] = blocking["message"]["tool_calls"]
    assert cut_call["function"] == {"name": "write_file", "arguments": "".join(pieces)}
    assert blocking["finish_reason"] == "length"

    a_pieces, delta = _anthropic_pieces(_messages(stream=True, max_tokens=n))
    assert "".join(a_pieces) == "".join(pieces)
    assert delta["delta"]["stop_reason"] == "max_tokens"
    blocking = _messages(max_tokens=n).json()
    [tool_use] = [b for b in blocking["content"] if b["type"] == "tool_use"]
    assert blocking["stop_reason"] == "max_tokens"
    assert tool_use["input"]["path"] == "notes/today.txt" and "lines" not in tool_use["input"]

    r_pieces, events = _responses_pieces(_responses(stream=True, max_output_tokens=n))
    assert "".join(r_pieces) == "".join(pieces)
    final = events[-1]["response"]
    assert events[-1]["type"] == "response.incomplete"
    [item] = [o for o in final["output"] if o["type"] == "function_call"]
    assert item["status"] == "incomplete" and item["arguments"] == "".join(pieces)
    with pytest.raises(ValueError):
        json.loads(item["arguments"])   # never closed: a client cannot take it for a whole call
    blocking = _responses(max_output_tokens=n).json()
    assert blocking["status"] == "incomplete"
    assert [(o["arguments"], o["status"]) for o in blocking["output"] if o["type"] == "function_call"] == \
        [("".join(pieces), "incomplete")]


def _with_http(fn, http_module=httpx):
    """fn(an async HTTP client of `http_module` on the ASGI app), run to the end."""
    async def main():
        transport = http_module.ASGITransport(app=site_handler())
        async with http_module.AsyncClient(transport=transport, base_url="http://testserver") as http:
            return await fn(http)
    return serve(main)


def test_the_anthropic_sdk_stream_accumulates_the_blocking_input(fake_rt):
    anthropic = pytest.importorskip("anthropic")
    httpx2 = pytest.importorskip("httpx2")   # the anthropic SDK's own HTTP client
    fake_rt.engine.script = reply(fake_rt.tokenizer, CALL)

    async def both(http):
        client = anthropic.AsyncAnthropic(base_url="http://testserver", api_key="unused", http_client=http,
                                          max_retries=0)
        kw = dict(model=MODEL, max_tokens=200, messages=USER, tools=[ANTHROPIC_TOOL])
        blocking = await client.messages.create(**kw)
        async with client.messages.stream(**kw) as stream:
            snapshots = [e.snapshot for e in [e async for e in stream] if e.type == "input_json"]
            final = await stream.get_final_message()
        return blocking, snapshots, final

    blocking, snapshots, final = _with_http(both, httpx2)
    [expected] = [b.input for b in blocking.content if b.type == "tool_use"]
    [streamed] = [b.input for b in final.content if b.type == "tool_use"]
    assert streamed == expected == json.loads(ARGUMENTS)
    assert len(snapshots) > 3 and snapshots[-1] == expected
    assert {"path": "notes/today.txt"}.items() <= snapshots[len(snapshots) // 2].items()


def test_the_openai_sdk_stream_helper_accumulates_the_blocking_arguments(fake_rt):
    openai = pytest.importorskip("openai")
    fake_rt.engine.script = reply(fake_rt.tokenizer, CALL)

    async def both(http):
        client = openai.AsyncOpenAI(base_url="http://testserver/v1", api_key="unused", http_client=http,
                                    max_retries=0)
        kw = dict(model=MODEL, messages=USER, tools=[CHAT_TOOL])
        blocking = await client.chat.completions.create(**kw)
        async with client.chat.completions.stream(**kw) as stream:
            deltas = [e async for e in stream if e.type == "tool_calls.function.arguments.delta"]
            final = await stream.get_final_completion()
        return blocking, deltas, final

    blocking, deltas, final = _with_http(both)
    assert len(deltas) > 3
    assert final.choices[0].message.tool_calls[0].function.arguments == \
        blocking.choices[0].message.tool_calls[0].function.arguments == ARGUMENTS


def test_the_anthropic_sdk_reads_a_cut_off_call_as_the_part_that_was_sent(fake_rt):
    anthropic = pytest.importorskip("anthropic")
    httpx2 = pytest.importorskip("httpx2")
    fake_rt.engine.script = reply(fake_rt.tokenizer, CALL)
    n = _tokens_of(fake_rt.tokenizer, CUT)

    async def cut(http):
        client = anthropic.AsyncAnthropic(base_url="http://testserver", api_key="unused", http_client=http,
                                          max_retries=0)
        async with client.messages.stream(model=MODEL, max_tokens=n, messages=USER,
                                          tools=[ANTHROPIC_TOOL]) as stream:
            return await stream.get_final_message()

    final = _with_http(cut, httpx2)
    [tool_use] = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "max_tokens"
    assert tool_use.name == "write_file" and tool_use.input["path"] == "notes/today.txt"
    assert "lines" not in tool_use.input
