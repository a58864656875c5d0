"""An operator's cancel (replica.cancel -> AsyncEngine.cancel) on the real engine: each route tells its
client in-band in its own way, the KV blocks come back, and /metrics counts it as `abort`."""
import asyncio
import json

import pytest

from inference.operations import replica

from .asgi_client import serve
from .observed import call, request, scrape, value

MODEL = {"model_name": "smollm2-135m-instruct", "engine": "0"}
STORY = [{"role": "user", "content": "Tell me a very long story about a lighthouse."}]


def frames(body: bytes) -> list[tuple[str | None, object]]:
    """(event name or None, data) of each SSE frame; data parsed as JSON unless it is [DONE]."""
    out = []
    for block in body.decode().split("\n\n"):
        event, data = None, None
        for line in block.splitlines():
            if line.startswith("event: "):
                event = line[len("event: "):]
            elif line.startswith("data: "):
                data = line[len("data: "):]
        if data is not None:
            out.append((event, data if data == "[DONE]" else json.loads(data)))
    return out


async def stream_then_cancel(path: str, body: dict, request_id: str, chunks_first: int = 3) -> bytes:
    """Start a stream, read a few chunks, cancel it by its x-request-id, read it to the end."""
    req = await request("POST", path, body, headers={"x-request-id": request_id}).start()
    assert req.status == 200
    seen = b""
    for _ in range(chunks_first):
        seen += await req.chunk()
    assert await replica.cancel(request_id) >= 1
    return seen + await req.read_all(timeout_s=30)


def test_a_cancelled_chat_stream_ends_with_an_error_frame_then_done(real_rt):
    aborts = value(scrape(), "vllm:request_success_total", finished_reason="abort", **MODEL)
    body = serve(stream_then_cancel, "/v1/chat/completions", {
        "model": "smollm2-135m-instruct", "messages": STORY, "max_tokens": 400, "stream": True, "ignore_eos": True}, "req_cancel_chat")
    events = frames(body)
    assert events[-1] == (None, "[DONE]")
    _, error = events[-2]
    assert error["error"]["code"] == "cancelled"
    assert not any(isinstance(d, dict) and d.get("choices") and d["choices"][0].get("finish_reason")
                   for _, d in events)
    table = scrape()
    assert value(table, "vllm:request_success_total", finished_reason="abort", **MODEL) == aborts + 1
    assert value(table, "vllm:num_requests_running", **MODEL) == 0


def test_a_cancelled_completion_stream_ends_with_an_error_frame_then_done(real_rt):
    body = serve(stream_then_cancel, "/v1/completions", {
        "model": "smollm2-135m-instruct", "prompt": "Once upon a time", "max_tokens": 400, "stream": True, "ignore_eos": True},
        "req_cancel_completion")
    events = frames(body)
    assert events[-1] == (None, "[DONE]") and events[-2][1]["error"]["code"] == "cancelled"


def test_a_cancelled_response_stream_ends_with_status_cancelled(real_rt):
    body = serve(stream_then_cancel, "/v1/responses", {
        "model": "smollm2-135m-instruct", "input": "Tell me a very long story.", "max_output_tokens": 400, "stream": True},
        "req_cancel_response", chunks_first=4)
    name, last = frames(body)[-1]
    assert name == last["type"] == "response.incomplete"
    assert last["response"]["status"] == "cancelled"


def test_a_cancelled_messages_stream_ends_with_an_error_event(real_rt):
    body = serve(stream_then_cancel, "/v1/messages", {
        "model": "smollm2-135m-instruct", "messages": STORY, "max_tokens": 400, "stream": True}, "req_cancel_messages", chunks_first=4)
    name, last = frames(body)[-1]
    assert name == "error" and last["type"] == "error"
    assert not any(event == "message_stop" for event, _ in frames(body))


def test_a_cancelled_blocking_chat_is_a_500_not_to_be_retried(real_rt):
    async def scenario():
        req = request("POST", "/v1/chat/completions", {"model": "smollm2-135m-instruct", "messages": STORY, "max_tokens": 400,
                                                       "ignore_eos": True}, headers={"x-request-id": "req_cancel_b"})
        task = asyncio.create_task(req.start(timeout_s=60))
        for _ in range(500):
            await asyncio.sleep(0.01)
            if await replica.cancel("req_cancel_b"):
                break
        else:
            raise AssertionError("the request never ran")
        await task
        return req, json.loads(await req.read_all())

    req, body = serve(scenario)
    assert req.status == 500 and body["error"]["code"] == "cancelled"
    assert req.headers["x-should-retry"] == "false"


def test_cancelling_an_unknown_request_ends_nothing(real_rt):
    assert asyncio.run(replica.cancel("req_nobody")) == 0
    assert call("GET", "/health").status == 200


@pytest.fixture(autouse=True)
def _kv_pool_whole(real_rt):
    yield
    snapshot = real_rt.engine.snapshot().result(timeout=10)
    assert snapshot["running"] == [] and snapshot["kv"]["blocks_used"] == 0
