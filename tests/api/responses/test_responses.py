"""POST/GET/DELETE /v1/responses in-process, with a real key and the scripted engine's token text
through the real pipeline: bodies, streams, storage, chains, validation."""

import json

import pytest

from responses_api.models import ResponseEvent, ResponseItem, StoredResponse

from ..fake_engine import reply
from .support import prompt_of, sse_events

WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "Weather in a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                               "required": ["city"]}}
HELLO = "Hello there."


def test_it_answers_a_blocking_response_and_stores_it(api, engine, smollm2_tokenizer):
    r = api.post("/v1/responses", {"model": "smollm2-135m-instruct", "input": "Say hello.", "max_output_tokens": 8,
                                   "metadata": {"k": "v"}})
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["id"].startswith("resp_") and body["object"] == "response"
    assert body["status"] == "completed" and body["model"] == "smollm2-135m-instruct"
    assert body["output"][0]["type"] == "message"
    assert body["output"][0]["content"][0]["text"] == HELLO
    prompt = smollm2_tokenizer.encode(smollm2_tokenizer.apply_chat_template(
        [{"role": "user", "content": "Say hello."}]))
    produced = len(smollm2_tokenizer.encode(HELLO))
    assert body["usage"]["input_tokens"] == len(prompt)
    assert body["usage"]["total_tokens"] == len(prompt) + produced
    assert body["metadata"] == {"k": "v"} and body["store"] is True
    assert engine.submissions[0].params.max_tokens == 8

    stored = api.get(f"/v1/responses/{body['id']}")
    assert stored.status_code == 200 and stored.json() == body
    row = StoredResponse.objects.get(pk=body["id"])
    assert (row.input_tokens, row.output_tokens, row.status) == (len(prompt), produced, "completed")
    assert row.tenant == api.tenant
    assert not row.events.exists()  # blocking responses keep no events


def test_a_stream_ends_with_the_body_that_is_stored_and_replays_identically(api, engine):
    r = api.post("/v1/responses", {"input": "Hi", "stream": True})
    assert r.status_code == 200 and r["Content-Type"] == "text/event-stream"
    events = sse_events(r)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created" and events[1]["type"] == "response.in_progress"
    assert events[-1]["type"] == "response.completed"
    final = events[-1]["response"]
    assert final["output"][0]["content"][0]["text"] == HELLO
    assert api.get(f"/v1/responses/{final['id']}").json() == final

    replay = sse_events(api.get(f"/v1/responses/{final['id']}", stream="true"))
    assert replay == events
    resumed = sse_events(api.get(f"/v1/responses/{final['id']}", stream="true",
                                 starting_after=4))
    assert resumed == events[5:]


def test_a_blocking_response_has_no_events_to_stream(api):
    rid = api.post("/v1/responses", {"input": "Hi"}).json()["id"]
    r = api.get(f"/v1/responses/{rid}", stream="true")
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream"


def test_store_false_is_neither_retrievable_nor_chainable(api):
    body = api.post("/v1/responses", {"input": "Hi", "store": False}).json()
    assert body["store"] is False
    assert api.get(f"/v1/responses/{body['id']}").status_code == 404
    r = api.post("/v1/responses", {"input": "Again", "previous_response_id": body["id"]})
    assert r.status_code == 404 and r.json()["error"]["code"] == "response_not_found"
    assert r.json()["error"]["param"] == "previous_response_id"
    assert not StoredResponse.objects.exists()


def test_three_turns_with_a_function_call_round_trip_keep_the_whole_context(
        api, engine, smollm2_tokenizer):
    # The hermes parser reads the second turn's <tool_call> markup into a function call.
    engine.script = reply(smollm2_tokenizer, [
        HELLO, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "It is sunny."])
    first = api.post("/v1/responses", {"input": "Hi, I'm planning a trip.",
                                       "instructions": "Be friendly.",
                                       "tools": [WEATHER_TOOL]}).json()
    second = api.post("/v1/responses", {"input": "What's the weather in Paris?",
                                        "previous_response_id": first["id"],
                                        "tools": [WEATHER_TOOL]}).json()
    call = second["output"][0]
    assert call["type"] == "function_call" and call["call_id"].startswith("call_")
    assert call["name"] == "get_weather" and second["status"] == "completed"
    assert call["arguments"] == '{"city":"Paris"}'  # as the hermes parser writes it
    third = api.post("/v1/responses", {
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
    assert prompt_of(engine) == expected
    assert third["usage"]["input_tokens"] == len(smollm2_tokenizer.encode(expected))
    assert "Be friendly" not in prompt_of(engine)


def test_a_function_call_output_must_answer_a_call_of_the_context_or_the_input(api, engine, smollm2_tokenizer):
    output = {"type": "function_call_output", "call_id": "nope", "output": "x"}
    refused = api.post("/v1/responses", {"input": [output]})
    assert refused.status_code == 400, refused.json()
    error = refused.json()["error"]
    assert error["message"] == "No tool call found for function call output with call_id nope."
    assert error["param"] == "input[0].call_id" and engine.submissions == []
    call = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'}
    answered = api.post("/v1/responses", {"input": [call, {**output, "call_id": "call_1"}]})
    assert answered.status_code == 200, answered.json()
    chained = api.post("/v1/responses", {"input": [output], "previous_response_id": answered.json()["id"]})
    assert chained.status_code == 400 and chained.json()["error"]["param"] == "input[0].call_id"
    again = api.post("/v1/responses", {"input": [{**output, "call_id": "call_1"}],
                                       "previous_response_id": answered.json()["id"]})
    assert again.status_code == 200, again.json()  # the chain holds call_1


def test_reasoning_items_are_stored_but_left_out_of_the_next_prompt(api, engine, settings,
                                                                    smollm2_tokenizer):
    settings.METRALE = {**settings.METRALE, "REASONING_PARSER": "think"}
    engine.script = reply(smollm2_tokenizer, "<think>The user greets me.</think>Hello!")
    first = api.post("/v1/responses", {"input": "Hi"}).json()
    assert [o["type"] for o in first["output"]] == ["reasoning", "message"]
    assert first["output"][0]["summary"][0]["text"] == "The user greets me."
    api.post("/v1/responses", {"input": "Bye", "previous_response_id": first["id"]})
    prompt = prompt_of(engine)
    assert "Hello!" in prompt and "greets" not in prompt


def test_input_items_are_listed_newest_first_in_pages(api):
    items = [{"role": "user", "content": f"message {i}"} for i in range(5)]
    rid = api.post("/v1/responses", {"input": items}).json()["id"]
    page = api.get(f"/v1/responses/{rid}/input_items", limit=2).json()
    assert page["object"] == "list" and page["has_more"] is True
    texts = [i["content"][0]["text"] for i in page["data"]]
    assert texts == ["message 4", "message 3"]
    assert page["first_id"] == page["data"][0]["id"] and page["last_id"] == page["data"][1]["id"]
    rest = api.get(f"/v1/responses/{rid}/input_items", limit=10, after=page["last_id"]).json()
    assert [i["content"][0]["text"] for i in rest["data"]] == ["message 2", "message 1",
                                                                 "message 0"]
    assert rest["has_more"] is False
    asc = api.get(f"/v1/responses/{rid}/input_items", order="asc").json()
    assert [i["content"][0]["text"] for i in asc["data"]] == [f"message {i}" for i in range(5)]
    assert all(i["type"] == "message" and i["status"] == "completed" for i in asc["data"])
    assert ResponseItem.objects.filter(response_id=rid, direction="output").count() == 1


def test_delete_removes_the_response_its_items_and_events(api):
    rid = sse_events(api.post("/v1/responses", {"input": "Hi", "stream": True}))[0][
        "response"]["id"]
    assert ResponseEvent.objects.filter(response_id=rid).exists()
    r = api.delete(f"/v1/responses/{rid}")
    assert r.status_code == 200 and r.json() == {"id": rid, "object": "response", "deleted": True}
    assert api.get(f"/v1/responses/{rid}").status_code == 404
    assert api.delete(f"/v1/responses/{rid}").status_code == 404
    assert not ResponseItem.objects.exists() and not ResponseEvent.objects.exists()


def test_max_output_tokens_ends_incomplete(api, engine, smollm2_tokenizer):
    engine.script = reply(smollm2_tokenizer, "Once upon a time there was a story.")
    body = api.post("/v1/responses", {"input": "Story", "max_output_tokens": 2}).json()
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output"][0]["status"] == "incomplete"
    assert body["usage"]["output_tokens"] == 2

    engine.script = reply(smollm2_tokenizer, "Once upon", reason="length")
    events = sse_events(api.post("/v1/responses", {"input": "Story", "stream": True}))
    assert events[-1]["type"] == "response.incomplete"


def test_an_engine_error_fails_the_response(api, engine, smollm2_tokenizer):
    engine.script = reply(smollm2_tokenizer, "Par", fail="the engine broke")
    r = api.post("/v1/responses", {"input": "Hi"})
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    row = StoredResponse.objects.get()
    assert row.status == "failed" and row.error["message"] == "the engine broke"

    events = sse_events(api.post("/v1/responses", {"input": "Hi", "stream": True}))
    assert [e["type"] for e in events[-4:]] == ["response.content_part.done",
                                                "response.output_item.done", "error",
                                                "response.failed"]
    assert events[-2]["message"] == "the engine broke"
    assert events[-1]["response"]["error"]["message"] == "the engine broke"


def test_it_echoes_the_request_settings(api, engine):
    body = api.post("/v1/responses", {
        "input": "Hi", "temperature": 0.5, "top_p": 0.9, "tools": [WEATHER_TOOL],
        "tool_choice": {"type": "function", "name": "get_weather"}, "parallel_tool_calls": False,
        "reasoning": {"effort": "low"}, "user": "u1", "service_tier": "auto",
        "truncation": "auto", "text": {"format": {"type": "text"}}, "top_k": 5, "seed": 3}).json()
    assert body["temperature"] == 0.5 and body["top_p"] == 0.9
    assert body["tool_choice"] == {"type": "function", "name": "get_weather"}
    assert body["tools"][0]["name"] == "get_weather" and body["parallel_tool_calls"] is False
    assert body["reasoning"] == {"effort": "low", "summary": None}
    assert body["user"] == "u1" and body["truncation"] == "auto"
    params = engine.submissions[0].params
    assert (params.temperature, params.top_p, params.top_k, params.seed) == (0.5, 0.9, 5, 3)


def test_it_says_the_temperature_and_top_p_it_samples_with_where_the_request_sets_none(api, engine, settings):
    # The server's (or the model's) defaults apply, and the Response object says so, as vLLM's does.
    settings.METRALE = {**settings.METRALE, "SAMPLING_DEFAULTS": {"temperature": 0.2, "top_p": 0.9}}
    body = api.post("/v1/responses", {"input": "Hi"}).json()
    params = engine.submissions[0].params
    assert (params.temperature, params.top_p) == (0.2, 0.9)
    assert (body["temperature"], body["top_p"]) == (0.2, 0.9)
    body = api.post("/v1/responses", {"input": "Hi", "temperature": 0.7}).json()
    assert (body["temperature"], body["top_p"]) == (0.7, 0.9)


def test_truncation_auto_drops_the_oldest_turns_to_fit(api, engine):
    engine.max_model_len = 120
    items = [{"role": "user", "content": "word " * 90}, {"role": "assistant", "content": "ok"},
             {"role": "user", "content": "Last question?"}]
    r = api.post("/v1/responses", {"input": items, "max_output_tokens": 20})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    r = api.post("/v1/responses", {"input": items, "max_output_tokens": 20,
                                   "truncation": "auto"})
    assert r.status_code == 200
    assert len(engine.submissions[0].prompt_token_ids) + 20 <= 120
    assert "Last question?" in prompt_of(engine, 0) and "word" not in prompt_of(engine, 0)


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
def test_it_answers_bad_input_with_400_in_openai_shape(api, body, param):
    r = api.post("/v1/responses", body)
    assert r.status_code == 400, r.content
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["type"] == "invalid_request_error" and err["param"] == param


def test_unknown_ids_are_404_and_methods_405(api):
    for path in ("/v1/responses/resp_nope", "/v1/responses/resp_nope/input_items"):
        r = api.get(path)
        assert r.status_code == 404 and r.json()["error"]["code"] == "response_not_found"
    r = api.post("/v1/responses/resp_nope/cancel", {})
    assert r.status_code == 404
    r = api.send("PUT", "/v1/responses")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"


def test_only_background_responses_can_be_cancelled(api):
    rid = api.post("/v1/responses", {"input": "Hi"}).json()["id"]
    r = api.post(f"/v1/responses/{rid}/cancel", {})
    assert r.status_code == 400 and r.json()["error"]["code"] == "response_not_cancellable"
    assert "background" in r.json()["error"]["message"]


def test_a_replay_query_needs_stream(api):
    rid = api.post("/v1/responses", {"input": "Hi", "stream": True})
    rid = sse_events(rid)[0]["response"]["id"]
    assert api.get(f"/v1/responses/{rid}", starting_after=1).status_code == 400
    assert api.get(f"/v1/responses/{rid}", stream="true",
                   starting_after="x").status_code == 400
    body = json.loads(api.get(f"/v1/responses/{rid}").content)
    assert body["status"] == "completed"


def test_a_client_that_leaves_a_stream_cancels_its_stored_response(rf, api, engine,
                                                                   smollm2_tokenizer):
    from asgiref.sync import async_to_sync

    from responses_api import views

    engine.script = reply(smollm2_tokenizer, "One two three")
    request = rf.post("/v1/responses", json.dumps({"input": "Count", "stream": True}),
                      content_type="application/json", headers=api.headers)

    async def read_then_leave():
        response = await views.responses(request)
        frames = response._iterator  # the view's own generator, as daphne drives it
        got = [await anext(frames) for _ in range(5)]  # created ... the first text delta
        await frames.aclose()  # what Django does when the client goes away
        return got

    frames = async_to_sync(read_then_leave)()
    assert b"response.output_text.delta" in frames[-1]
    row = StoredResponse.objects.get()
    assert row.status == "cancelled" and row.tenant == api.tenant
    assert engine.submissions[0].handle.aborted == "cancelled"
    assert row.to_dict()["output"][0]["status"] == "incomplete"
    assert row.to_dict()["output"][0]["content"][0]["text"] == "One"
    events = list(row.events.values_list("type", flat=True))
    assert events[:6] == ["response.created", "response.in_progress", "response.output_item.added",
                          "response.content_part.added", "response.output_text.delta",
                          "response.output_text.done"]
    # Its replay ends, as every replay does, with one terminal event (the SDK knows no
    # response.cancelled; the response inside says it was cancelled).
    assert events[-1] == "response.incomplete"
    assert row.events.last().data["response"]["status"] == "cancelled"


def test_generating_holds_a_rate_limit_slot_only_while_it_runs(api, settings, frozen_clock):
    settings.METRALE = {**settings.METRALE,
                        "RATE_LIMITS": {**settings.METRALE["RATE_LIMITS"],
                                        "MAX_CONCURRENT_REQUESTS": 1, "TPM": 100000}}
    for _ in range(2):  # the slot is free again after each, blocking or streamed
        r = api.post("/v1/responses", {"input": "Hi"})
        assert r.status_code == 200 and r["x-ratelimit-limit-tokens"] == "100000"
        events = sse_events(api.post("/v1/responses", {"input": "Hi", "stream": True}))
        assert events[-1]["type"] == "response.completed"
    # Tokens are charged as used (prompt + the reply), not as reserved (prompt + the whole context).
    used = 4 * events[-1]["response"]["usage"]["total_tokens"]
    r = api.post("/v1/responses", {"input": "Hi", "max_output_tokens": 5})
    remaining = int(r["x-ratelimit-remaining-tokens"])
    reserved = events[-1]["response"]["usage"]["input_tokens"] + 5
    assert remaining == 100000 - used - reserved


def test_include_output_text_logprobs_adds_them_to_the_text_and_its_events(api, engine):
    plain = api.post("/v1/responses", {"input": "Hi", "top_logprobs": 2}).json()
    assert plain["output"][0]["content"][0]["logprobs"] == [] and engine.submissions[-1].params.logprobs is None
    body = api.post("/v1/responses", {"input": "Hi", "top_logprobs": 2,
                                      "include": ["message.output_text.logprobs"]}).json()
    assert engine.submissions[-1].params.logprobs == 2
    part = body["output"][0]["content"][0]
    assert part["text"] == HELLO and "".join(e["token"] for e in part["logprobs"]) == HELLO
    for entry in part["logprobs"]:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"} and entry["logprob"] <= 0
        assert len(entry["top_logprobs"]) == 2 and entry["top_logprobs"][0]["token"] == entry["token"]
        assert bytes(entry["bytes"]).decode() == entry["token"]
    events = sse_events(api.post("/v1/responses", {"input": "Hi", "top_logprobs": 2, "stream": True,
                                                   "include": ["message.output_text.logprobs"]}))
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    streamed = [entry for e in deltas for entry in e["logprobs"]]
    assert [e["token"] for e in streamed] == [e["token"] for e in part["logprobs"]]
    done = next(e for e in events if e["type"] == "response.output_text.done")
    assert done["logprobs"] == streamed == events[-1]["response"]["output"][0]["content"][0]["logprobs"]
    rid = events[-1]["response"]["id"]
    assert sse_events(api.get(f"/v1/responses/{rid}", stream="true")) == events  # the replay carries them too
