"""SIGTERM drains a live daphne serving SmolLM2: new requests get 503, a running stream that can
finish within the grace period finishes, one that cannot ends in-band with an error, a
background response is recorded failed with the reason (its events and stored output agreeing),
and the process exits 0. (test_serve.py: `manage.py serve` passes the signal on.)"""
import signal

import httpx
import pytest

from inference.bench.live_server import LiveServer
from metrale_site.drain import SHUTDOWN_MESSAGE
from tests.stream_checks import check_chat_stream, check_responses_stream

from .live import ChatStream, ServerDb, message_text, model_env, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

GRACE_S = 4


def test_sigterm_lets_running_work_finish_then_ends_the_rest_and_exits_0(smollm2_dir, tmp_path):
    server = LiveServer(model_env(smollm2_dir, METRALE_SHUTDOWN_GRACE=str(GRACE_S)), tmp_path)
    try:
        server.wait_ready()
        short, long = ChatStream(server.url, max_tokens=6), ChatStream(server.url, max_tokens=1500)
        short.start()
        long.start()
        background = httpx.post(server.url + "/v1/responses", json={
            "model": "smollm2-135m-instruct", "input": "Count from one to a thousand.", "background": True,
            "max_output_tokens": 1500, "ignore_eos": True}, timeout=30).json()
        db = ServerDb(server.db)
        wait_for(lambda: db.deltas(background["id"]) >= 2, 60, "the background response's text")
        assert short.started.wait(60) and long.started.wait(60)

        server.proc.send_signal(signal.SIGTERM)
        health = wait_for(lambda: (r := httpx.get(server.url + "/health", timeout=5)).json() == {
            "status": "draining"} and r, 10, "the drain to begin")
        assert health.status_code == 503
        refused = httpx.post(server.url + "/v1/chat/completions", timeout=10, json={
            "model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "Hi"}]})
        assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
        error = refused.json()["error"]
        assert (error["type"], error["code"]) == ("server_error", "server_shutting_down")
        assert set(error) == {"message", "type", "param", "code"}

        assert server.proc.wait(timeout=GRACE_S + 40) == 0
        short.join(10)
        long.join(10)
    finally:
        server.stop()

    assert short.error is None and long.error is None
    assert check_chat_stream(short.payloads)[0]["finish_reason"] == "length"
    # The long one ran past the grace period: its error comes in-band, then [DONE].
    *chunks, ended, done = long.payloads
    assert done == "[DONE]" and ended["error"]["message"] == SHUTDOWN_MESSAGE
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks if c["choices"])

    assert db.status(background["id"]) == "failed"
    final = check_responses_stream(db.events(background["id"]))
    assert final["status"] == "failed" and final["error"]["message"] == SHUTDOWN_MESSAGE
    assert db.output(background["id"]) == final["output"] and message_text(final["output"])
    stops = db.rows("select stopped_at from inference_serverprocess")
    assert stops and all(stopped is not None for (stopped,) in stops)
