"""The Responses event state machine on scripted delta sequences, checked against the official
SDK's stream accumulator (the code `client.responses.stream(...)` runs)."""

import itertools

import pytest
from openai import omit
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from inference.serving.deltas import (
    Content,
    Error,
    Finish,
    Reasoning,
    Refusal,
    ToolCallArgs,
    ToolCallStart,
    Usage,
)
from responses_api.encoder import EncoderError, ResponsesEventEncoder, outcome, responses_usage

EVENT = TypeAdapter(ResponseStreamEvent)


def counter_ids():
    n = itertools.count()
    return lambda prefix: f"{prefix}_{next(n)}"


def encode(deltas, status="completed"):
    """(events with sequence numbers and lifecycle around them, encoder)."""
    enc = ResponsesEventEncoder(id_factory=counter_ids())
    body = {"id": "resp_1", "object": "response", "created_at": 1, "model": "smollm2-135m-instruct", "output": [],
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
            "status": "in_progress"}
    events = [{"type": "response.created", "response": body},
              {"type": "response.in_progress", "response": body}]
    for d in deltas:
        events += enc.feed(d)
    events += enc.close(status)
    events.append({"type": "response.completed",
                   "response": {**body, "status": "completed", "output": enc.output}})
    return [{**e, "sequence_number": i} for i, e in enumerate(events)], enc


def sdk_final(events):
    """Feed the events to the SDK's stream state; its final parsed response."""
    state = ResponseStreamState(input_tools=omit, text_format=omit)
    for raw in events:
        state.handle_event(EVENT.validate_python(raw))
    return state._completed_response


def kinds(events):
    return [e["type"].removeprefix("response.") for e in events]


def test_it_streams_reasoning_then_text_then_a_call_then_text_as_four_items():
    deltas = [Reasoning("Think"), Reasoning("ing."), Content("Let me "), Content("check."),
              ToolCallStart(0, "call_a", "get_weather"), ToolCallArgs(0, '{"city": '),
              ToolCallArgs(0, '"Paris"}'), Content("Done."), Finish("tool_calls")]
    events, enc = encode(deltas)
    assert kinds(events) == [
        "created", "in_progress",
        "output_item.added", "reasoning_summary_part.added", "reasoning_summary_text.delta",
        "reasoning_summary_text.delta", "reasoning_summary_text.done",
        "reasoning_summary_part.done", "output_item.done",
        "output_item.added", "content_part.added", "output_text.delta", "output_text.delta",
        "output_text.done", "content_part.done", "output_item.done",
        "output_item.added", "function_call_arguments.delta", "function_call_arguments.delta",
        "function_call_arguments.done", "output_item.done",
        "output_item.added", "content_part.added", "output_text.delta", "output_text.done",
        "content_part.done", "output_item.done",
        "completed"]
    assert [o["type"] for o in enc.output] == ["reasoning", "message", "function_call", "message"]
    assert enc.output[0]["summary"] == [{"type": "summary_text", "text": "Thinking."}]
    assert enc.output[1]["content"][0]["text"] == "Let me check."
    assert enc.output[2] | {} == {"id": "fc_2", "type": "function_call", "call_id": "call_a",
                                  "name": "get_weather", "arguments": '{"city": "Paris"}',
                                  "status": "completed"}
    assert enc.output[3]["content"][0]["text"] == "Done."
    assert len({o["id"] for o in enc.output}) == 4
    added = [e["output_index"] for e in events if e["type"] == "response.output_item.added"]
    done = [e["output_index"] for e in events if e["type"] == "response.output_item.done"]
    assert added == done == [0, 1, 2, 3]
    args_done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    assert args_done["name"] == "get_weather" and args_done["arguments"] == '{"city": "Paris"}'

    final = sdk_final(events)
    assert final.output_text == "Let me check.Done."
    assert [o.type for o in final.output] == ["reasoning", "message", "function_call", "message"]


def test_text_deltas_carry_an_empty_logprobs_list_and_the_part_index():
    events, _ = encode([Content("a"), Content("b"), Finish("stop")])
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert [d["delta"] for d in deltas] == ["a", "b"]
    assert all(d["logprobs"] == [] and d["content_index"] == 0 for d in deltas)
    text_done = next(e for e in events if e["type"] == "response.output_text.done")
    assert text_done["text"] == "ab" and text_done["logprobs"] == []


def test_logprobs_ride_on_their_text_the_done_events_and_a_resumed_encoder():
    from inference.serving.deltas import TokenLogprob, TopLogprob

    def lp(token, value):
        return TokenLogprob(0, token, token.encode(), value, (TopLogprob(0, token, token.encode(), value),))

    first, second = Content("Hi"), Content(" there")
    first.logprobs, second.logprobs = [lp("Hi", -0.5)], [lp(" th", -0.25), lp("ere", -0.125)]
    events, enc = encode([first, second, Finish("stop")])
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert [[x["token"] for x in d["logprobs"]] for d in deltas] == [["Hi"], [" th", "ere"]]
    done = next(e for e in events if e["type"] == "response.output_text.done")
    assert [x["logprob"] for x in done["logprobs"]] == [-0.5, -0.25, -0.125]
    assert done["logprobs"][0] == {"token": "Hi", "logprob": -0.5, "bytes": [72, 105],
                                   "top_logprobs": [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105]}]}
    assert enc.output[0]["content"][0]["logprobs"] == done["logprobs"]
    assert sdk_final(events).output[0].content[0].logprobs[2].token == "ere"
    # A process that died mid-message: its recorded events rebuild the part, logprobs included.
    upto = next(i for i, e in enumerate(events) if e["type"] == "response.output_text.done")
    resumed = ResponsesEventEncoder.resume([e for e in events[:upto]], id_factory=counter_ids())
    closing = resumed.close("incomplete")
    assert next(e for e in closing if e["type"] == "response.output_text.done")["logprobs"] == done["logprobs"]


def test_parallel_calls_are_consecutive_items_and_a_message_closes_before_a_call():
    deltas = [Content("Calling."), ToolCallStart(0, "c0", "f"), ToolCallArgs(0, "{}"),
              ToolCallStart(1, "c1", "g"), ToolCallArgs(1, '{"x": 1}'), Finish("tool_calls")]
    events, enc = encode(deltas)
    assert [o["type"] for o in enc.output] == ["message", "function_call", "function_call"]
    assert [o["call_id"] for o in enc.output[1:]] == ["c0", "c1"]
    # the message is done before the first call is added
    t = kinds(events)
    second_added = t.index("output_item.added", t.index("output_item.added") + 1)
    assert t.index("output_item.done") < second_added
    final = sdk_final(events)
    assert [(o.name, o.arguments) for o in final.output[1:]] == [("f", "{}"), ("g", '{"x": 1}')]


def test_a_refusal_is_its_own_part_of_the_message():
    events, enc = encode([Content("I "), Refusal("can't help"), Refusal(" with that."),
                          Content("Sorry."), Finish("stop")])
    assert enc.output[0]["content"] == [
        {"type": "output_text", "text": "I ", "annotations": [], "logprobs": []},
        {"type": "refusal", "refusal": "can't help with that."},
        {"type": "output_text", "text": "Sorry.", "annotations": [], "logprobs": []}]
    refusal_done = next(e for e in events if e["type"] == "response.refusal.done")
    assert refusal_done["refusal"] == "can't help with that." and refusal_done["content_index"] == 1
    assert [e["content_index"] for e in events if e["type"] == "response.content_part.added"] == \
        [0, 1, 2]
    final = sdk_final(events)
    assert final.output_text == "I Sorry."


def test_reasoning_after_text_opens_a_new_reasoning_item():
    _, enc = encode([Reasoning("a"), Content("b"), Reasoning("c"), Content("d"), Finish("stop")])
    assert [o["type"] for o in enc.output] == ["reasoning", "message", "reasoning", "message"]


def test_empty_deltas_open_nothing():
    events, enc = encode([Content(""), Reasoning(""), Finish("stop")])
    assert enc.output == []
    assert kinds(events) == ["created", "in_progress", "completed"]


def test_a_response_cut_short_closes_its_open_item_as_incomplete():
    events, enc = encode([Content("Once upon"), Finish("length")], status="incomplete")
    assert enc.output[0]["status"] == "incomplete"
    assert events[-2]["type"] == "response.output_item.done"


def test_arguments_for_a_call_that_is_not_open_are_an_error():
    enc = ResponsesEventEncoder(id_factory=counter_ids())
    enc.feed(ToolCallStart(0, "c0", "f"))
    with pytest.raises(EncoderError):
        enc.feed(ToolCallArgs(1, "{}"))
    enc = ResponsesEventEncoder(id_factory=counter_ids())
    with pytest.raises(EncoderError):
        enc.feed(ToolCallArgs(0, "{}"))


def test_every_added_item_event_is_a_snapshot_not_the_live_item():
    events, enc = encode([Content("x"), Finish("stop")])
    added = next(e for e in events if e["type"] == "response.output_item.added")
    assert added["item"]["status"] == "in_progress" and added["item"]["content"] == []
    assert enc.output[0]["status"] == "completed"


@pytest.mark.parametrize("finish, error, expected", [
    (Finish("stop"), None, ("completed", None, None)),
    (Finish("tool_calls"), None, ("completed", None, None)),
    (Finish("length"), None, ("incomplete", {"reason": "max_output_tokens"}, None)),
    (Finish("content_filter"), None, ("incomplete", {"reason": "content_filter"}, None)),
    (Finish("cancelled"), None, ("cancelled", None, None)),
])
def test_finish_reasons_map_to_response_statuses(finish, error, expected):
    assert outcome(finish, error) == expected


def test_errors_and_timeouts_fail_the_response():
    status, _, error = outcome(None, Error("boom"))
    assert status == "failed" and error == {"code": "server_error", "message": "boom"}
    assert outcome(Finish("timeout"), None)[0] == "failed"
    assert outcome(None, None)[0] == "failed"


def test_usage_in_the_responses_shape():
    assert responses_usage(Usage(10, 5, cached_prompt_tokens=4, reasoning_tokens=2)) == {
        "input_tokens": 10, "input_tokens_details": {"cached_tokens": 4}, "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 2}, "total_tokens": 15}
