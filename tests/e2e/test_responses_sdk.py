"""End to end: the official openai SDK's Responses and Conversations clients against a live
daphne serving SmolLM2 (blocking vs streamed, storage, chains, background, resume, cancel)."""

import json
import re
import time

import httpx
import openai
import pytest

from inference.engine.tokenizer import Tokenizer

pytestmark = pytest.mark.e2e

QUESTION = "What is the capital of France?"
WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "Weather in a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                               "required": ["city"]}}


@pytest.fixture(scope="module", autouse=True)
def no_server_errors(metrale_server):
    """No traceback reaches the server log while this module runs (background tasks included)."""
    start = len(metrale_server.log())
    yield
    assert "Traceback" not in metrale_server.log()[start:], metrale_server.log()[start:]


def sse(lines) -> list[dict]:
    """Parse `event:` / `data:` frames from an iterator of lines; checks the two agree."""
    events, name = [], None
    for line in lines:
        if line.startswith("event: "):
            name = line[len("event: "):]
        elif line.startswith("data: "):
            data = json.loads(line[len("data: "):])
            assert data["type"] == name
            events.append(data)
            yield data


def wait_status(client, response_id, statuses, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        r = client.responses.retrieve(response_id)
        if r.status in statuses:
            return r
        time.sleep(0.1)
    raise AssertionError(f"{response_id} never reached {statuses}: {r.status}")


def test_a_streamed_response_ends_equal_to_the_blocking_one(openai_client):
    blocking = openai_client.responses.create(model="smollm2-135m-instruct", input=QUESTION,
                                              temperature=0, max_output_tokens=24)
    with openai_client.responses.stream(model="smollm2-135m-instruct", input=QUESTION,
                                        temperature=0, max_output_tokens=24) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert "Paris" in blocking.output_text
    assert final.output_text == blocking.output_text
    assert final.status == blocking.status == "completed"
    assert [(o.type, o.status) for o in final.output] == \
        [(o.type, o.status) for o in blocking.output]
    assert final.usage.input_tokens == blocking.usage.input_tokens
    assert final.usage.output_tokens == blocking.usage.output_tokens
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text

    stored = openai_client.responses.retrieve(final.id)
    assert stored.output_text == final.output_text and stored.usage == final.usage


def test_output_text_logprobs_are_included_when_asked_and_the_stream_accumulates_them(openai_client):
    ask = dict(model="smollm2-135m-instruct", input=QUESTION, temperature=0, max_output_tokens=12, top_logprobs=3,
               include=["message.output_text.logprobs"])
    blocking = openai_client.responses.create(**ask)
    with openai_client.responses.stream(**ask) as stream:
        final = stream.get_final_response()
    part, streamed = blocking.output[0].content[0], final.output[0].content[0]
    assert part.text == streamed.text
    # Every token of the text, then the end-of-turn token that ended it (chat's logprobs have it too).
    assert "".join(lp.token for lp in part.logprobs) in (part.text, part.text + "<|im_end|>")
    assert all(len(lp.top_logprobs) == 3 and lp.logprob <= 0 for lp in part.logprobs)
    assert [(lp.token, lp.logprob) for lp in streamed.logprobs] == [(lp.token, lp.logprob) for lp in part.logprobs]
    # The chat surface's logprobs for the same turn are the same numbers.
    chat = openai_client.chat.completions.create(model="smollm2-135m-instruct", temperature=0, max_tokens=12,
                                                 messages=[{"role": "user", "content": QUESTION}], logprobs=True,
                                                 top_logprobs=3)
    assert [(c.token, c.logprob) for c in chat.choices[0].logprobs.content] == \
        [(lp.token, lp.logprob) for lp in part.logprobs]


def test_retrieve_delete_and_paginated_input_items(openai_client):
    items = [{"role": "user", "content": f"Note {i}."} for i in range(5)]
    r = openai_client.responses.create(model="smollm2-135m-instruct", input=items, max_output_tokens=4, temperature=0)
    assert openai_client.responses.retrieve(r.id).output_text == r.output_text

    page = openai_client.responses.input_items.list(r.id, limit=2)
    assert page.has_more is True and len(page.data) == 2
    texts = [item.content[0].text for item in page]  # iterating follows `after` to the end
    assert texts == [f"Note {i}." for i in reversed(range(5))]
    asc = openai_client.responses.input_items.list(r.id, order="asc")
    assert [item.content[0].text for item in asc.data] == [f"Note {i}." for i in range(5)]

    openai_client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        openai_client.responses.retrieve(r.id)


def test_conversations_through_the_sdk(openai_client):
    conv = openai_client.conversations.create(
        items=[{"type": "message", "role": "user", "content": "Let's talk about France."}],
        metadata={"topic": "geography"})
    assert conv.id.startswith("conv_") and conv.metadata == {"topic": "geography"}
    added = openai_client.conversations.items.create(
        conv.id, items=[{"type": "message", "role": "assistant", "content": "Gladly."}])
    assert len(added.data) == 1

    r = openai_client.responses.create(model="smollm2-135m-instruct", input=QUESTION, conversation=conv.id,
                                       max_output_tokens=16, temperature=0)
    assert r.conversation.id == conv.id
    items = list(openai_client.conversations.items.list(conv.id, order="asc"))
    assert [i.role for i in items] == ["user", "assistant", "user", "assistant"]
    assert items[-1].id == r.output[0].id and items[-1].content[0].text == r.output_text

    one = openai_client.conversations.items.retrieve(items[1].id, conversation_id=conv.id)
    assert one.content[0].text == "Gladly."
    after_delete = openai_client.conversations.items.delete(items[1].id, conversation_id=conv.id)
    assert after_delete.id == conv.id
    assert len(list(openai_client.conversations.items.list(conv.id))) == 3
    assert openai_client.conversations.update(conv.id, metadata={"topic": "x"}).metadata == \
        {"topic": "x"}
    deleted = openai_client.conversations.delete(conv.id)
    assert deleted.deleted is True and deleted.id == conv.id
    with pytest.raises(openai.NotFoundError):
        openai_client.conversations.retrieve(conv.id)


def test_a_three_turn_chain_with_a_function_call_keeps_the_context(openai_client, smollm2_dir):
    first = openai_client.responses.create(model="smollm2-135m-instruct", input="My name is Ada.",
                                           instructions="Be brief.", max_output_tokens=12,
                                           temperature=0)
    second = openai_client.responses.create(
        model="smollm2-135m-instruct", previous_response_id=first.id, tools=[WEATHER_TOOL], max_output_tokens=12,
        temperature=0, input=[
            {"role": "user", "content": "What's the weather in Paris?"},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather",
             "arguments": '{"city": "Paris"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny, 24C"}])
    third = openai_client.responses.create(model="smollm2-135m-instruct", previous_response_id=second.id,
                                           input="What is my name?", max_output_tokens=12,
                                           temperature=0)
    # Turn 1's instructions are not carried over; SmolLM2's template ignores tool_calls, so the
    # call is written into the assistant turn in the Hermes format.
    expected = [
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": '<tool_call>\n{"name": "get_weather", "arguments": '
                                         '{"city": "Paris"}}\n</tool_call>'},
        {"role": "tool", "content": "sunny, 24C"},
        {"role": "assistant", "content": second.output_text},
        {"role": "user", "content": "What is my name?"},
    ]
    tok = Tokenizer.from_folder(smollm2_dir)
    assert third.usage.input_tokens == len(tok.encode(tok.apply_chat_template(expected)))
    assert third.previous_response_id == second.id


def test_a_disconnected_background_stream_resumes_after_the_last_event_seen(
        openai_client, metrale_server):
    body = {"model": "smollm2-135m-instruct", "input": "Tell me a story about a lighthouse.", "background": True,
            "stream": True, "max_output_tokens": 48, "temperature": 0}
    with httpx.stream("POST", metrale_server.url + "/v1/responses", json=body, timeout=60) as r:
        seen = []
        for event in sse(r.iter_lines()):
            seen.append(event)
            if len(seen) == 9:
                break  # the client goes away; the background response keeps running
    n = seen[-1]["sequence_number"]
    rid = seen[0]["response"]["id"]
    assert [e["sequence_number"] for e in seen] == list(range(n + 1))
    assert seen[0]["response"]["status"] == "queued"

    with httpx.stream("GET", f"{metrale_server.url}/v1/responses/{rid}",
                      params={"stream": "true", "starting_after": n}, timeout=60) as r:
        rest = list(sse(r.iter_lines()))
    assert [e["sequence_number"] for e in rest] == list(range(n + 1, n + 1 + len(rest)))
    assert rest[-1]["type"] in ("response.completed", "response.incomplete")

    with httpx.stream("GET", f"{metrale_server.url}/v1/responses/{rid}",
                      params={"stream": "true"}, timeout=60) as r:
        assert list(sse(r.iter_lines())) == seen + rest

    # The SDK's own resume: it replays and drops what came before `starting_after`.
    with openai_client.responses.stream(response_id=rid, starting_after=n) as stream:
        assert [e.sequence_number for e in stream] == [e["sequence_number"] for e in rest]
    text = "".join(e["delta"] for e in seen + rest if e["type"] == "response.output_text.delta")
    assert openai_client.responses.retrieve(rid).output_text == text


def test_a_background_response_is_polled_then_cancelled_and_stops_generating(
        openai_client, metrale_server):
    r = openai_client.responses.create(model="smollm2-135m-instruct", input="Count to one thousand.",
                                       background=True, max_output_tokens=2000, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert r.status == "queued" and r.background is True
    assert wait_status(openai_client, r.id, {"in_progress"}).status == "in_progress"
    with httpx.stream("GET", f"{metrale_server.url}/v1/responses/{r.id}",
                      params={"stream": "true"}, timeout=60) as stream:
        deltas = 0
        for event in sse(stream.iter_lines()):
            deltas += event["type"] == "response.output_text.delta"
            if deltas == 3:
                break
    cancelled = openai_client.responses.cancel(r.id)
    assert cancelled.status == "cancelled"
    assert cancelled.output[0].status == "incomplete" and cancelled.output_text
    time.sleep(1.0)  # the engine drops the sequence at its next step
    steps_then = len(re.findall(r"step \d+:", metrale_server.log()))
    time.sleep(1.0)
    assert len(re.findall(r"step \d+:", metrale_server.log())) == steps_then
    assert openai_client.responses.retrieve(r.id).status == "cancelled"
    assert openai_client.responses.cancel(r.id).status == "cancelled"


def test_deleting_a_running_background_response_stops_it(openai_client, metrale_server):
    r = openai_client.responses.create(model="smollm2-135m-instruct", input="Count to one thousand.",
                                       background=True, max_output_tokens=2000,
                                       extra_body={"ignore_eos": True})
    wait_status(openai_client, r.id, {"in_progress"})
    openai_client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        openai_client.responses.retrieve(r.id)
    time.sleep(1.0)
    steps_then = len(re.findall(r"step \d+:", metrale_server.log()))
    time.sleep(1.0)
    assert len(re.findall(r"step \d+:", metrale_server.log())) == steps_then


def test_only_background_responses_can_be_cancelled(openai_client):
    r = openai_client.responses.create(model="smollm2-135m-instruct", input="Hi", max_output_tokens=2)
    with pytest.raises(openai.BadRequestError) as info:
        openai_client.responses.cancel(r.id)
    assert "background" in info.value.message
