"""The drain in-process (metrale_site/drain.py), with a stand-in application and engine: while
draining, new requests get 503 in OpenAI's shape (/health its own), requests in flight run on,
and only what is still running after the grace period is ended through the engine."""
import asyncio
import json
import threading

import pytest

from inference.operations import runtime
from inference.operations.registry import serving
from tests.api.registries import registry_of
from metrale_site import drain


class Engine:
    def __init__(self):
        self.failed: list[str] = []
        self.stopped = False

    def fail_all(self, message: str) -> None:
        self.failed.append(message)

    def stop(self) -> None:
        self.stopped = True


@pytest.fixture
def fresh(monkeypatch, settings):
    from batches import execution

    # drain() stops this process's batch runs for good (execution.stopping): a flag of the test's own,
    # so the batch tests that run after it in this process still run their batches.
    monkeypatch.setattr(execution, "stopping", threading.Event())
    monkeypatch.setattr(drain, "_inflight", set())
    monkeypatch.setattr(drain, "_draining_since", None)
    monkeypatch.setattr(drain, "SETTLE_S", 0.2)
    settings.METRALE = {**settings.METRALE, "SHUTDOWN_GRACE_S": 0.5}
    engine = Engine()
    with serving(registry_of(runtime.Runtime(engine, None, "m", None, 0))):
        yield engine


async def call(app, path="/v1/models"):
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    await app({"type": "http", "path": path, "method": "GET"}, receive, send)
    return sent


async def held_request():
    """(the gated app, its release event, the task of a request it holds until released)."""
    release = asyncio.Event()

    async def app(scope, receive, send):
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    gated = drain.gate(app)
    running = asyncio.create_task(call(gated))
    await asyncio.sleep(0.05)
    return gated, release, running


def test_a_request_in_flight_finishes_and_new_ones_get_503(fresh):
    async def scenario():
        app, release, running = await held_request()
        draining = asyncio.create_task(drain.drain())
        await asyncio.sleep(0.05)
        assert drain.draining()
        start, body = await call(app)
        assert start["status"] == 503
        headers = dict(start["headers"])
        assert int(headers[b"retry-after"]) >= 1 and headers[b"connection"] == b"close"
        error = json.loads(body["body"])["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert (error["type"], error["code"]) == ("server_error", "server_shutting_down")
        health = json.loads((await call(app, "/health"))[1]["body"])
        assert health == {"status": "draining"}
        release.set()  # the request in flight ends within the grace period
        assert (await running)[0]["status"] == 200
        await draining
    asyncio.run(scenario())
    assert fresh.failed == [] and fresh.stopped


def test_what_outlives_the_grace_period_is_ended_through_the_engine(fresh):
    async def scenario():
        _, release, running = await held_request()
        await drain.drain()
        assert fresh.failed == [drain.SHUTDOWN_MESSAGE]
        release.set()
        await running
    asyncio.run(scenario())
    assert fresh.stopped
