"""Two live replicas sharing PostgreSQL and Redis (channels-redis): this test, as one more member of the
channel layer, is a dashboard: it watches replica B, sees B's running request (and not on A), and its
cancel reaches B, whose client stream ends with an error frame code `cancelled` then [DONE]."""
import asyncio
import json
import secrets

import httpx
import pytest

from inference.operations import replica
from inference.bench.live_server import LiveServer

from .conftest import deployment_env, pg_rows, postgres_database, redis_server_url

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def two_replicas(smollm2_dir, tmp_path_factory):
    """(replica A, replica B, their replica ids by server, the Redis URL, the channel layer prefix)."""
    tmp = tmp_path_factory.mktemp("dashboard-replicas")
    with postgres_database() as postgres_url:
        prefix = f"dash-{secrets.token_hex(4)}"
        redis_url = redis_server_url()
        env = deployment_env(smollm2_dir, tmp / "files", DATABASE_URL=postgres_url, REDIS_URL=redis_url,
                             METRALE_CACHE_KEY_PREFIX=prefix)
        servers = []
        try:
            servers = [LiveServer(env, tmp / "a"), LiveServer(env, tmp / "b")]
            for server in servers:
                server.wait_ready()
            rows = dict(pg_rows(postgres_url, "SELECT pid, id FROM inference_serverprocess WHERE stopped_at IS NULL"))
            ids = {server: rows[server.proc.pid] for server in servers}
            yield servers[0], servers[1], ids, redis_url, f"{prefix}:asgi"
        finally:
            for server in servers:
                server.stop()


async def next_of(layer, channel, kind: str, where=lambda m: True, timeout_s: float = 20.0) -> dict:
    async def wait():
        while True:
            message = await layer.receive(channel)
            if message["type"] == kind and where(message):
                return message
    return await asyncio.wait_for(wait(), timeout_s)


async def as_dashboard(redis_url: str, prefix: str, a_id: str, b_id: str, request_id: str):
    from channels_redis.core import RedisChannelLayer

    layer = RedisChannelLayer(hosts=[{"address": redis_url, "socket_timeout": 30}], prefix=prefix)
    channel = await layer.new_channel()
    try:
        snapshots = {}
        for target in (a_id, b_id):
            await layer.group_add(replica.snapshot_group(target), channel)
            await layer.group_send(replica.commands_group(target), {"type": "replica.watch", "reply_to": channel})
            snapshots[target] = (await next_of(layer, channel, "dashboard.snapshot",
                                               where=lambda m: m["snapshot"]["replica"] == target))["snapshot"]
            await layer.group_discard(replica.snapshot_group(target), channel)
        await layer.group_send(replica.commands_group(b_id), {
            "type": "replica.cancel", "request_id": request_id, "reply_to": channel})
        result = await next_of(layer, channel, "dashboard.cancel_result")
        return snapshots, result
    finally:
        await layer.flush()


def test_a_dashboard_sees_and_cancels_a_request_on_another_replica(two_replicas):
    a, b, ids, redis_url, prefix = two_replicas
    body = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "Tell me a long story."}], "max_tokens": 400,
            "stream": True, "ignore_eos": True}
    with httpx.Client(timeout=120) as http, http.stream("POST", b.url + "/v1/chat/completions", json=body,
                                                          headers={"x-request-id": "req_cross"}) as stream:
        lines = stream.iter_lines()
        seen = [next(lines) for _ in range(4)]
        snapshots, result = asyncio.run(as_dashboard(redis_url, prefix, ids[a], ids[b], "req_cross"))
        seen += list(lines)
    on_a, on_b = snapshots[ids[a]], snapshots[ids[b]]
    assert on_a["running"] == [] and set(on_b["replicas"]) == set(ids.values())
    [view] = on_b["running"]
    assert view["request_id"] == "req_cross-0" and view["route"] == "v1/chat/completions"
    assert result == {"type": "dashboard.cancel_result", "request_id": "req_cross", "replica": ids[b],
                      "cancelled": 1}
    data = [line[len("data: "):] for line in seen if line.startswith("data: ")]
    assert data[-1] == "[DONE]" and json.loads(data[-2])["error"]["code"] == "cancelled"
