"""The live dashboard's websocket (inference/operations/dashboard.py) with channels' WebsocketCommunicator: staff only,
snapshots of the real engine while a request runs, cancel and the replica selector through the
(in-memory) channel layer."""
import asyncio
import json
import time

import pytest
from channels.layers import channel_layers
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser, User

from inference.operations import replica
from inference.operations.dashboard import CLOSE_NOT_STAFF
from inference.routing import websocket_urlpatterns

from .asgi_client import serve
from .observed import request

URL = "/ws/admin/dashboard/"
STORY = [{"role": "user", "content": "Tell me a very long story about a lighthouse."}]


@pytest.fixture(autouse=True)
def fresh_layer(settings):
    """A new in-memory channel layer per test (its queues belong to the test's event loop)."""
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    channel_layers.backends.clear()
    replica._replicas = (0.0, [])
    yield
    channel_layers.backends.clear()


def staff():
    return User(username="op", is_staff=True, is_active=True)


async def connect(user, agents=1):
    """A communicator as `user`, with this replica's agent running (its task is returned too)."""
    tasks = [asyncio.create_task(replica.ReplicaAgent().run()) for _ in range(agents)]
    await asyncio.sleep(0.05)  # the agent has joined its group
    communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), URL)
    communicator.scope["user"] = user
    return communicator, tasks


async def receive(communicator, kind: str, timeout_s: float = 10.0, where=lambda m: True) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        message = await communicator.receive_json_from(timeout=max(0.01, deadline - time.monotonic()))
        if message["type"] == kind and where(message):
            return message


async def stop(communicator, tasks):
    await communicator.disconnect()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@pytest.mark.parametrize("user", [AnonymousUser(), User(username="visitor", is_staff=False, is_active=True),
                                  User(username="gone", is_staff=True, is_active=False)])
def test_only_staff_get_in(user, db):
    async def scenario():
        communicator, tasks = await connect(user)
        connected, code = await communicator.connect()
        for task in tasks:
            task.cancel()
        return connected, code

    assert serve(scenario) == (False, CLOSE_NOT_STAFF)


def test_a_staff_user_gets_snapshots_of_a_running_request_and_cancels_it(real_rt):
    async def scenario():
        communicator, tasks = await connect(staff())
        assert (await communicator.connect())[0]
        first = await receive(communicator, "snapshot")
        req = await request("POST", "/v1/chat/completions", {
            "model": "smollm2-135m-instruct", "messages": STORY, "max_tokens": 400, "stream": True, "ignore_eos": True},
            headers={"x-request-id": "req_dash"}).start()
        await req.chunk()
        running = await receive(communicator, "snapshot", where=lambda m: m["running"])
        started = time.monotonic()
        later = await receive(communicator, "snapshot")
        rate_gap = time.monotonic() - started
        await communicator.send_json_to({"type": "cancel", "request_id": "req_dash"})
        result = await receive(communicator, "cancel_result")
        body = await req.read_all(timeout_s=30)
        after = await receive(communicator, "snapshot", where=lambda m: not m["running"])
        await stop(communicator, tasks)
        return first, running, later, rate_gap, result, body, after

    first, running, later, rate_gap, result, body, after = serve(scenario)
    assert first["replica"] == replica.replica_id() and first["replicas"][0] == first["replica"]
    assert first["model"]["state"] == "ready" and first["model"]["id"] == "smollm2-135m-instruct"
    assert set(first["kv"]) == {"blocks_total", "blocks_used", "blocks_cached", "blocks_free", "block_size", "usage"}
    assert {"block_size", "max_num_seqs", "device", "dtype"} <= set(first["engine"])
    assert set(first["series"]) == {"interval_s", "window_s", "points", "window"}
    [view] = running["running"]
    assert view["request_id"] == "req_dash-0" and view["http_request_id"] == "req_dash"
    assert view["tenant"] == "default" and view["route"] == "v1/chat/completions"
    assert view["prompt_tokens"] > 0 and view["prefill_progress"] == 1.0 and view["generated_tokens"] >= 1
    assert "Lighthouse" not in json.dumps(running) and "lighthouse" not in json.dumps(running)
    assert running["kv"]["blocks_used"] > 0
    # Every configured model's state, and each resident chat engine with its own requests.
    assert [(m["id"], m["state"]) for m in running["models"]] == [("smollm2-135m-instruct", "loaded")]
    [engine] = running["engines"]
    assert engine["id"] == "smollm2-135m-instruct" and engine["running"] == running["running"]
    assert rate_gap >= 0.3  # a few snapshots per second at most
    assert result == {"type": "cancel_result", "request_id": "req_dash", "replica": replica.replica_id(),
                      "cancelled": 1}
    assert b'"code":"cancelled"' in body and body.rstrip().endswith(b"data: [DONE]")
    assert after["kv"]["blocks_used"] == 0


def test_bad_messages_get_an_error_and_the_socket_stays_open(real_rt):
    async def scenario():
        communicator, tasks = await connect(staff())
        await communicator.connect()
        answers = []
        for message in ("not json", json.dumps([1]), json.dumps({"type": "reboot"}),
                        json.dumps({"type": "cancel"}), json.dumps({"type": "select", "replica": "nowhere"})):
            await communicator.send_to(text_data=message)
            answers.append(await receive(communicator, "error"))
        await communicator.send_json_to({"type": "cancel", "request_id": "req_nobody"})
        result = await receive(communicator, "cancel_result")
        await stop(communicator, tasks)
        return answers, result

    answers, result = serve(scenario)
    assert len(answers) == 5 and all(a["message"] for a in answers)
    assert result["cancelled"] == 0


def test_the_replica_selector_watches_another_replica_and_cancels_there(real_rt, monkeypatch):
    """Two agents in one process stand for two replicas: the one selected publishes the snapshots
    and receives the cancel through the channel layer."""
    other = "otherhost:4242:abcdef"

    async def scenario():
        own = replica.replica_id()
        tasks = [asyncio.create_task(replica.ReplicaAgent().run())]
        monkeypatch.setattr(replica, "replica_id", lambda: other)
        tasks.append(asyncio.create_task(replica.ReplicaAgent().run()))
        await asyncio.sleep(0.5)
        monkeypatch.setattr(replica, "replica_id", lambda: own)
        monkeypatch.setattr(replica, "replicas", _async([own, other]))
        communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), URL)
        communicator.scope["user"] = staff()
        await communicator.connect()
        assert (await receive(communicator, "snapshot"))["replica"] == own
        await communicator.send_json_to({"type": "select", "replica": other})
        picked = await receive(communicator, "snapshot", where=lambda m: m["replica"] == other)
        await communicator.send_json_to({"type": "cancel", "request_id": "req_nobody"})
        result = await receive(communicator, "cancel_result")
        await stop(communicator, tasks)
        return picked, result

    picked, result = serve(scenario)
    assert picked["replicas"] == [replica.replica_id(), other]
    assert result["replica"] == other


def _async(value):
    async def give():
        return value
    return give


def test_a_snapshot_shows_each_resident_chat_engine_and_every_configured_model(smollm2_engine, smollm2_tokenizer,
                                                                               smollm2_dir, db):
    """Two chat models resident (stand-ins over the one real engine, each its own Runtime) and one configured but
    unloaded: each resident one's engine view, every model's state."""
    from asgiref.sync import async_to_sync

    from inference.operations.model_specs import CHAT, ModelSpec
    from inference.operations.registry import serving
    from inference.operations.runtime import Runtime

    from .registries import registry_of

    first, second = (Runtime(smollm2_engine, smollm2_tokenizer, name, smollm2_dir, 0) for name in ("chat-a", "chat-b"))
    with serving(registry_of(first, second, ModelSpec("chat-c", smollm2_dir, CHAT))):
        snap = async_to_sync(replica.snapshot)()
    assert [(m["id"], m["state"]) for m in snap["models"]] == [("chat-a", "loaded"), ("chat-b", "loaded"),
                                                               ("chat-c", "unloaded")]
    assert [e["id"] for e in snap["engines"]] == ["chat-a", "chat-b"]
    assert all(e["kv"]["blocks_total"] > 0 and e["running"] == [] for e in snap["engines"])
    assert snap["model"]["id"] == "chat-a" and snap["kv"] == snap["engines"][0]["kv"]  # the default's at the top
