"""Tenancy of every stored object, for the whole project: another tenant's key gets 404 on the owner's
objects, whatever the route and the method, and changes nothing.

The routes are discovered from the URL resolver (as test_auth.py discovers every /v1 route): every
guarded route with a parameter, and every one whose GET answers a list. Each is exercised with two
tenants' real keys: read, list (the owner's objects do not appear), update, delete, cancel, and use
as `previous_response_id` / `conversation` in POST /v1/responses. A route found here that this test
cannot exercise (a parameter it has no object for, no method served, an owner that cannot reach its
own object) fails it, so a new stored route cannot slip past the rule in inference.stored.objects.
"""
import re

import pytest
from django.apps import apps

from anthropic_api import views as anthropic_views
from ollama_api import views as ollama_views
from inference.http import views as inference_views
from inference.operations.checks import guarded_routes
from inference.models import StoredChatCompletion, Tenant
from inference.stored.objects import StoredObject, tenant_of
from batches.models import Batch, StoredFile
from responses_api.models import Conversation, ConversationItem, StoredResponse

from .batch_support import chat_line, jsonl, upload
from .responses.support import sse_events

PARAMETER = re.compile(r"<(?:\w+:)?(\w+)>")
METHODS = ("GET", "POST", "DELETE", "PUT", "PATCH")
# Routes that hold no stored object of a client's, each with the reason.
EXEMPT = {
    "v1/models": "the served model, the same for every tenant",
    "v1/models/<path:model_id>": "the served model, the same for every tenant",
    **{f"api/{name}": "Ollama's routes store nothing of a client's (its models are the server's, for every tenant)"
       for name in ("chat", "generate", "embed", "embeddings", "tags", "show", "ps", "version", "pull", "delete",
                    "copy")},
}
# Views that answer every tenant the same error for any path they match.
EXEMPT_VIEWS = (inference_views.not_implemented, inference_views.unknown_route, anthropic_views.unknown_route,
                ollama_views.not_implemented, ollama_views.unknown_route)
# A valid body for the routes whose POST needs one (a 404 must come for a request that is otherwise good).
BODIES = {
    "v1/conversations/<str:conversation_id>": {"metadata": {"m": "changed"}},
    "v1/conversations/<str:conversation_id>/items": {"items": [{"role": "user", "content": "x"}]},
    "v1/chat/completions/<str:completion_id>": {"metadata": {"team": "changed"}},
}
# Query variants a route's GET is tried with (default: none).
QUERIES = {
    "v1/responses/<str:response_id>": [{}, {"stream": "true"}, {"stream": "true", "starting_after": "2"}],
    "v1/chat/completions": [{}, {"metadata[team]": "owner"}, {"model": "smollm2-135m-instruct"}],
}
# What the owner's own request answers when it is not 200 (the lookup found the object first).
OWNER_STATUS = {("v1/responses/<str:response_id>/cancel", "POST"): (400, "response_not_cancellable")}
# Uses of a stored object inside another request: (route, body), ids filled in from the owner's objects.
USES = [
    ("v1/responses", {"input": "Go on", "previous_response_id": "{response_id}"}),
    ("v1/responses", {"input": "Go on", "conversation": "{conversation_id}"}),
    ("v1/responses", {"input": "Go on", "conversation": {"id": "{conversation_id}"}}),
    ("v1/batches", {"input_file_id": "{file_id}", "endpoint": "/v1/chat/completions", "completion_window": "24h"}),
]
VOLATILE = {"updated_at", "last_used"}  # written by reads and by authentication
# The error code of a 404 on each app's objects (by route prefix).
NOT_FOUND_CODES = {"v1/responses": "response_not_found", "v1/conversations": "conversation_not_found",
                   "v1/chat/completions": None, "v1/files": "file_not_found", "v1/batches": "batch_not_found"}


@pytest.fixture
def owner(fake_rt, as_tenant):
    return as_tenant("owner")


@pytest.fixture
def intruder(fake_rt, as_tenant):
    return as_tenant("intruder")


def make_objects(owner) -> dict[str, str]:
    """The owner's stored objects, by the URL parameter that names each: a streamed response, a
    conversation with one item, a stored chat completion, an uploaded file and a batch of it."""
    events = sse_events(owner.post("/v1/responses", {"input": "Hi", "stream": True}))
    rid = events[-1]["response"]["id"]
    conv = owner.post("/v1/conversations", {"items": [{"role": "user", "content": "secret"}],
                                            "metadata": {"m": "1"}}).json()
    item_id = owner.get(f"/v1/conversations/{conv['id']}/items").json()["data"][0]["id"]
    completion = owner.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "secret"}],
                                                     "store": True, "metadata": {"team": "owner"}}).json()
    file_id = upload(owner, jsonl(chat_line("secret"))).json()["id"]
    batch = owner.post("/v1/batches", {"input_file_id": file_id, "endpoint": "/v1/chat/completions",
                                       "completion_window": "24h"}).json()
    return {"response_id": rid, "conversation_id": conv["id"], "item_id": item_id,
            "completion_id": completion["id"], "file_id": file_id, "batch_id": batch["id"]}


def snapshot() -> dict:
    """Every row of every model of the project's apps (what an intruder must leave as it was)."""
    state = {}
    for model in [*apps.get_app_config("inference").get_models(),
                  *apps.get_app_config("responses_api").get_models(),
                  *apps.get_app_config("batches").get_models()]:
        fields = [f.attname for f in model._meta.concrete_fields if f.name not in VOLATILE]
        state[model.__name__] = list(model.objects.order_by("pk").values_list(*fields))
    return state


def discovered_routes() -> list[str]:
    """Every guarded route with a parameter, and every parameterless one (a list route when its GET
    answers a list: the caller checks), but the exempt ones."""
    return [route for route, view in guarded_routes()
            if route not in EXEMPT and view not in EXEMPT_VIEWS]


def concrete(route: str, ids: dict[str, str]) -> str:
    """The route's path with each parameter replaced by the owner's object. KeyError for a
    parameter that names no object this test makes."""
    return "/" + PARAMETER.sub(lambda m: ids[m[1]], route)


def fill(value, ids: dict[str, str]):
    if isinstance(value, str):
        return value.format(**ids)
    if isinstance(value, dict):
        return {k: fill(v, ids) for k, v in value.items()}
    return value


def owned_ids(ids: dict[str, str]) -> set[str]:
    return set(ids.values())


def check_id_route(route, owner, intruder, failures) -> int:
    """Every method the route serves: the intruder gets 404 and changes nothing, then the owner is
    served. Returns how many methods it exercised."""
    exercised = 0
    probe_ids = make_objects(owner)
    for method in METHODS:
        probe = intruder.send(method, concrete(route, probe_ids), BODIES.get(route, {}))
        if probe.status_code == 405:
            continue  # not served (405 comes after auth and before any lookup)
        for query in QUERIES.get(route, [{}]) if method == "GET" else [{}]:
            ids = make_objects(owner)
            path = concrete(route, ids)
            before = snapshot()
            answer = intruder.send(method, path, BODIES.get(route, {}), query)
            where = f"{method} {route} {query}"
            if answer.status_code != 404:
                failures.append(f"{where}: another tenant got {answer.status_code}, not 404: "
                                f"{answer.content[:200]!r}")
                continue
            error = answer.json()["error"]
            not_found = next((c for prefix, c in NOT_FOUND_CODES.items() if route.startswith(prefix)),
                             "(add the route's prefix to NOT_FOUND_CODES)")
            if set(error) != {"message", "type", "param", "code"} or error["type"] != "invalid_request_error" \
                    or error["code"] != not_found:
                failures.append(f"{where}: the 404 is not OpenAI's not-found error {not_found}: {error}")
            if snapshot() != before:
                failures.append(f"{where}: another tenant's request changed what is stored")
            status, code = OWNER_STATUS.get((route, method), (200, None))
            mine = owner.send(method, path, BODIES.get(route, {}), query)
            if mine.status_code != status or (code and mine.json()["error"]["code"] != code):
                failures.append(f"{where}: the owner got {mine.status_code}, not {status}: "
                                f"{mine.content[:200]!r}")
            exercised += 1
    return exercised


def check_list_route(route, owner, intruder, failures) -> bool:
    """A parameterless route whose GET answers a list: the owner's objects appear for the owner and
    never for the intruder. False when the route's GET is no list (not a list route)."""
    ids = make_objects(owner)
    listed = False
    for query in QUERIES.get(route, [{}]):
        mine = owner.get("/" + route, **query)
        if mine.status_code != 200 or mine.json().get("object") != "list":
            return False
        listed = True
        theirs = intruder.get("/" + route, **query)
        where = f"GET {route} {query}"
        if theirs.status_code != 200 or theirs.json().get("object") != "list":
            failures.append(f"{where}: another tenant got {theirs.status_code} {theirs.content[:200]!r}")
            continue
        if not owned_ids(ids) & {row["id"] for row in mine.json()["data"]}:
            failures.append(f"{where}: the owner's own objects are not listed, so the list proves nothing")
        leaked = owned_ids(ids) & {row["id"] for row in theirs.json()["data"]}
        if leaked:
            failures.append(f"{where}: another tenant sees {sorted(leaked)}")
    return listed


def test_another_tenants_key_gets_404_on_every_stored_object_route(owner, intruder):
    failures: list[str] = []
    id_routes, list_routes = [], []
    for route in discovered_routes():
        if not PARAMETER.search(route):
            if check_list_route(route, owner, intruder, failures):
                list_routes.append(route)
            continue
        try:
            exercised = check_id_route(route, owner, intruder, failures)
        except KeyError as missing:
            failures.append(f"{route}: no stored object for the parameter {missing}; teach this test to "
                            "make one (make_objects)")
            continue
        if not exercised:
            failures.append(f"{route}: discovered, but no method of it could be exercised")
        id_routes.append(route)
    assert not failures, "\n".join(failures)
    # The discovery finds every app's stored routes (a broken resolver walk must not pass quietly).
    assert {"v1/responses/<str:response_id>", "v1/responses/<str:response_id>/input_items",
            "v1/conversations/<str:conversation_id>/items/<str:item_id>",
            "v1/chat/completions/<str:completion_id>",
            "v1/chat/completions/<str:completion_id>/messages", "v1/files/<str:file_id>",
            "v1/files/<str:file_id>/content", "v1/batches/<str:batch_id>",
            "v1/batches/<str:batch_id>/cancel"} <= set(id_routes)
    assert sorted(list_routes) == ["v1/batches", "v1/chat/completions", "v1/files"]


def test_another_tenants_objects_cannot_be_used_in_a_new_response(owner, intruder):
    for route, body in USES:
        ids = make_objects(owner)
        before = snapshot()
        answer = intruder.post("/" + route, fill(body, ids))
        assert answer.status_code == 404, (body, answer.content)
        assert answer.json()["error"]["code"] in ("response_not_found", "conversation_not_found", "file_not_found")
        assert answer.json()["error"]["param"] in ("previous_response_id", "conversation", "input_file_id")
        assert snapshot() == before
        assert owner.post("/" + route, fill(body, ids)).status_code == 200


def test_the_owner_reaches_what_it_stored_and_it_is_the_owners(owner):
    ids = make_objects(owner)
    assert StoredResponse.objects.get(pk=ids["response_id"]).tenant == owner.tenant
    assert Conversation.objects.get(pk=ids["conversation_id"]).tenant == owner.tenant
    assert StoredChatCompletion.objects.get(pk=ids["completion_id"]).tenant == owner.tenant
    assert StoredFile.objects.get(pk=ids["file_id"]).tenant == owner.tenant
    assert Batch.objects.get(pk=ids["batch_id"]).tenant == owner.tenant
    assert owner.get(f"/v1/files/{ids['file_id']}").status_code == 200
    assert owner.get(f"/v1/batches/{ids['batch_id']}").status_code == 200
    assert owner.get(f"/v1/responses/{ids['response_id']}").status_code == 200
    assert owner.get(f"/v1/conversations/{ids['conversation_id']}").status_code == 200
    assert owner.get(f"/v1/chat/completions/{ids['completion_id']}").status_code == 200


def test_every_stored_model_is_owned_by_a_tenant():
    stored = {m.__name__ for m in apps.get_models() if issubclass(m, StoredObject)}
    assert stored == {"StoredResponse", "Conversation", "StoredChatCompletion", "StoredFile", "Batch"}
    for model in apps.get_models():
        if not issubclass(model, StoredObject):
            continue
        field = model._meta.get_field("tenant")
        assert field.remote_field.model is Tenant and not field.null


def test_every_stored_model_has_an_admin_that_filters_and_searches_by_tenant():
    from django.contrib import admin as django_admin

    from inference.admin import StoredObjectAdmin

    for model in apps.get_models():
        if issubclass(model, StoredObject):
            model_admin = django_admin.site._registry[model]
            assert isinstance(model_admin, StoredObjectAdmin), model
            assert "tenant" in model_admin.list_filter and "tenant__name" in model_admin.search_fields, model


def test_deleting_a_tenant_deletes_what_it_owns(owner, intruder):
    mine, theirs = make_objects(owner), make_objects(intruder)
    owner.tenant.delete()
    for model, param in ((StoredResponse, "response_id"), (Conversation, "conversation_id"),
                         (StoredChatCompletion, "completion_id"), (StoredFile, "file_id"), (Batch, "batch_id")):
        assert not model.objects.filter(pk=mine[param]).exists()
        assert model.objects.filter(pk=theirs[param], tenant=intruder.tenant).exists()
    assert not ConversationItem.objects.filter(item_id=mine["item_id"]).exists()


def test_with_auth_off_what_is_stored_belongs_to_the_default_tenant(fake_rt, client):
    conv = client.post("/v1/conversations", {}, content_type="application/json").json()
    assert Conversation.objects.get(pk=conv["id"]).tenant.name == Tenant.DEFAULT_NAME


def test_tenant_of_reads_the_principal_openai_endpoint_sets():
    class Request:
        pass

    class Principal:
        tenant = Tenant(pk=42, name="acme")

    request = Request()
    request.principal = Principal()
    assert tenant_of(request) is Principal.tenant
    with pytest.raises(AttributeError):
        tenant_of(Request())  # a request that skipped openai_endpoint has no owner
