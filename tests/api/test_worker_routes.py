"""What routers read from a worker (http/worker_views.py): server info, KV event sources, load, and the render routes
(the prompt's ids as the generating route runs them, after the caller's namespace block; never debited)."""
import pytest

from inference.operations.heartbeat import process_id
from inference.operations.kv_events import KVEventPublisher, KVEventsConfig
from inference.operations.kv_wire import namespace_block
from inference.operations.registry import process_registry

pytestmark = pytest.mark.django_db

CHAT = {"model": "smollm2-135m-instruct", "max_tokens": 2,
        "messages": [{"role": "system", "content": "You are terse. " * 10}, {"role": "user", "content": "Hi"}]}


def test_server_info_names_the_default_chat_model_its_block_size_and_this_process(client, fake_rt):
    info = client.get("/get_server_info").json()
    assert info == {"model_id": "smollm2-135m-instruct", "model_path": str(fake_rt.model_path),
                    "instance_id": process_id(), "kv_block_size": 16, "effective_attention_block_size": 16}
    refused = client.post("/get_server_info")
    assert refused.status_code == 405 and refused["Allow"] == "GET" and "error" in refused.json()


def test_kv_event_sources_are_empty_without_events_and_name_the_host_the_router_reached(client, fake_rt, settings):
    settings.ALLOWED_HOSTS = ["testserver", "10.1.2.3"]
    assert client.get("/kv_event_sources").json() == {}
    publisher = KVEventPublisher(KVEventsConfig(endpoint="tcp://*:0", replay_endpoint="tcp://*:0", topic="kv"))
    process_registry().loader.kv_events = publisher
    try:
        sources = client.get("/kv_event_sources", headers={"Host": "10.1.2.3:8001"}).json()
    finally:
        publisher.close()
    port = publisher.endpoint.rpartition(":")[2]
    assert sources["0"]["endpoint"] == f"tcp://10.1.2.3:{port}"
    assert sources["0"]["replay_endpoint"] == f"tcp://10.1.2.3:{publisher.replay_endpoint.rpartition(':')[2]}"
    assert {k: sources["0"][k] for k in ("topic", "publisher", "encoding", "schema_version")} == {
        "topic": "kv", "publisher": "zmq", "encoding": "msgpack", "schema_version": 1}


def test_load_counts_the_chat_models_requests(client, fake_rt):
    assert client.get("/get_load").json() == {"load": 0}


def test_chat_render_is_the_routes_prompt_after_the_callers_namespace_block(as_tenant, fake_rt):
    acme, other = as_tenant("acme"), as_tenant("other")
    rendered = acme.post("/v1/chat/completions/render", CHAT)
    assert rendered.status_code == 200, rendered.content
    body = rendered.json()
    assert body["model"] == "smollm2-135m-instruct" and body["features"] is None
    assert acme.post("/v1/chat/completions", CHAT).status_code == 200
    ran = fake_rt.engine.submissions[-1].prompt_token_ids
    root = list(namespace_block(acme.tenant.prefix_cache_salt, 16, fake_rt.tokenizer.vocab_size)[1])
    assert body["token_ids"] == root + ran
    theirs = other.post("/v1/chat/completions/render", CHAT).json()["token_ids"]
    assert theirs[16:] == ran and theirs[:16] != root


def test_completions_render_answers_one_entry_per_prompt(as_tenant, fake_rt):
    acme = as_tenant()
    rendered = acme.post("/v1/completions/render", {"model": "smollm2-135m-instruct", "prompt": [[1, 2], [5, 6, 7]]})
    assert rendered.status_code == 200, rendered.content
    entries = rendered.json()
    assert [e["token_ids"][16:] for e in entries] == [[1, 2], [5, 6, 7]]
    text = acme.post("/v1/completions/render", {"model": "smollm2-135m-instruct", "prompt": "Once upon"}).json()
    assert acme.post("/v1/completions", {"model": "smollm2-135m-instruct", "prompt": "Once upon"}).status_code == 200
    assert text[0]["token_ids"][16:] == fake_rt.engine.submissions[-1].prompt_token_ids


def test_renders_are_authenticated_never_debited_and_refuse_bad_bodies_in_openais_shape(
        client, as_tenant, make_tenant, make_key, fake_rt):
    tenant = make_tenant("tight", requests_per_minute=1)
    _, key = make_key(tenant)
    auth = {"Authorization": f"Bearer {key}"}
    for _ in range(3):
        assert client.post("/v1/chat/completions/render", CHAT, content_type="application/json",
                           headers=auth).status_code == 200
    assert client.post("/v1/chat/completions", CHAT, content_type="application/json", headers=auth).status_code == 200
    assert client.post("/v1/chat/completions", CHAT, content_type="application/json", headers=auth).status_code == 429
    assert client.post("/v1/chat/completions/render", CHAT, content_type="application/json").status_code == 401
    bad = client.post("/v1/chat/completions/render", {"messages": "hi"}, content_type="application/json",
                      headers=auth)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages"
    unknown = client.post("/v1/completions/render", {"model": "nope", "prompt": "x"}, content_type="application/json",
                          headers=auth)
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
