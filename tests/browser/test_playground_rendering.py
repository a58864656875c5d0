"""How the playground shows a chat stream's parts, on scripted SSE answers (the page's fetch is answered by
Playwright): reasoning and tool calls apart from the answer, usage, an in-band error, and a tool result
sent back with its call's id."""
from __future__ import annotations

import json

from .test_playground import ask, wait_for_turn


def sse(*chunks) -> str:
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"


def chunk(delta=None, finish=None, usage=None):
    body = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage:
        body["usage"] = usage
    return body


TOOL_CALL_STREAM = sse(
    chunk({"role": "assistant", "reasoning_content": "The user wants "}),
    chunk({"reasoning_content": "the weather."}),
    chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                           "function": {"name": "get_weather", "arguments": ""}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
    chunk({"content": "Checking."}),
    chunk({}, finish="tool_calls"),
    chunk(usage={"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42,
                 "prompt_tokens_details": {"cached_tokens": 16},
                 "completion_tokens_details": {"reasoning_tokens": 4}}),
)


def answer_with(page, bodies: list[str], sent: list):
    def handle(route):
        sent.append(route.request.post_data_json)
        route.fulfill(status=200, headers={"content-type": "text/event-stream", "x-request-id": "req_scripted"},
                      body=bodies[len(sent) - 1])
    page.route("**/v1/chat/completions", handle)


def test_it_shows_reasoning_and_tool_calls_apart_from_the_answer(page, auth_server):
    page.goto(auth_server.url + "/playground")
    sent = []
    answer_with(page, [TOOL_CALL_STREAM, sse(chunk({"content": "Sunny."}, finish="stop"))], sent)
    ask(page, "Weather in Paris?")
    turn = wait_for_turn(page)
    assert turn.get_attribute("data-state") == "done"
    assert turn.locator(".reasoning-text").inner_text() == "The user wants the weather."
    assert turn.locator(".tool-call .name").inner_text() == "get_weather"
    assert turn.locator(".tool-call .arguments").inner_text() == '{"city": "Paris"}'
    assert turn.locator(".answer").inner_text() == "Checking."
    stats = turn.locator(".stats").inner_text()
    for part in ("finish_reason tool_calls", "prompt 30 tokens", "16 cached", "completion 12 tokens",
                 "4 reasoning", "TTFT"):
        assert part in stats, stats

    page.select_option("#role", "tool")
    ask(page, '{"temperature_c": 21}')
    page.wait_for_function("document.querySelectorAll('#log .turn.assistant[data-state=done]').length == 2")
    messages = sent[1]["messages"]
    assert messages[1] == {"role": "assistant", "content": "Checking.", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
    assert messages[2] == {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature_c": 21}'}


def test_it_shows_an_in_band_error(page, auth_server):
    page.goto(auth_server.url + "/playground")
    answer_with(page, [sse(chunk({"role": "assistant", "content": "The capital"}),
                           {"error": {"message": "The request was cancelled by an operator.",
                                      "type": "invalid_request_error", "code": "cancelled"}})], [])
    ask(page, "What is the capital of France?")
    turn = wait_for_turn(page)
    assert turn.get_attribute("data-state") == "error"
    assert turn.locator(".error").inner_text().startswith("cancelled:")
    assert turn.locator(".answer").inner_text() == "The capital"


def test_it_shows_an_http_error_in_the_apis_words(page, auth_server):
    page.goto(auth_server.url + "/playground")
    page.route("**/v1/chat/completions", lambda route: route.fulfill(
        status=400, content_type="application/json",
        body=json.dumps({"error": {"message": "temperature must be at most 2", "type": "invalid_request_error",
                                   "param": "temperature", "code": None}})))
    ask(page, "hi")
    turn = wait_for_turn(page)
    assert turn.locator(".error").inner_text() == "400: temperature must be at most 2"
