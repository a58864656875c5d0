"""The rows every API request looks up, remembered for a moment (inference/tenancy/recent.py): a change
saved through the ORM is seen by the next request, a raw UPDATE within recent.TTL_S."""
import time

import pytest
from django.utils import timezone

from inference.models import ApiKey, RateLimitContext
from inference.tenancy import apikeys, recent


@pytest.fixture
def key(make_tenant, make_key, require_auth):
    tenant = make_tenant()
    row, token = make_key(tenant, name="k")
    return row, token


def models(client, token):
    return client.get("/v1/models", headers={"Authorization": f"Bearer {token}"})


@pytest.mark.django_db
def test_a_key_revoked_through_the_orm_is_refused_by_the_next_request(client, key):
    row, token = key
    assert models(client, token).status_code == 200
    assert recent.recall(("key", apikeys.hash_key(token))) is not None
    row.revoked = True
    row.save()
    response = models(client, token)
    assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"


@pytest.mark.django_db
def test_a_raw_update_is_seen_within_the_ttl(client, key, monkeypatch):
    monkeypatch.setattr(recent, "TTL_S", 0.2)
    row, token = key
    assert models(client, token).status_code == 200
    ApiKey.objects.filter(pk=row.pk).update(revoked=True, revoked_at=timezone.now())  # no signal
    assert models(client, token).status_code == 200  # remembered
    time.sleep(0.25)
    assert models(client, token).status_code == 401


@pytest.mark.django_db
def test_new_limits_saved_through_the_orm_apply_to_the_next_request(client, key):
    row, token = key
    assert models(client, token).headers["x-ratelimit-limit-requests"] == "unlimited"
    RateLimitContext.objects.create(tenant=row.tenant, requests_per_minute=7)
    assert models(client, token).headers["x-ratelimit-limit-requests"] == "7"


def test_entries_expire_and_the_table_stays_bounded(monkeypatch):
    monkeypatch.setattr(recent, "TTL_S", 0.05)
    recent.remember(("x",), 1)
    assert recent.recall(("x",)) == 1
    time.sleep(0.06)
    assert recent.recall(("x",)) is None
    for i in range(10_005):
        recent.remember(("n", i), i)
    assert len(recent._entries) <= 10_001


def test_callers_missing_one_entry_together_share_one_lookup():
    import asyncio

    calls = []

    async def load():
        calls.append(1)
        await asyncio.sleep(0.01)
        return recent.remember(("shared",), "row")

    async def main():
        return await asyncio.gather(*(recent.shared_load(("shared",), load) for _ in range(20)))

    assert asyncio.run(main()) == ["row"] * 20
    assert len(calls) == 1 and recent.recall(("shared",)) == "row" and not recent._loads


def test_a_failed_shared_lookup_fails_every_waiting_caller_and_the_next_one_looks_up_again():
    import asyncio

    calls = []

    async def failing():
        calls.append(1)
        await asyncio.sleep(0.01)
        raise ConnectionError("database gone")

    async def main():
        first = await asyncio.gather(*(recent.shared_load(("failing",), failing) for _ in range(5)),
                                     return_exceptions=True)
        again = await asyncio.gather(recent.shared_load(("failing",), failing), return_exceptions=True)
        return first, again

    first, again = asyncio.run(main())
    assert all(isinstance(e, ConnectionError) for e in first + again) and len(calls) == 2


def test_a_cancelled_first_caller_leaves_the_waiting_ones_to_look_up_again():
    import asyncio

    calls = []

    async def load():
        calls.append(1)
        await asyncio.sleep(0.05)
        return "row"

    async def main():
        first = asyncio.create_task(recent.shared_load(("cancelled",), load))
        await asyncio.sleep(0)
        waiter = asyncio.create_task(recent.shared_load(("cancelled",), load))
        await asyncio.sleep(0.01)
        first.cancel()
        result = await waiter
        return first, result

    first, result = asyncio.run(main())
    assert first.cancelled() and result == "row" and len(calls) == 2 and not recent._loads


def test_recall_or_load_remembers_what_it_loaded_and_loads_again_once_it_lapses(monkeypatch):
    import asyncio

    now = [100.0]
    monkeypatch.setattr(recent.time, "monotonic", lambda: now[0])
    calls = []

    async def load():
        calls.append(1)
        return f"row {len(calls)}"

    assert asyncio.run(recent.recall_or_load(("ror",), load)) == "row 1"
    assert asyncio.run(recent.recall_or_load(("ror",), load)) == "row 1" and len(calls) == 1
    now[0] += recent.TTL_S + 0.1
    assert asyncio.run(recent.recall_or_load(("ror",), load)) == "row 2" and recent.recall(("ror",)) == "row 2"
