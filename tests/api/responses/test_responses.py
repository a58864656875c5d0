"""POST/GET/DELETE /v1/responses in-process: bodies, streams, storage, chains, validation."""

import json

import pytest

from inference.serving.deltas import Content, Error, Finish, Reasoning, ToolCallArgs, ToolCallStart
from responses_api.models import ResponseEvent, ResponseItem, StoredResponse

from .support import delete, get, post, sse_events

WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "Weather in a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                               "required": ["city"]}}


def test_it_answers_a_blocking_response_and_stores_it(client, script, smollm2_tokenizer):
    r = post(client, "/v1/responses", {"model": "m", "input": "Say hello.", "max_output_tokens": 8,
                                       "metadata": {"k": "v"}})
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["id"].startswith("resp_") and body["object"] == "response"
    assert body["status"] == "completed" and body["model"] == "m"
    assert body["output"][0]["type"] == "message"
    assert body["output"][0]["content"][0]["text"] == "Hello there."
    prompt = smollm2_tokenizer.encode(smollm2_tokenizer.apply_chat_template(
        [{"role": "user", "content": "Say hello."}]))
    assert body["usage"]["input_tokens"] == len(prompt)
    assert body["usage"]["total_tokens"] == len(prompt) + 2
    assert body["metadata"] == {"k": "v"} and body["store"] is True
    assert script.gens[0].params.max_tokens == 8

    stored = get(client, f"/v1/responses/{body['id']}")
    assert stored.status_code == 200 and stored.json() == body
    row = StoredResponse.objects.get(pk=body["id"])
    assert (row.input_tokens, row.output_tokens, row.status) == (len(prompt), 2, "completed")
    assert not row.events.exists()  # blocking responses keep no events


def test_a_stream_ends_with_the_body_that_is_stored_and_replays_identically(client, script):
    r = post(client, "/v1/responses", {"input": "Hi", "stream": True})
    assert r.status_code == 200 and r["Content-Type"] == "text/event-stream"
    events = sse_events(r)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created" and events[1]["type"] == "response.in_progress"
    assert events[-1]["type"] == "response.completed"
    final = events[-1]["response"]
    assert final["output"][0]["content"][0]["text"] == "Hello there."
    assert get(client, f"/v1/responses/{final['id']}").json() == final

    replay = sse_events(get(client, f"/v1/responses/{final['id']}", stream="true"))
    assert replay == events
    resumed = sse_events(get(client, f"/v1/responses/{final['id']}", stream="true",
                             starting_after=4))
    assert resumed == events[5:]


def test_a_blocking_response_has_no_events_to_stream(client, script):
    rid = post(client, "/v1/responses", {"input": "Hi"}).json()["id"]
    r = get(client, f"/v1/responses/{rid}", stream="true")
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream"


def test_store_false_is_neither_retrievable_nor_chainable(client, script):
    body = post(client, "/v1/responses", {"input": "Hi", "store": False}).json()
    assert body["store"] is False
    assert get(client, f"/v1/responses/{body['id']}").status_code == 404
    r = post(client, "/v1/responses", {"input": "Again", "previous_response_id": body["id"]})
    assert r.status_code == 404 and r.json()["error"]["code"] == "response_not_found"
    assert r.json()["error"]["param"] == "previous_response_id"
    assert not StoredResponse.objects.exists()


def test_three_turns_with_a_function_call_round_trip_keep_the_whole_context(
        client, script, smollm2_tokenizer):
    script.then(Content("Hello there."), Finish("stop"))
    script.then(ToolCallStart(0, "call_w1", "get_weather"), ToolCallArgs(0, '{"city": '),
                ToolCallArgs(0, '"Paris"}'), Finish("tool_calls"))
    script.then(Content("It is sunny."), Finish("stop"))
    first = post(client, "/v1/responses", {"input": "Hi, I'm planning a trip.",
                                           "instructions": "Be friendly.",
                                           "tools": [WEATHER_TOOL]}).json()
    second = post(client, "/v1/responses", {"input": "What's the weather in Paris?",
                                            "previous_response_id": first["id"],
                                            "tools": [WEATHER_TOOL]}).json()
    call = second["output"][0]
    assert call["type"] == "function_call" and call["call_id"] == "call_w1"
    assert call["arguments"] == '{"city": "Paris"}'
    third = post(client, "/v1/responses", {
        "input": [{"type": "function_call_output", "call_id": call["call_id"],
                   "output": "sunny, 24C"}],
        "previous_response_id": second["id"], "instructions": "Answer briefly."}).json()
    assert third["status"] == "completed" and third["previous_response_id"] == second["id"]

    # SmolLM2's template ignores tool_calls, so the call is written into the assistant turn.
    expected = (
        "<|im_start|>system\nAnswer briefly.<|im_end|>\n"
        "<|im_start|>user\nHi, I'm planning a trip.<|im_end|>\n"
        "<|im_start|>assistant\nHello there.<|im_end|>\n"
        "<|im_start|>user\nWhat's the weather in Paris?<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>tool\nsunny, 24C<|im_end|>\n"
        "<|im_start|>assistant\n")
    assert script.prompt_text(smollm2_tokenizer) == expected
    assert third["usage"]["input_tokens"] == len(smollm2_tokenizer.encode(expected))
    assert "Be friendly" not in script.prompt_text(smollm2_tokenizer)


def test_reasoning_items_are_stored_but_left_out_of_the_next_prompt(client, script,
                                                                    smollm2_tokenizer):
    script.then(Reasoning("The user greets me."), Content("Hello!"), Finish("stop"))
    first = post(client, "/v1/responses", {"input": "Hi"}).json()
    assert [o["type"] for o in first["output"]] == ["reasoning", "message"]
    post(client, "/v1/responses", {"input": "Bye", "previous_response_id": first["id"]})
    prompt = script.prompt_text(smollm2_tokenizer)
    assert "Hello!" in prompt and "greets" not in prompt


def test_input_items_are_listed_newest_first_in_pages(client, script):
    items = [{"role": "user", "content": f"message {i}"} for i in range(5)]
    rid = post(client, "/v1/responses", {"input": items}).json()["id"]
    page = get(client, f"/v1/responses/{rid}/input_items", limit=2).json()
    assert page["object"] == "list" and page["has_more"] is True
    texts = [i["content"][0]["text"] for i in page["data"]]
    assert texts == ["message 4", "message 3"]
    assert page["first_id"] == page["data"][0]["id"] and page["last_id"] == page["data"][1]["id"]
    rest = get(client, f"/v1/responses/{rid}/input_items", limit=10, after=page["last_id"]).json()
    assert [i["content"][0]["text"] for i in rest["data"]] == ["message 2", "message 1",
                                                                 "message 0"]
    assert rest["has_more"] is False
    asc = get(client, f"/v1/responses/{rid}/input_items", order="asc").json()
    assert [i["content"][0]["text"] for i in asc["data"]] == [f"message {i}" for i in range(5)]
    assert all(i["type"] == "message" and i["status"] == "completed" for i in asc["data"])
    assert ResponseItem.objects.filter(response_id=rid, direction="output").count() == 1


def test_delete_removes_the_response_its_items_and_events(client, script):
    rid = sse_events(post(client, "/v1/responses", {"input": "Hi", "stream": True}))[0][
        "response"]["id"]
    assert ResponseEvent.objects.filter(response_id=rid).exists()
    r = delete(client, f"/v1/responses/{rid}")
    assert r.status_code == 200 and r.json() == {"id": rid, "object": "response", "deleted": True}
    assert get(client, f"/v1/responses/{rid}").status_code == 404
    assert delete(client, f"/v1/responses/{rid}").status_code == 404
    assert not ResponseItem.objects.exists() and not ResponseEvent.objects.exists()


def test_max_output_tokens_ends_incomplete(client, script):
    script.then(Content("Once upon"), Finish("length"))
    body = post(client, "/v1/responses", {"input": "Story", "max_output_tokens": 2}).json()
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output"][0]["status"] == "incomplete"

    script.then(Content("Once upon"), Finish("length"))
    events = sse_events(post(client, "/v1/responses", {"input": "Story", "stream": True}))
    assert events[-1]["type"] == "response.incomplete"


def test_an_engine_error_fails_the_response(client, script):
    script.then(Content("Par"), Error("the engine broke"))
    r = post(client, "/v1/responses", {"input": "Hi"})
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    row = StoredResponse.objects.get()
    assert row.status == "failed" and row.error["message"] == "the engine broke"

    script.then(Content("Par"), Error("the engine broke"))
    events = sse_events(post(client, "/v1/responses", {"input": "Hi", "stream": True}))
    assert [e["type"] for e in events[-4:]] == ["response.content_part.done",
                                                "response.output_item.done", "error",
                                                "response.failed"]
    assert events[-2]["message"] == "the engine broke"
    assert events[-1]["response"]["error"]["message"] == "the engine broke"


def test_it_echoes_the_request_settings(client, script):
    body = post(client, "/v1/responses", {
        "input": "Hi", "temperature": 0.5, "top_p": 0.9, "tools": [WEATHER_TOOL],
        "tool_choice": {"type": "function", "name": "get_weather"}, "parallel_tool_calls": False,
        "reasoning": {"effort": "low"}, "user": "u1", "service_tier": "auto",
        "truncation": "auto", "text": {"format": {"type": "text"}}, "top_k": 5, "seed": 3}).json()
    assert body["temperature"] == 0.5 and body["top_p"] == 0.9
    assert body["tool_choice"] == {"type": "function", "name": "get_weather"}
    assert body["tools"][0]["name"] == "get_weather" and body["parallel_tool_calls"] is False
    assert body["reasoning"] == {"effort": "low", "summary": None}
    assert body["user"] == "u1" and body["truncation"] == "auto"
    params = script.gens[0].params
    assert (params.temperature, params.top_p, params.top_k, params.seed) == (0.5, 0.9, 5, 3)


def test_truncation_auto_drops_the_oldest_turns_to_fit(client, script):
    script.rt.engine.max_model_len = 120
    items = [{"role": "user", "content": "word " * 90}, {"role": "assistant", "content": "ok"},
             {"role": "user", "content": "Last question?"}]
    r = post(client, "/v1/responses", {"input": items, "max_output_tokens": 20})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    r = post(client, "/v1/responses", {"input": items, "max_output_tokens": 20,
                                       "truncation": "auto"})
    assert r.status_code == 200
    assert len(script.gens[0].prompt_token_ids) + 20 <= 120


@pytest.mark.parametrize("body, param", [
    (b"{not json", None),
    ({"input": 5}, "input"),
    ({"input": [{"type": "message", "role": "wizard", "content": "x"}]}, "input[0].role"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0].type"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
    ({"input": []}, "input"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": "x", "tools": [{"type": "function", "name": "bad name"}]}, "tools[0].name"),
    ({"input": "x", "tool_choice": "required"}, "tool_choice"),
    ({"input": "x", "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"input": "x", "reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "s", "schema": {"not": {}}}}},
     "text.format.schema"),
    ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ({"input": "x", "metadata": {str(i): "v" for i in range(17)}}, "metadata"),
    ({"input": "x", "temperature": 3}, "temperature"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "stream": "yes"}, "stream"),
    ({"input": "x", "background": True, "store": False}, "background"),
    ({"input": "x", "previous_response_id": "resp_1", "conversation": "conv_1"}, "conversation"),
    ({"input": "x", "include": ["everything"]}, "include[0]"),
    ({"input": "x", "truncation": "sometimes"}, "truncation"),
    ({"input": "x", "top_k": "many"}, "top_k"),
    ({"input": "x", "max_output_tokens": 100000}, "input"),
])
def test_it_answers_bad_input_with_400_in_openai_shape(client, script, body, param):
    r = post(client, "/v1/responses", body)
    assert r.status_code == 400, r.content
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["type"] == "invalid_request_error" and err["param"] == param


def test_unknown_ids_are_404_and_methods_405(client, script):
    for path in ("/v1/responses/resp_nope", "/v1/responses/resp_nope/input_items"):
        r = get(client, path)
        assert r.status_code == 404 and r.json()["error"]["code"] == "response_not_found"
    r = post(client, "/v1/responses/resp_nope/cancel", {})
    assert r.status_code == 404
    r = client.put("/v1/responses")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"


def test_only_background_responses_can_be_cancelled(client, script):
    rid = post(client, "/v1/responses", {"input": "Hi"}).json()["id"]
    r = post(client, f"/v1/responses/{rid}/cancel", {})
    assert r.status_code == 400 and r.json()["error"]["code"] == "response_not_cancellable"
    assert "background" in r.json()["error"]["message"]


def test_a_replay_query_needs_stream(client, script):
    rid = post(client, "/v1/responses", {"input": "Hi", "stream": True})
    rid = sse_events(rid)[0]["response"]["id"]
    assert get(client, f"/v1/responses/{rid}", starting_after=1).status_code == 400
    assert get(client, f"/v1/responses/{rid}", stream="true",
               starting_after="x").status_code == 400
    body = json.loads(get(client, f"/v1/responses/{rid}").content)
    assert body["status"] == "completed"


def test_a_client_that_leaves_a_stream_cancels_its_stored_response(rf, script):
    from asgiref.sync import async_to_sync

    from responses_api import views

    script.then(Content("One"), Content(" two"), Content(" three"), Finish("stop"))
    request = rf.post("/v1/responses", json.dumps({"input": "Count", "stream": True}),
                      content_type="application/json")

    async def read_then_leave():
        response = await views.responses(request)
        frames = response._iterator  # the view's own generator, as daphne drives it
        got = [await anext(frames) for _ in range(5)]  # created ... the first text delta
        await frames.aclose()  # what Django does when the client goes away
        return got

    frames = async_to_sync(read_then_leave)()
    assert b"response.output_text.delta" in frames[-1]
    row = StoredResponse.objects.get()
    assert row.status == "cancelled"
    assert row.to_dict()["output"][0]["status"] == "incomplete"
    assert row.to_dict()["output"][0]["content"][0]["text"] == "One"
    events = list(row.events.values_list("type", flat=True))
    assert events[:6] == ["response.created", "response.in_progress", "response.output_item.added",
                          "response.content_part.added", "response.output_text.delta",
                          "response.output_text.done"]


def test_generating_holds_a_rate_limit_slot_only_while_it_runs(client, script, settings,
                                                               frozen_clock):
    settings.METRALE = {**settings.METRALE,
                        "RATE_LIMITS": {**settings.METRALE["RATE_LIMITS"],
                                        "MAX_CONCURRENT_REQUESTS": 1, "TPM": 100000}}
    for _ in range(2):  # the slot is free again after each, blocking or streamed
        r = post(client, "/v1/responses", {"input": "Hi"})
        assert r.status_code == 200 and r["x-ratelimit-limit-tokens"] == "100000"
        events = sse_events(post(client, "/v1/responses", {"input": "Hi", "stream": True}))
        assert events[-1]["type"] == "response.completed"
    # Tokens are charged as used (prompt + 2), not as reserved (prompt + the whole context).
    used = 4 * events[-1]["response"]["usage"]["total_tokens"]
    r = post(client, "/v1/responses", {"input": "Hi", "max_output_tokens": 5})
    remaining = int(r["x-ratelimit-remaining-tokens"])
    reserved = events[-1]["response"]["usage"]["input_tokens"] + 5
    assert remaining == 100000 - used - reserved
