"""The limiter at the acquire/release level, on local memory and on the real Redis."""
import pytest
from asgiref.sync import async_to_sync, sync_to_async

from inference.tenancy.auth import Principal
from inference.models import RateLimitContext
from inference.tenancy.ratelimit import acquire, debit_request
from inference.serving.errors import ApiError

pytestmark = pytest.mark.django_db


def principal_of(tenant, key=None):
    return Principal(tenant, key, tenant.prefix_cache_salt)


def usage(tenant):
    return RateLimitContext.objects.get(tenant=tenant, api_key=None).usage()


def run(coro_fn, *args, **kwargs):
    return async_to_sync(coro_fn)(*args, **kwargs)


def denial(coro_fn, *args, **kwargs) -> ApiError:
    with pytest.raises(ApiError) as caught:
        run(coro_fn, *args, **kwargs)
    return caught.value


def test_it_denies_the_fourth_request_at_rpm_3(cache_backend, frozen_clock, make_tenant):
    tenant = make_tenant(requests_per_minute=3)
    remaining = [run(debit_request, principal_of(tenant)).headers()["x-ratelimit-remaining-requests"]
                 for _ in range(3)]
    assert remaining == ["2", "1", "0"]

    error = denial(debit_request, principal_of(tenant))
    assert error.status == 429
    assert (error.type, error.code, error.param) == ("rate_limit_exceeded", "rate_limit_exceeded",
                                                     "requests")
    assert error.headers["Retry-After"] == "20"  # one request refills every 60/3 s
    assert error.headers["x-ratelimit-limit-requests"] == "3"
    assert error.headers["x-ratelimit-remaining-requests"] == "0"
    assert error.headers["x-ratelimit-reset-requests"] == "1m0s"

    frozen_clock.advance(20)
    assert run(debit_request, principal_of(tenant)).headers()["x-ratelimit-remaining-requests"] == "0"


def test_it_keeps_tenants_apart(cache_backend, frozen_clock, make_tenant):
    first, second = make_tenant("first", requests_per_minute=1), make_tenant("second",
                                                                            requests_per_minute=1)
    run(debit_request, principal_of(first))
    assert denial(debit_request, principal_of(first)).status == 429
    run(debit_request, principal_of(second))


def test_a_denial_costs_nothing(cache_backend, frozen_clock, make_tenant):
    tenant = make_tenant(requests_per_minute=10, tokens_per_minute=100)
    run(acquire, principal_of(tenant), reserve_tokens=80)
    error = denial(acquire, principal_of(tenant), reserve_tokens=30)
    assert error.param == "tokens"
    assert error.headers["Retry-After"] == "6"  # 10 tokens short at 100/60 per second
    state = usage(tenant)
    assert state.snapshot.requests == 9  # the denied request was not debited
    assert state.snapshot.tokens == 20
    assert state.denials_last_hour == 1


def test_a_stream_is_charged_its_real_usage_when_it_ends(cache_backend, frozen_clock,
                                                         make_tenant):
    tenant = make_tenant(tokens_per_minute=1000)
    assert usage(tenant).snapshot.tokens == 1000
    lease = run(acquire, principal_of(tenant), reserve_tokens=10 + 200)
    assert lease.headers()["x-ratelimit-remaining-tokens"] == "790"
    assert usage(tenant).snapshot.tokens == 790  # during: the whole reservation is held
    run(lease.release, 10 + 35)
    assert usage(tenant).snapshot.tokens == 1000 - 45  # after: only what was used


def test_release_is_idempotent(cache_backend, frozen_clock, make_tenant):
    tenant = make_tenant(tokens_per_minute=1000, max_concurrent_requests=1)
    lease = run(acquire, principal_of(tenant), reserve_tokens=100)
    run(lease.release, 40)
    run(lease.release, 40)
    run(lease.release, 0)
    state = usage(tenant)
    assert state.snapshot.tokens == 960
    assert state.snapshot.in_flight == 0


def test_concurrency_limit_2_admits_a_third_only_when_one_ends(cache_backend, frozen_clock,
                                                              make_tenant):
    tenant = make_tenant(max_concurrent_requests=2)
    first = run(acquire, principal_of(tenant), reserve_tokens=1)
    run(acquire, principal_of(tenant), reserve_tokens=1)
    error = denial(acquire, principal_of(tenant), reserve_tokens=1)
    assert (error.status, error.param, error.headers["Retry-After"]) == (429, "concurrency", "1")
    assert usage(tenant).snapshot.in_flight == 2
    run(first.release, 1)
    run(acquire, principal_of(tenant), reserve_tokens=1)
    assert usage(tenant).snapshot.in_flight == 2


def test_non_generating_requests_take_no_concurrency_slot(cache_backend, frozen_clock,
                                                         make_tenant):
    tenant = make_tenant(max_concurrent_requests=1, tokens_per_minute=100)
    run(acquire, principal_of(tenant), reserve_tokens=100)
    lease = run(debit_request, principal_of(tenant))
    assert lease.headers()["x-ratelimit-remaining-tokens"] == "0"
    run(lease.release, 0)


def test_a_lease_of_a_crashed_process_expires(cache_backend, frozen_clock, make_tenant, settings):
    settings.METRALE = {**settings.METRALE, "REQUEST_TIMEOUT_S": 100.0}
    tenant = make_tenant(max_concurrent_requests=1)
    run(acquire, principal_of(tenant), reserve_tokens=1)  # never released
    assert denial(acquire, principal_of(tenant), reserve_tokens=1).param == "concurrency"
    frozen_clock.advance(100 + 60 + 1)
    run(acquire, principal_of(tenant), reserve_tokens=1)


def test_a_key_with_its_own_limits_has_its_own_budget(cache_backend, frozen_clock, make_tenant,
                                                      make_key):
    tenant = make_tenant(requests_per_minute=1)
    own, _ = make_key(tenant, name="own")
    shared, _ = make_key(tenant, name="shared")
    RateLimitContext.objects.create(tenant=tenant, api_key=own, requests_per_minute=2)
    run(debit_request, principal_of(tenant, shared))
    assert denial(debit_request, principal_of(tenant, shared)).status == 429
    run(debit_request, principal_of(tenant, own))
    run(debit_request, principal_of(tenant, own))
    assert denial(debit_request, principal_of(tenant, own)).status == 429


def test_a_tenant_without_limits_falls_under_the_server_defaults(frozen_clock, make_tenant,
                                                                 settings):
    settings.METRALE = {**settings.METRALE, "RATE_LIMITS": {"RPM": 1}}
    tenant = make_tenant()
    headers = run(debit_request, principal_of(tenant)).headers()
    assert headers["x-ratelimit-limit-requests"] == "1"
    assert headers["x-ratelimit-limit-tokens"] == "unlimited"
    assert denial(debit_request, principal_of(tenant)).status == 429


def test_a_request_that_can_never_fit_is_a_400(frozen_clock, make_tenant):
    tenant = make_tenant(tokens_per_minute=100, max_tokens_per_request=50)
    error = denial(acquire, principal_of(tenant), reserve_tokens=51)
    assert (error.status, error.param, error.code) == (400, "max_tokens", "request_too_large")
    other = make_tenant("other", tokens_per_minute=100)
    assert denial(acquire, principal_of(other), reserve_tokens=101).status == 400
    run(acquire, principal_of(other), reserve_tokens=100)


def test_the_token_bucket_refills_continuously(cache_backend, frozen_clock, make_tenant):
    tenant = make_tenant(tokens_per_minute=600, burst_tokens=100)
    run(acquire, principal_of(tenant), reserve_tokens=100)
    assert denial(acquire, principal_of(tenant), reserve_tokens=50).headers["Retry-After"] == "5"
    frozen_clock.advance(5)  # 10 tokens a second
    lease = run(acquire, principal_of(tenant), reserve_tokens=50)
    assert lease.headers()["x-ratelimit-remaining-tokens"] == "0"
    assert lease.headers()["x-ratelimit-reset-tokens"] == "10s"


def test_a_request_with_its_own_timeout_holds_its_slot_that_long(cache_backend, frozen_clock,
                                                                 make_tenant):
    tenant = make_tenant(max_concurrent_requests=1)
    run(acquire, principal_of(tenant), reserve_tokens=1, timeout_s=3600)
    frozen_clock.advance(600 + 60 + 1)  # past the default deadline, within its own
    assert denial(acquire, principal_of(tenant), reserve_tokens=1).param == "concurrency"


def test_a_client_gone_during_admission_leaves_nothing_behind(frozen_clock, make_tenant,
                                                              settings, monkeypatch, request):
    import asyncio
    import threading
    import time

    from inference.tenancy.ratelimiting.redis_store import RedisStore

    from .conftest import use_redis

    request.addfinalizer(use_redis(settings))
    tenant = make_tenant(tokens_per_minute=1000, max_concurrent_requests=1)
    in_store = threading.Event()
    original = RedisStore.acquire

    def slow_acquire(self, *args, **kwargs):
        in_store.set()
        time.sleep(0.2)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(RedisStore, "acquire", slow_acquire)

    async def scenario():
        task = asyncio.ensure_future(acquire(principal_of(tenant), reserve_tokens=100))
        await asyncio.to_thread(in_store.wait, 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.5)  # the debit lands (0.2 s), then is undone
        return await sync_to_async(usage)(tenant)

    state = run(scenario)
    assert (state.snapshot.tokens, state.snapshot.in_flight) == (1000, 0)
