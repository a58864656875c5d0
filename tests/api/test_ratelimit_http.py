"""Rate limits through real HTTP: /v1/models for requests per minute, and a test-only streaming
endpoint (stream_views.py) for token refunds and the concurrency cap, on both cache backends."""
import asyncio
import json

import pytest
from asgiref.sync import sync_to_async

from inference.models import RateLimitContext

from .asgi_client import AsgiRequest, serve
from .stream_views import gates

pytestmark = pytest.mark.django_db


def bearer(key):
    return {"Authorization": f"Bearer {key}"}


def models(client, key):
    return client.get("/v1/models", headers=bearer(key))


def stream_url(prompt=10, max_tokens=100, chunks=5, gate=None):
    url = f"/v1/test/stream?prompt={prompt}&max_tokens={max_tokens}&chunks={chunks}"
    return url + (f"&gate={gate}" if gate else "")


def tokens_left(tenant):
    return RateLimitContext.objects.get(tenant=tenant, api_key=None).usage().snapshot.tokens


def in_flight(tenant):
    return RateLimitContext.objects.get(tenant=tenant, api_key=None).usage().snapshot.in_flight


@pytest.fixture
def stream_site(settings, require_auth, raw_asgi_requests):
    settings.ROOT_URLCONF = "tests.api.stream_urls"
    gates.clear()
    yield
    gates.clear()


def test_rpm_3_denies_the_fourth_then_serves_after_the_reset(client, cache_backend, frozen_clock,
                                                             require_auth, make_tenant, make_key):
    _, key = make_key(make_tenant("first", requests_per_minute=3))
    _, other = make_key(make_tenant("second", requests_per_minute=3))

    for remaining in ("2", "1", "0"):
        response = models(client, key)
        assert response.status_code == 200
        assert response.headers["x-ratelimit-limit-requests"] == "3"
        assert response.headers["x-ratelimit-remaining-requests"] == remaining
        assert response.headers["x-ratelimit-limit-tokens"] == "unlimited"

    denied = models(client, key)
    assert denied.status_code == 429
    error = denied.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("rate_limit_exceeded",
                                                             "rate_limit_exceeded", "requests")
    retry_after = int(denied.headers["Retry-After"])
    assert retry_after >= 1
    assert denied.headers["x-ratelimit-remaining-requests"] == "0"
    assert denied.headers["x-ratelimit-reset-requests"] == "1m0s"
    for header in ("x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens",
                   "x-ratelimit-reset-tokens"):
        assert header in denied.headers

    assert models(client, other).status_code == 200  # the second tenant is unaffected

    frozen_clock.advance(retry_after)
    assert models(client, key).status_code == 200


def test_a_stream_is_charged_its_real_usage_when_it_ends(cache_backend, frozen_clock, stream_site,
                                                         make_tenant, make_key):
    tenant = make_tenant(tokens_per_minute=1000)
    _, key = make_key(tenant)

    async def scenario():
        assert await sync_to_async(tokens_left)(tenant) == 1000  # before
        gates["end"] = asyncio.Event()
        stream = await AsgiRequest("GET", stream_url(10, 100, 5, gate="end"), bearer(key)).start()
        assert stream.status == 200
        assert stream.headers["x-ratelimit-remaining-tokens"] == "890"
        assert b"token" in await stream.chunk()
        assert await sync_to_async(tokens_left)(tenant) == 890  # during: all 110 reserved
        gates["end"].set()
        body = await stream.read_all()
        assert body.endswith(b"data: [DONE]\n\n")
        assert await sync_to_async(tokens_left)(tenant) == 1000 - (10 + 5)  # after: real usage
        assert await sync_to_async(in_flight)(tenant) == 0

    serve(scenario)


def test_a_cancelled_stream_is_charged_only_what_it_generated(cache_backend, frozen_clock,
                                                              stream_site, make_tenant, make_key):
    tenant = make_tenant(tokens_per_minute=1000)
    _, key = make_key(tenant)

    async def scenario():
        gates["never"] = asyncio.Event()
        stream = await AsgiRequest("GET", stream_url(10, 100, 3, gate="never"), bearer(key)).start()
        for _ in range(3):
            assert b"token" in await stream.chunk()
        assert await sync_to_async(tokens_left)(tenant) == 890
        await stream.disconnect()
        assert await sync_to_async(tokens_left)(tenant) == 1000 - (10 + 3)
        assert await sync_to_async(in_flight)(tenant) == 0

    serve(scenario)


def test_a_slow_client_gone_is_charged_only_what_was_generated(cache_backend, frozen_clock,
                                                              stream_site, make_tenant, make_key):
    # The server is blocked sending to a client that reads nothing when the client leaves: the
    # cancellation lands in `send`, not in the view's generator, which is then closed from
    # outside; the lease is still settled at once, with the real usage.
    tenant = make_tenant(tokens_per_minute=1000)
    _, key = make_key(tenant)

    async def scenario():
        gates["never"] = asyncio.Event()
        stream = await AsgiRequest("GET", stream_url(10, 100, 3, gate="never"), bearer(key),
                                   send_buffer=1).start()
        await asyncio.sleep(0.2)  # chunk 0 waits in the buffer, chunk 1 in `send`
        await stream.disconnect()
        await asyncio.sleep(0.2)  # closed generators are finalized by the event loop
        assert await sync_to_async(tokens_left)(tenant) == 1000 - (10 + 2)
        assert await sync_to_async(in_flight)(tenant) == 0

    serve(scenario)


def test_concurrency_2_refuses_a_third_stream_until_one_ends(cache_backend, frozen_clock,
                                                            stream_site, make_tenant, make_key):
    _, key = make_key(make_tenant(max_concurrent_requests=2))

    async def scenario():
        gates["a"], gates["b"], gates["c"] = asyncio.Event(), asyncio.Event(), asyncio.Event()
        first = await AsgiRequest("GET", stream_url(gate="a"), bearer(key)).start()
        second = await AsgiRequest("GET", stream_url(gate="b"), bearer(key)).start()
        assert (first.status, second.status) == (200, 200)
        await first.chunk()
        await second.chunk()

        third = await AsgiRequest("GET", stream_url(gate="c"), bearer(key)).start()
        assert third.status == 429
        assert int(third.headers["retry-after"]) >= 1
        assert "x-ratelimit-remaining-requests" in third.headers
        error = json.loads(await third.read_all())["error"]
        assert (error["param"], error["code"]) == ("concurrency", "rate_limit_exceeded")

        gates["a"].set()
        await first.read_all()
        fourth = await AsgiRequest("GET", stream_url(gate="c"), bearer(key)).start()
        assert fourth.status == 200
        gates["b"].set()
        gates["c"].set()
        await second.read_all()
        await fourth.read_all()

    serve(scenario)


def test_a_generating_view_that_answers_before_admission_still_sends_the_headers(
        client, frozen_clock, stream_site, make_tenant, make_key):
    _, key = make_key(make_tenant(tokens_per_minute=100, requests_per_minute=5))
    response = client.get(stream_url(10, 1000), headers=bearer(key))
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "request_too_large"
    assert response.headers["x-ratelimit-remaining-requests"] == "5"  # nothing debited
    assert response.headers["x-ratelimit-remaining-tokens"] == "100"


def test_a_blocking_views_lease_is_settled_by_the_wrapper(client, frozen_clock, stream_site,
                                                      make_tenant, make_key):
    tenant = make_tenant(tokens_per_minute=1000, max_concurrent_requests=1)
    _, key = make_key(tenant)
    for _ in range(2):  # the second would be refused if the first had kept its slot
        assert client.get("/v1/test/forgetful?reserve=100", headers=bearer(key)).status_code == 200
    assert tokens_left(tenant) == 800
    assert in_flight(tenant) == 0


def test_a_streams_lease_is_settled_when_its_body_ends(frozen_clock, stream_site,
                                                                   make_tenant, make_key):
    tenant = make_tenant(tokens_per_minute=1000, max_concurrent_requests=1)
    _, key = make_key(tenant)

    async def scenario():
        for _ in range(2):  # the second would be refused if the first had kept its slot
            stream = await AsgiRequest("GET", "/v1/test/forgetful?reserve=100&stream=1",
                                       bearer(key)).start()
            assert stream.status == 200
            assert await stream.read_all() == b"data: [DONE]\n\n"
            await asyncio.sleep(0.05)  # the close hook runs on the event loop
        assert await sync_to_async(tokens_left)(tenant) == 800
        assert await sync_to_async(in_flight)(tenant) == 0

    serve(scenario)
