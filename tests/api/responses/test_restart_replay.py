"""A response whose process died mid-stream: failing it closes what its recorded events left
open and records the terminal events, so its replay and its stored object agree."""

import pytest

from inference.serving.deltas import Content, Reasoning, Refusal, ToolCallArgs, ToolCallStart
from responses_api import store
from responses_api.encoder import ResponsesEventEncoder
from responses_api.models import ResponseItem, StoredResponse
from tests.stream_checks import check_responses_stream, fold

from .support import sse_events

pytestmark = pytest.mark.django_db

GONE = "gonehost:1:gone"  # no heartbeat row: a process that is gone


def orphan(tenant, rid: str, *, background: bool = True, streamed: bool = True) -> dict:
    """Store the tenant's unfinished response, owned by a process that is gone; returns its body."""
    body = {"id": rid, "object": "response", "status": "queued" if background else "in_progress",
            "output": [], "error": None, "usage": None, "metadata": {}}
    store.create_response(tenant=tenant, response_id=rid, model="smollm2-135m-instruct", body=body,
                          request={}, input_items=[], previous_response_id=None,
                          conversation_id=None, background=background, streamed=streamed)
    StoredResponse.objects.filter(pk=rid).update(worker=GONE)
    return body


def recorded_run(tenant, rid: str, deltas: list) -> list[dict]:
    """An orphaned background response with the events a run records (response.created,
    response.in_progress, then the encoder's item events for `deltas`)."""
    body = orphan(tenant, rid)
    encoder = ResponsesEventEncoder()
    events = [{"type": "response.created", "response": body},
              {"type": "response.in_progress", "response": {**body, "status": "in_progress"}}]
    for delta in deltas:
        events += encoder.feed(delta)
    events = [{**e, "sequence_number": i} for i, e in enumerate(events)]
    store.append_events(rid, events)
    StoredResponse.objects.filter(pk=rid).update(status="in_progress")
    return events


CRASHES = {
    "before any item": [],
    "in a message": [Content("Hello"), Content(" wor")],
    "after reasoning, in a message": [Reasoning("Let me see."), Content("The")],
    "in reasoning": [Reasoning("hmm")],
    "in a function call": [ToolCallStart(0, "call_1", "get_weather"),
                           ToolCallArgs(0, '{"city": "Par')],
    "in a refusal after text": [Content("Sure"), Refusal("I can't")],
    "as a call opens": [Content("Checking."), ToolCallStart(0, "call_2", "lookup")],
}


@pytest.mark.parametrize("deltas", CRASHES.values(), ids=CRASHES.keys())
def test_a_failed_response_replays_to_a_terminal_event_that_agrees_with_what_is_stored(
        api, deltas):
    recorded = recorded_run(api.tenant, "resp_crashed", deltas)
    assert store.fail_unfinished() == 1

    replay = sse_events(api.get("/v1/responses/resp_crashed", stream="true"))
    assert replay[:len(recorded)] == recorded  # what was sent stays as it was
    check_responses_stream(replay)
    assert [e["type"] for e in replay[-2:]] == ["error", "response.failed"]
    output = fold(replay)
    # The item the crash left open is closed incomplete; those done before it stay completed.
    assert [item["status"] for item in output] == ["completed"] * (len(output) - 1) + \
        ["incomplete"] * bool(output)

    stored = api.get("/v1/responses/resp_crashed").json()
    assert stored["status"] == "failed" and "restarted" in stored["error"]["message"]
    assert stored == replay[-1]["response"]
    assert stored["output"] == output
    rows = ResponseItem.objects.filter(response_id="resp_crashed", direction="output")
    assert list(rows.order_by("position").values_list("data", flat=True)) == output
    # A stream resumed after any point ends the same way.
    tail = sse_events(api.get("/v1/responses/resp_crashed", stream="true",
                          starting_after=len(recorded) - 1))
    assert tail == replay[len(recorded):]


def test_a_response_that_recorded_no_events_yet_replays_created_then_failed(api):
    orphan(api.tenant, "resp_early")
    assert store.fail_unfinished() == 1
    replay = sse_events(api.get("/v1/responses/resp_early", stream="true"))
    assert [e["type"] for e in replay] == ["response.created", "error", "response.failed"]
    assert replay[-1]["response"] == api.get("/v1/responses/resp_early").json()


def test_the_run_finishing_after_it_was_failed_keeps_the_failure(api):
    recorded_run(api.tenant, "resp_late", [Content("Hi")])
    assert store.fail_unfinished() == 1
    failed = api.get("/v1/responses/resp_late").json()
    # Its owner was only slow, and now records its own end: the first outcome stands.
    status = store.finish_response("resp_late", {"status": "incomplete", "usage": None},
                                   [{"id": "msg_x", "type": "message", "content": []}])
    assert status == "failed"
    assert api.get("/v1/responses/resp_late").json() == failed
    assert ResponseItem.objects.filter(response_id="resp_late", direction="output").count() == 1


def test_a_blocking_response_is_failed_without_events(api):
    orphan(api.tenant, "resp_block", background=False, streamed=False)
    assert store.fail_unfinished() == 1
    row = StoredResponse.objects.get(pk="resp_block")
    assert row.status == "failed" and not row.events.exists()
