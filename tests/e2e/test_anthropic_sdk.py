"""The official `anthropic` SDK against a live daphne serving SmolLM2 (its real chat template): create and the stream
accumulator give the same message, a forced tool call validates against its schema, a tool_result round trip,
stop sequences, count_tokens, the prefix cache across Claude-Code-shaped turns, auth by x-api-key or bearer, and the
raw SSE framing over HTTP."""
from __future__ import annotations

import json
import socket

import httpx
import jsonschema
import pytest

from tests.api.anthropic.support import check_event_order

anthropic = pytest.importorskip("anthropic")

WEATHER = {"name": "get_weather", "description": "Get the current weather for a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"},
                                                              "unit": {"type": "string", "enum": ["C", "F"]}},
                            "required": ["city", "unit"], "additionalProperties": False}}
ASK = [{"role": "user", "content": "Name three colours of the rainbow."}]
# This SDK types no sampling argument (temperature, top_p, top_k): clients send them in the body.
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def client(metrale_server):
    # The SDK appends /v1/messages to the base URL: the server root, without /v1.
    return anthropic.Anthropic(base_url=metrale_server.url, api_key="any-key", max_retries=0, timeout=120)


def text_of(message) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


def test_create_and_the_stream_give_the_same_message(client):
    kwargs = {"model": "smollm2-135m-instruct", "max_tokens": 24, "messages": ASK, "extra_body": GREEDY}
    created = client.messages.create(**kwargs)
    with client.messages.stream(**kwargs) as stream:
        streamed = stream.get_final_message()
    assert created.id.startswith("msg_") and streamed.id.startswith("msg_")
    assert text_of(created) == text_of(streamed) and text_of(created)
    assert created.stop_reason == streamed.stop_reason and created.stop_reason in ("end_turn", "max_tokens")
    assert created.usage.output_tokens == streamed.usage.output_tokens
    # The second request may read the prompt from the prefix cache; the prompt is the same.
    assert created.usage.input_tokens + created.usage.cache_read_input_tokens == \
        streamed.usage.input_tokens + streamed.usage.cache_read_input_tokens
    assert isinstance(streamed.usage.cache_read_input_tokens, int)


def test_a_forced_tool_call_validates_against_its_schema(client):
    kwargs = {"model": "smollm2-135m-instruct", "max_tokens": 64, "tools": [WEATHER],
              "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
              "messages": [{"role": "user", "content": "What is the weather in Paris?"}], "extra_body": GREEDY}
    created = client.messages.create(**kwargs)
    with client.messages.stream(**kwargs) as stream:
        streamed = stream.get_final_message()
    for message in (created, streamed):
        assert message.stop_reason == "tool_use"
        calls = [b for b in message.content if b.type == "tool_use"]
        assert calls and all(b.id.startswith("toolu_") and b.name == "get_weather" for b in calls)
        for call in calls:
            jsonschema.validate(call.input, WEATHER["input_schema"])
        assert all(b.type != "text" or b.text.strip() for b in message.content)  # no stray empty text block


def test_a_tool_result_round_trip(client):
    first = client.messages.create(model="smollm2-135m-instruct", max_tokens=64, tools=[WEATHER],
                                   tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
                                   messages=[{"role": "user", "content": "Weather in Oslo?"}], extra_body=GREEDY)
    call = next(b for b in first.content if b.type == "tool_use")
    history = [{"role": "user", "content": "Weather in Oslo?"},
               {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                             "content": "It is 4 degrees C and snowing in Oslo."}]}]
    answer = client.messages.create(model="smollm2-135m-instruct", max_tokens=8, tools=[WEATHER], messages=history, extra_body=GREEDY)
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use")
    with_result = client.messages.count_tokens(model="smollm2-135m-instruct", tools=[WEATHER], messages=history).input_tokens
    without = client.messages.count_tokens(model="smollm2-135m-instruct", tools=[WEATHER], messages=history[:2]).input_tokens
    assert with_result > without


def test_a_stop_sequence_is_reported(client):
    free = client.messages.create(model="smollm2-135m-instruct", max_tokens=24, messages=ASK, extra_body=GREEDY)
    words = text_of(free).split()
    assert len(words) >= 3
    stop = words[2]
    stopped = client.messages.create(model="smollm2-135m-instruct", max_tokens=24, messages=ASK, extra_body=GREEDY, stop_sequences=[stop])
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", stop)
    assert text_of(stopped) == text_of(free)[:text_of(free).index(stop)]
    with client.messages.stream(model="smollm2-135m-instruct", max_tokens=24, messages=ASK, extra_body=GREEDY, stop_sequences=[stop]) as s:
        streamed = s.get_final_message()
    assert (streamed.stop_reason, streamed.stop_sequence, text_of(streamed)) == \
        ("stop_sequence", stop, text_of(stopped))


def test_count_tokens_equals_the_prompt_of_the_same_request(client):
    kwargs = {"model": "smollm2-135m-instruct", "system": "You answer in one word.", "tools": [WEATHER],
              "messages": [{"role": "user", "content": "Capital of Peru, in one word, with a zebra?"}]}
    counted = client.messages.count_tokens(**kwargs).input_tokens
    usage = client.messages.create(max_tokens=4, **kwargs).usage
    assert counted == usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens


def test_a_second_claude_code_turn_reads_the_prefix_cache(client):
    instructions = "You are an interactive agent that helps with software engineering tasks. " * 12

    def turn(cch: str, history: list[dict]):
        system = [{"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.154; cc_entrypoint=cli; cch={cch};"},
                  {"type": "text", "text": instructions, "cache_control": {"type": "ephemeral"}}]
        return client.messages.create(model="smollm2-135m-instruct", max_tokens=8, system=system, messages=history, extra_body=GREEDY)

    history = [{"role": "user", "content": "List the files in this folder, please, for turn one of many."}]
    first = turn("5f1a2", history)
    history += [{"role": "assistant", "content": text_of(first) or "ok"}, {"role": "user", "content": "And now?"}]
    second = turn("c03e9", history)
    assert second.usage.cache_read_input_tokens > 0
    assert second.usage.cache_read_input_tokens >= len(instructions) // 8  # the whole system prompt at least


def test_sampling_fields_reach_the_server_through_extra_body(client):
    message = client.messages.create(model="smollm2-135m-instruct", max_tokens=8, messages=ASK, extra_body={
        "top_k": 1, "top_p": 0.9, "min_p": 0.1, "repetition_penalty": 1.1, "seed": 3})
    assert message.usage.output_tokens > 0


def test_sdk_errors_map_to_its_exceptions(client, metrale_server):
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model="smollm2-135m-instruct", max_tokens=8, messages=ASK, extra_body={"temperature": 3})
    assert bad.value.body["error"]["type"] == "invalid_request_error" and "temperature" in str(bad.value)
    assert bad.value.request_id and bad.value.request_id.startswith("req_")
    with_v1 = anthropic.Anthropic(base_url=metrale_server.url + "/v1", api_key="k", max_retries=0)
    with pytest.raises(anthropic.NotFoundError):
        with_v1.messages.create(model="smollm2-135m-instruct", max_tokens=8, messages=ASK)


def test_x_api_key_and_bearer_authenticate(auth_server):
    key = auth_server.keys["owner"]
    by_key = anthropic.Anthropic(base_url=auth_server.url, api_key=key, max_retries=0, timeout=120)
    by_token = anthropic.Anthropic(base_url=auth_server.url, auth_token=key, max_retries=0, timeout=120)
    for sdk in (by_key, by_token):
        assert sdk.messages.count_tokens(model="smollm2-135m-instruct", messages=ASK).input_tokens > 0
    wrong = anthropic.Anthropic(base_url=auth_server.url, api_key="mk-wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as denied:
        wrong.messages.count_tokens(model="smollm2-135m-instruct", messages=ASK)
    assert denied.value.body["error"]["type"] == "authentication_error"


def test_the_raw_stream_frames_every_event(metrale_server):
    body = {"model": "smollm2-135m-instruct", "max_tokens": 64, "stream": True, "tools": [WEATHER],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
            "messages": [{"role": "user", "content": "Weather in Rome?"}], **GREEDY}
    answer = httpx.post(metrale_server.url + "/v1/messages", json=body, timeout=120,
                        headers={"x-api-key": "k", "anthropic-version": "2023-06-01"})
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/event-stream")
    assert answer.headers["request-id"].startswith("req_")
    frames = []
    for frame in answer.text.split("\n\n"):
        if frame.strip():
            event, data = frame.split("\n")
            assert event.startswith("event: ") and data.startswith("data: ")
            frames.append((event[7:], json.loads(data[6:])))
    check_event_order(frames)
    pieces: dict[int, str] = {}
    for name, data in frames:
        if name == "content_block_delta" and data["delta"]["type"] == "input_json_delta":
            pieces[data["index"]] = pieces.get(data["index"], "") + data["delta"]["partial_json"]
    assert pieces
    for joined in pieces.values():
        jsonschema.validate(json.loads(joined), WEATHER["input_schema"])


def test_daphne_s_body_limit_answers_in_anthropic_s_shape(metrale_server):
    """The 413 that daphne's HTTP layer sends itself (metrale_site/asgi.py), before any application runs:
    at once for `Expect: 100-continue`, and once an over-size body has arrived."""
    limit = 32 << 20
    host, port = metrale_server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\nExpect: 100-continue\r\n\r\n" % (limit * 2))
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413") and b"\r\nrequest-id: req_" in head
    assert json.loads(body)["error"]["type"] == "request_too_large" and json.loads(body)["type"] == "error"
    sent = httpx.post(metrale_server.url + "/v1/messages/count_tokens", content=b" " * (limit + 1),
                      headers={"content-type": "application/json"}, timeout=120)
    assert sent.status_code == 413 and sent.json()["error"]["type"] == "request_too_large"
