"""Stored chat completions (`store: true`): list with its filters and pages, get, update metadata, the
request messages, delete, their limits, the admin, and the by_method dispatcher's W002 marking."""
from datetime import timedelta

import pytest
from django.contrib.admin.utils import quote
from django.urls import path
from django.utils import timezone

from inference.operations.checks import check_guarded_routes
from inference.models import StoredChatCompletion
from inference.http.api import by_method
from inference.stored.views import retrieve

ERROR_KEYS = {"message", "type", "param", "code"}
LIST = "/v1/chat/completions"


@pytest.fixture
def api(fake_rt, as_tenant):
    return as_tenant("acme")


def make(api, text="hi", *, metadata=None, minutes_ago=0, **body) -> str:
    """A stored completion of `api`'s tenant, created `minutes_ago` minutes ago; returns its id."""
    r = api.post(LIST, {"messages": [{"role": "user", "content": text}], "store": True,
                        "metadata": metadata or {}, **body})
    assert r.status_code == 200, r.content
    cid = r.json()["id"]
    StoredChatCompletion.objects.filter(pk=cid).update(
        created_at=timezone.now() - timedelta(minutes=minutes_ago))
    return cid


def ids(page) -> list[str]:
    return [c["id"] for c in page["data"]]


def test_the_list_is_oldest_first_in_pages_with_openai_cursors(api):
    made = [make(api, f"m{i}", minutes_ago=10 - i) for i in range(5)]
    page = api.get(LIST, limit=2).json()
    assert page["object"] == "list" and ids(page) == made[:2] and page["has_more"] is True
    assert page["first_id"] == made[0] and page["last_id"] == made[1]
    assert page["data"][0]["object"] == "chat.completion" and page["data"][0]["metadata"] == {}
    rest = api.get(LIST, after=page["last_id"], limit=10).json()
    assert ids(rest) == made[2:] and rest["has_more"] is False
    newest = api.get(LIST, order="desc", limit=3).json()
    assert ids(newest) == made[::-1][:3] and newest["has_more"] is True
    assert ids(api.get(LIST, order="desc", after=made[2]).json()) == made[:2][::-1]
    assert ids(api.get(LIST).json()) == made  # default: 20, ascending
    empty = api.get(LIST, after=made[-1]).json()
    assert empty == {"object": "list", "data": [], "first_id": None, "last_id": None, "has_more": False}


def test_the_list_filters_by_model_and_every_metadata_pair(api):
    a = make(api, metadata={"team": "a", "env": "prod"}, minutes_ago=3)
    b = make(api, metadata={"team": "a", "env": "dev"}, minutes_ago=2)
    c = make(api, metadata={"team": "b"}, minutes_ago=1)
    assert ids(api.get(LIST, **{"metadata[team]": "a"}).json()) == [a, b]
    assert ids(api.get(LIST, **{"metadata[team]": "a", "metadata[env]": "dev"}).json()) == [b]
    assert ids(api.get(LIST, **{"metadata[team]": "c"}).json()) == []
    assert ids(api.get(LIST, model="smollm2-135m-instruct").json()) == [a, b, c]
    assert ids(api.get(LIST, model="other").json()) == []
    odd = make(api, metadata={'we"ird.key__x [0]': "v", "é": "ü"})
    assert ids(api.get(LIST, **{'metadata[we"ird.key__x [0]]': "v"}).json()) == [odd]
    assert ids(api.get(LIST, **{"metadata[é]": "ü"}).json()) == [odd]


@pytest.mark.parametrize("query, param", [
    ({"limit": "0"}, "limit"), ({"limit": "101"}, "limit"), ({"limit": "many"}, "limit"),
    ({"order": "up"}, "order"), ({"after": "chatcmpl-nope"}, "after"),
    ({f"metadata[k{i}]": "v" for i in range(17)}, "metadata"),
    ({"metadata[" + "k" * 65 + "]": "v"}, "metadata"), ({"metadata[k]": "v" * 513}, "metadata"),
])
def test_a_bad_list_query_is_400_naming_the_field(api, query, param):
    r = api.get(LIST, **query)
    assert r.status_code == 400, r.content
    assert set(r.json()["error"]) == ERROR_KEYS and r.json()["error"]["param"] == param


def test_update_replaces_the_metadata_and_get_shows_it(api):
    cid = make(api, metadata={"team": "a"})
    r = api.post(f"{LIST}/{cid}", {"metadata": {"team": "b", "run": "7"}})
    assert r.status_code == 200 and r.json()["id"] == cid
    assert r.json()["metadata"] == {"team": "b", "run": "7"}
    got = api.get(f"{LIST}/{cid}").json()
    assert got == r.json() and got["choices"][0]["message"]["content"] == "Hello world"
    assert ids(api.get(LIST, **{"metadata[team]": "b"}).json()) == [cid]
    assert api.post(f"{LIST}/{cid}", {"metadata": None}).json()["metadata"] == {}


@pytest.mark.parametrize("body, param", [
    ({}, "metadata"), ({"metadata": "x"}, "metadata"), ({"metadata": {"k": 5}}, "metadata"),
    ({"metadata": {str(i): "v" for i in range(17)}}, "metadata"),
    ({"metadata": {"k" * 65: "v"}}, "metadata"), ({"metadata": {"k": "v" * 513}}, "metadata"),
    (b"{not json", None),
])
def test_update_enforces_openais_metadata_limits(api, body, param):
    cid = make(api, metadata={"keep": "me"})
    r = api.post(f"{LIST}/{cid}", body)
    assert r.status_code == 400, r.content
    assert set(r.json()["error"]) == ERROR_KEYS and r.json()["error"]["param"] == param
    assert StoredChatCompletion.objects.get(pk=cid).metadata == {"keep": "me"}


def test_the_messages_are_the_requests_each_with_an_id_in_pages(api):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye"}]
    cid = api.post(LIST, {"messages": messages, "store": True}).json()["id"]
    page = api.get(f"{LIST}/{cid}/messages").json()
    assert page["object"] == "list" and page["has_more"] is False
    assert page["data"] == [{"id": f"{cid}-{i}", "role": m["role"], "content": m["content"], "name": None,
                             "content_parts": None} for i, m in enumerate(messages)]
    assert page["first_id"] == f"{cid}-0" and page["last_id"] == f"{cid}-3"
    first = api.get(f"{LIST}/{cid}/messages", limit=2).json()
    assert ids(first) == [f"{cid}-0", f"{cid}-1"] and first["has_more"] is True
    rest = api.get(f"{LIST}/{cid}/messages", after=first["last_id"]).json()
    assert ids(rest) == [f"{cid}-2", f"{cid}-3"] and rest["has_more"] is False
    assert ids(api.get(f"{LIST}/{cid}/messages", order="desc", limit=1).json()) == [f"{cid}-3"]
    for query, param in (({"after": "msg-nope"}, "after"), ({"limit": "0"}, "limit"), ({"order": "x"}, "order")):
        r = api.get(f"{LIST}/{cid}/messages", **query)
        assert r.status_code == 400 and r.json()["error"]["param"] == param


def test_a_tool_call_turn_keeps_its_calls_with_json_string_arguments(api):
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    messages = [{"role": "user", "content": "go"}, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "42"}]
    cid = api.post(LIST, {"messages": messages, "store": True}).json()["id"]
    _, assistant, tool = api.get(f"{LIST}/{cid}/messages").json()["data"]
    assert assistant["tool_calls"] == [call] and assistant["role"] == "assistant"
    assert tool["tool_call_id"] == "call_1" and tool["content"] == "42"


def test_delete_removes_it_from_every_route(api):
    cid = make(api)
    r = api.delete(f"{LIST}/{cid}")
    assert r.json() == {"id": cid, "object": "chat.completion.deleted", "deleted": True}
    for method, path_, body in (("GET", f"{LIST}/{cid}", None), ("POST", f"{LIST}/{cid}", {"metadata": {}}),
                                ("GET", f"{LIST}/{cid}/messages", None), ("DELETE", f"{LIST}/{cid}", None)):
        answer = api.send(method, path_, body)
        assert answer.status_code == 404 and set(answer.json()["error"]) == ERROR_KEYS
    assert ids(api.get(LIST).json()) == []


def test_other_methods_are_405_with_allow(api):
    cid = make(api)
    r = api.send("PUT", f"{LIST}/{cid}")
    assert r.status_code == 405 and r.headers["Allow"] == "GET, POST, DELETE"
    assert r.json()["error"]["code"] == "method_not_allowed"
    assert api.send("DELETE", f"{LIST}/{cid}/messages").headers["Allow"] == "GET"


def test_head_is_answered_where_get_is(api):
    cid = make(api)
    for path_ in (f"{LIST}/{cid}", f"{LIST}/{cid}/messages", LIST, "/v1/models"):
        got, head = api.send("GET", path_), api.send("HEAD", path_)
        assert head.status_code == got.status_code == 200, (path_, head.status_code)
        assert head.headers["Content-Type"] == got.headers["Content-Type"] == "application/json"
    assert api.send("HEAD", "/v1/chat/completions/none-such").status_code == 404


def test_a_completion_expires_after_the_store_ttl(api, settings):
    settings.METRALE = {**settings.METRALE, "STORE_TTL_S": 90}
    cid = api.post(LIST, {"messages": [{"role": "user", "content": "hi"}], "store": True}).json()["id"]
    row = StoredChatCompletion.objects.get(pk=cid)
    assert (row.expires_at - row.created_at).total_seconds() == pytest.approx(90)
    assert row.tenant == api.tenant


async def _bare(request, completion_id):  # a view that skipped openai_endpoint
    raise AssertionError("never called")


# The URLconf of the W002 test below: one dispatcher over wrapped views, one with a bare view.
urlpatterns = [
    path("v1/wrapped/<str:completion_id>", by_method(GET=retrieve)),
    path("v1/bare/<str:completion_id>", by_method(GET=retrieve, DELETE=_bare)),
]


def test_by_method_is_an_openai_endpoint_only_when_every_method_view_is(settings):
    assert by_method(GET=retrieve).openai_endpoint is True
    assert by_method(GET=retrieve, POST=_bare).openai_endpoint is False
    settings.ROOT_URLCONF = __name__
    warnings = check_guarded_routes(None)
    assert [w.id for w in warnings] == ["metrale.W002"] and "v1/bare/" in warnings[0].msg


def test_the_admin_lists_filters_and_searches_by_tenant_model_id_and_metadata(admin_client, fake_rt, as_tenant):
    first, second = as_tenant("first-co"), as_tenant("second-co")
    a = make(first, metadata={"project": "apollo"})
    b = make(second)
    url = "/admin/inference/storedchatcompletion/"
    r = admin_client.get(url)
    assert r.status_code == 200 and a.encode() in r.content and b.encode() in r.content
    for query, shown, hidden in (({"tenant__id__exact": second.tenant.pk}, b, a), ({"q": "second-co"}, b, a),
                                 ({"q": "apollo"}, a, b), ({"q": a}, a, b),
                                 ({"model__exact": "smollm2-135m-instruct"}, a, None)):
        r = admin_client.get(url, query)
        assert shown.encode() in r.content, query
        if hidden:
            assert hidden.encode() not in r.content, query
    r = admin_client.get(f"{url}{quote(a)}/change/")
    assert r.status_code == 200 and b"apollo" in r.content and b"Hello world" in r.content
    r = admin_client.post(f"{url}{quote(a)}/delete/", {"post": "yes"})
    assert r.status_code == 302 and not StoredChatCompletion.objects.filter(pk=a).exists()
