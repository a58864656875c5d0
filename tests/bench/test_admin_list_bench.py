"""Benchmark print: the admin's stored-response list over 1000 responses (server time).

Not a timed assertion (the machine is shared); run with `-s` to see the figures. The issue's
target is under one second of server time for the page listing them.
"""

import time

import pytest
from django.utils import timezone

from inference.models import Tenant
from responses_api.models import ResponseItem, StoredResponse, expiry_from

pytestmark = pytest.mark.django_db


def seed(n: int) -> list[Tenant]:
    now = timezone.now()
    tenants = [Tenant.objects.create(name=f"t{k}") for k in range(5)]
    rows, items = [], []
    for i in range(n):
        rid = f"resp_bench{i:05d}"
        body = {"id": rid, "object": "response", "status": "completed", "model": "smollm2",
                "output": [{"id": f"msg_{i}", "type": "message", "role": "assistant",
                            "status": "completed",
                            "content": [{"type": "output_text", "text": "word " * 60}]}],
                "metadata": {"run": str(i % 7)}}
        rows.append(StoredResponse(id=rid, tenant=tenants[i % 5], model="smollm2",
                                   status="completed" if i % 9 else "incomplete", body=body,
                                   metadata=body["metadata"], input_tokens=40, output_tokens=60,
                                   created_at=now, expires_at=expiry_from(now)))
        items.append(ResponseItem(response_id=rid, position=0, direction="input",
                                  item_id=f"msg_in{i}", type="message",
                                  data={"type": "message", "role": "user", "content": []}))
    StoredResponse.objects.bulk_create(rows)
    ResponseItem.objects.bulk_create(items)
    return tenants


def test_admin_list_of_1000_stored_responses(admin_client, monkeypatch):
    from django.template import Template
    from django.test.utils import _TestState

    # Time the server as it runs, without the test runner's per-template context recording.
    monkeypatch.setattr(Template, "_render", _TestState.saved_data.template_render)
    tenants = seed(1000)
    url = "/admin/responses_api/storedresponse/"
    admin_client.get(url)  # warm templates
    for label, query in (("first page (100 rows)", {}), ("show all (1000 rows)", {"all": ""}),
                         ("filtered by tenant and status", {"tenant__id__exact": tenants[1].pk,
                                                                   "status__exact": "completed"}),
                         ("search metadata", {"q": "run"})):
        start = time.perf_counter()
        r = admin_client.get(url, query)
        elapsed = time.perf_counter() - start
        assert r.status_code == 200
        print(f"\nadmin stored-response list, {label}: {elapsed * 1000:.0f} ms server time")
