"""kill -9 of a live server in the middle of background (and streamed) Responses, then a restart
on the same database: nothing is left in_progress, nothing stored is lost, and every killed
response replays to a terminal event that agrees with what is stored."""
import threading

import httpx
import openai
import pytest
from pydantic import TypeAdapter

from inference.bench.live_server import LiveServer
from responses_api.store import RESTART_MESSAGE
from tests.stream_checks import check_responses_stream, sse_data

from .live import ServerDb, message_text, model_env, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def stream_response(url: str, body: dict, first_id: list) -> None:
    """A streamed Responses request read until the server goes away (its id into first_id)."""
    try:
        with httpx.stream("POST", url + "/v1/responses", json={**body, "stream": True},
                          timeout=120) as response:
            for line in response.iter_lines():
                if line.startswith("data: ") and not first_id:
                    first_id.append(sse_data(line + "\n\n")[0]["response"]["id"])
    except httpx.HTTPError:  # the server was killed under it
        pass


def test_kill_9_during_background_responses_loses_nothing(smollm2_dir, tmp_path):
    env = model_env(smollm2_dir)
    server = LiveServer(env, tmp_path)
    try:
        server.wait_ready()
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0,
                               timeout=60)
        finished = client.responses.create(model="smollm2-135m-instruct", input="Say hi.", max_output_tokens=4)
        killed = [client.responses.create(
            model="smollm2-135m-instruct", input=f"Count from {i} to a thousand.", background=True,
            max_output_tokens=1500, extra_body={"ignore_eos": True}).id for i in range(4)]
        streamed: list[str] = []
        reader = threading.Thread(target=stream_response, daemon=True, args=(server.url, {
            "model": "smollm2-135m-instruct", "input": "Name every country.", "max_output_tokens": 1500,
            "ignore_eos": True}, streamed))
        reader.start()
        wait_for(lambda: streamed, 60, "the streamed response to start")
        killed += streamed
        db = ServerDb(server.db)
        wait_for(lambda: all(db.deltas(rid) >= 2 for rid in killed), 120,
                 "text recorded for every response")
        before = {rid: db.events(rid) for rid in killed}
        server.proc.kill()  # no drain, no heartbeat stop: the process is just gone
        server.proc.wait()
        reader.join(30)
    finally:
        server.stop()

    restarted = LiveServer(env, tmp_path)  # the same database, a new process
    try:
        restarted.wait_ready()
        # The restart rule ran before the model loaded: nothing is left unfinished.
        statuses = db.statuses()
        assert not [rid for rid, status in statuses.items() if status in ("queued", "in_progress")]
        assert {statuses[rid] for rid in killed} == {"failed"}
        client = openai.OpenAI(base_url=restarted.url + "/v1", api_key="k", max_retries=0,
                               timeout=60)
        assert client.responses.retrieve(finished.id).model_dump() == finished.model_dump()
        events_type = TypeAdapter(openai.types.responses.ResponseStreamEvent)
        for rid in killed:
            events = db.events(rid)
            assert events[:len(before[rid])] == before[rid]  # what was recorded stays
            final = check_responses_stream(events)
            assert final["error"]["message"] == RESTART_MESSAGE
            replay = sse_data(httpx.get(f"{restarted.url}/v1/responses/{rid}",
                                        params={"stream": "true"}, timeout=60).text)
            assert replay == events
            for event in replay:  # the official SDK's types accept every event
                events_type.validate_python(event)
            stored = client.responses.retrieve(rid)
            assert stored.status == "failed"
            body = httpx.get(f"{restarted.url}/v1/responses/{rid}", timeout=60).json()
            assert body == final and body["output"] == db.output(rid)
            # Every text delta recorded before the kill (more may land after the snapshot `before`).
            streamed_text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
            assert stored.output_text == message_text(final["output"]) == streamed_text != ""
            (item,) = client.responses.input_items.list(rid).data
            assert item.content[0].text.startswith(("Count from", "Name every"))
    finally:
        restarted.stop()
