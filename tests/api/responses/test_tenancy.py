"""Tenant isolation: one tenant can never read, list, continue, cancel or delete another's
responses or conversations; every such attempt is a 404, never a 403."""

import pytest

from responses_api import tenancy
from responses_api.models import Conversation, StoredResponse

from .support import delete, get, post, sse_events


@pytest.fixture
def owned(client, script):
    """Tenant "a"'s streamed response and conversation (with one item)."""
    events = sse_events(post(client, "/v1/responses", {"input": "Hi", "stream": True}, "a"))
    rid = events[-1]["response"]["id"]
    conv = post(client, "/v1/conversations",
                {"items": [{"role": "user", "content": "secret"}], "metadata": {"m": "1"}},
                "a").json()
    item_id = get(client, f"/v1/conversations/{conv['id']}/items", "a").json()["data"][0]["id"]
    return rid, conv["id"], item_id


def attempts(rid, cid, item_id):
    """Every endpoint, as (method, path, body, query) aimed at tenant a's objects."""
    return [
        ("GET", f"/v1/responses/{rid}", None, {}),
        ("GET", f"/v1/responses/{rid}", None, {"stream": "true"}),
        ("GET", f"/v1/responses/{rid}", None, {"stream": "true", "starting_after": "2"}),
        ("GET", f"/v1/responses/{rid}/input_items", None, {}),
        ("POST", f"/v1/responses/{rid}/cancel", {}, {}),
        ("POST", "/v1/responses", {"input": "Go on", "previous_response_id": rid}, {}),
        ("POST", "/v1/responses", {"input": "Go on", "conversation": cid}, {}),
        ("POST", "/v1/responses", {"input": "Go on", "conversation": {"id": cid}}, {}),
        ("GET", f"/v1/conversations/{cid}", None, {}),
        ("POST", f"/v1/conversations/{cid}", {"metadata": {"m": "changed"}}, {}),
        ("GET", f"/v1/conversations/{cid}/items", None, {}),
        ("POST", f"/v1/conversations/{cid}/items", {"items": [{"role": "user",
                                                               "content": "x"}]}, {}),
        ("GET", f"/v1/conversations/{cid}/items/{item_id}", None, {}),
        ("DELETE", f"/v1/conversations/{cid}/items/{item_id}", None, {}),
        ("DELETE", f"/v1/conversations/{cid}", None, {}),
        ("DELETE", f"/v1/responses/{rid}", None, {}),
    ]


def send(client, method, path, body, query, tenant):
    if method == "GET":
        return get(client, path, tenant, **query)
    if method == "DELETE":
        return delete(client, path, tenant)
    return post(client, path, body, tenant)


def test_another_tenant_gets_404_from_every_endpoint_and_changes_nothing(client, owned):
    rid, cid, item_id = owned
    for method, path, body, query in attempts(rid, cid, item_id):
        r = send(client, method, path, body, query, "b")
        assert r.status_code == 404, (method, path, query, r.content)
        assert r.json()["error"]["code"] in ("response_not_found", "conversation_not_found")

    assert get(client, f"/v1/responses/{rid}", "a").status_code == 200
    assert StoredResponse.objects.filter(tenant_key="a").count() == 1
    assert not StoredResponse.objects.filter(tenant_key="b").exists()
    conv = Conversation.objects.get(pk=cid)
    assert conv.metadata == {"m": "1"} and conv.items.count() == 1


def test_the_owner_reaches_every_endpoint(client, owned):
    rid, cid, item_id = owned
    for method, path, body, query in attempts(rid, cid, item_id):
        r = send(client, method, path, body, query, "a")
        # a response that was not created in the background cannot be cancelled
        expected = 400 if path.endswith("/cancel") else 200
        assert r.status_code == expected, (method, path, r.content)
    assert not Conversation.objects.exists()
    assert not StoredResponse.objects.filter(pk=rid).exists()


def test_tenant_key_for_reads_the_principal_auth_sets():
    class Request:
        pass

    request = Request()
    assert tenancy.tenant_key_for(request) == "default"
    request.principal = None
    assert tenancy.tenant_key_for(request) == "default"

    class Tenant:
        pk = 42

    class Principal:
        tenant = Tenant()

    request.principal = Principal()
    assert tenancy.tenant_key_for(request) == "42"
