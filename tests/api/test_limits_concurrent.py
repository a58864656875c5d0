"""32 streamed chat completions at once against a tenant whose concurrency (or request burst) is 5:
exactly 5 are admitted and the other 27 get a 429, on local memory and on the real Redis; the 5
hold their slots until they end, and then nothing is left in flight."""
import asyncio
import json

import pytest
from asgiref.sync import sync_to_async

from inference.models import RateLimitContext

from .asgi_client import AsgiRequest, serve
from .fake_engine import FakeHandle

pytestmark = pytest.mark.django_db

REQUESTS = 32


class GatedHandle(FakeHandle):
    """Holds back its last event (Finished) until the gate opens: the stream stays generating."""

    def __init__(self, events, gate: asyncio.Event):
        super().__init__(events)
        self.gate = gate

    async def __anext__(self):
        if len(self.events) == 1:
            await self.gate.wait()
        return await super().__anext__()


def in_flight(tenant):
    return RateLimitContext.objects.get(tenant=tenant, api_key=None).usage().snapshot.in_flight


@pytest.mark.parametrize("limits, param", [
    ({"max_concurrent_requests": 5}, "concurrency"),
    ({"requests_per_minute": 60, "burst_requests": 5}, "requests"),
], ids=["concurrency", "burst"])
def test_32_at_once_against_a_limit_of_5_admit_exactly_5(fake_rt, cache_backend, frozen_clock,
                                                        require_auth, make_tenant, make_key,
                                                        monkeypatch, limits, param):
    tenant = make_tenant(**limits)
    _, key = make_key(tenant)
    engine = fake_rt.engine
    submit = engine.submit

    async def scenario():
        gate = asyncio.Event()
        monkeypatch.setattr(engine, "submit", lambda request: GatedHandle(
            submit(request).events, gate))
        body = json.dumps({"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "Hi"}],
                           "max_tokens": 4, "stream": True}).encode()
        headers = {"Authorization": f"Bearer {key}", "content-type": "application/json"}
        requests = [AsgiRequest("POST", "/v1/chat/completions", headers, body)
                    for _ in range(REQUESTS)]
        await asyncio.gather(*(r.start() for r in requests))
        admitted = [r for r in requests if r.status == 200]
        refused = [r for r in requests if r.status != 200]
        assert len(admitted) == 5 and {r.status for r in refused} == {429}
        assert len(engine.submissions) == 5  # the refused never reached the engine
        for r in refused:
            error = json.loads(await r.read_all())["error"]
            assert (error["code"], error["param"]) == ("rate_limit_exceeded", param)
            assert int(r.headers["retry-after"]) >= 1
        assert await sync_to_async(in_flight)(tenant) == 5
        gate.set()
        for r in admitted:
            assert (await r.read_all()).endswith(b"data: [DONE]\n\n")
        assert await sync_to_async(in_flight)(tenant) == 0

    serve(scenario)
