"""What routers read from a worker (http/worker_views.py): server and model info, KV event sources, load,
health_generate, flush_cache, and the render routes (the prompt's ids as the generating route runs them, after the
caller's namespace block; never debited)."""
import pytest

from inference.engine.kv_events import AllBlocksCleared, KVEventRecorder
from inference.engine.model_folder import ModelFolder
from inference.http import worker_views
from inference.operations.heartbeat import process_id
from inference.operations.kv_events import KVEventPublisher, KVEventsConfig
from inference.operations.kv_wire import namespace_block
from inference.operations.registry import ModelRegistry, process_registry, serving

from .fake_engine import reply
from .registries import FakeLoader

pytestmark = pytest.mark.django_db

CHAT = {"model": "smollm2-135m-instruct", "max_tokens": 2,
        "messages": [{"role": "system", "content": "You are terse. " * 10}, {"role": "user", "content": "Hi"}]}


def test_server_info_names_the_default_chat_model_its_block_size_and_this_process(client, fake_rt):
    info = client.get("/get_server_info").json()
    assert info == {"model_id": "smollm2-135m-instruct", "model_path": str(fake_rt.model_path),
                    "instance_id": process_id(), "kv_block_size": 16, "effective_attention_block_size": 16}
    refused = client.post("/get_server_info")
    assert refused.status_code == 405 and refused["Allow"] == "GET" and "error" in refused.json()


def test_server_info_adds_the_sglang_keys_that_hold_for_this_server(client, fake_rt, settings):
    settings.METRALE = {**settings.METRALE, "MAX_NUM_SEQS": 12}
    info = client.get("/server_info").json()
    assert info == client.get("/get_server_info").json() | {
        "served_model_name": "smollm2-135m-instruct", "tokenizer_path": str(fake_rt.model_path), "dp_size": 1,
        "tp_size": 1, "max_running_requests": 12}
    assert client.post("/server_info").status_code == 405


def test_model_info_is_sglangs_body_under_both_names(client, fake_rt):
    folder = str(fake_rt.model_path)
    config = ModelFolder.read(folder).config
    expected = {"model_path": folder, "tokenizer_path": folder, "is_generation": True,
                "preferred_sampling_params": None, "weight_version": None, "has_image_understanding": False,
                "has_audio_understanding": False, "model_type": "llama", "architectures": config["architectures"]}
    assert client.get("/get_model_info").json() == expected and client.get("/model_info").json() == expected
    assert expected["architectures"] == ["LlamaForCausalLM"]
    refused = client.delete("/model_info")
    assert refused.status_code == 405 and refused["Allow"] == "GET"


def test_without_a_chat_model_the_probes_say_so_in_vllms_error_shape(client):
    with serving(ModelRegistry([], FakeLoader())):
        for path in ("/get_server_info", "/server_info", "/get_model_info", "/model_info"):
            missing = client.get(path)
            assert missing.status_code == 404 and missing.json() == {"error": "no chat model is configured"}, path
        assert client.post("/flush_cache").json() == {"error": "no chat model is configured"}
        assert client.get("/health_generate").status_code == 503


def test_health_generate_needs_the_default_model_loaded(client):
    """The in-process registry configures the chat model but loads nothing (conftest.no_model_loading)."""
    answer = client.get("/health_generate")
    assert answer.status_code == 503 and "not loaded" in answer.json()["error"]


def test_health_generate_answers_once_one_greedy_token_came(client, fake_rt):
    ok = client.get("/health_generate")
    assert ok.status_code == 200 and ok.json() == {}
    (ran,) = fake_rt.engine.submissions
    assert len(ran.prompt_token_ids) == 1 and ran.params.max_tokens == 1 and ran.params.temperature == 0
    assert ran.timeout_s == worker_views.HEALTH_GENERATE_TIMEOUT_S
    assert client.post("/health_generate").status_code == 405


def test_health_generate_is_503_when_the_generation_fails_or_takes_too_long(client, fake_rt, monkeypatch):
    fake_rt.engine.script = reply(fake_rt.tokenizer, "", fail="the step raised")
    failed = client.get("/health_generate")
    assert failed.status_code == 503 and "the step raised" in failed.json()["error"]
    monkeypatch.setattr(worker_views, "HEALTH_GENERATE_TIMEOUT_S", 0.2)
    fake_rt.engine.script = reply(fake_rt.tokenizer, "Hello")
    fake_rt.engine.delay_s = 2.0
    slow = client.get("/health_generate")
    assert slow.status_code == 503 and "no token within 0.2 s" in slow.json()["error"]
    assert fake_rt.engine.submissions[-1].handle.aborted is not None


LONG_SYSTEM = "You answer in one short sentence, and you never repeat the question back. " * 6


def chat_usage(client, headers=None) -> dict:
    body = {"model": "smollm2-135m-instruct", "max_tokens": 1,
            "messages": [{"role": "system", "content": LONG_SYSTEM}, {"role": "user", "content": "Hi"}]}
    answer = client.post("/v1/chat/completions", body, content_type="application/json", headers=headers or {})
    assert answer.status_code == 200, answer.content
    return answer.json()["usage"]


@pytest.fixture
def kv_collector(real_rt):
    """The real engine's prefix-cache events, collected in a list for the test (engine/kv_events.py's recorder
    attached on the engine's thread; detached after)."""
    seen: list = []

    def attach(engine):
        engine.kv_recorder = KVEventRecorder()
        engine.block_manager.kv_events = engine.kv_recorder
        engine.kv_events = seen.extend

    def detach(engine):
        engine.kv_recorder = engine.block_manager.kv_events = engine.kv_events = None

    real_rt.engine.call(attach).result(timeout=30)
    yield seen
    real_rt.engine.call(detach).result(timeout=30)


def test_flush_cache_forgets_the_cached_prefix_and_tells_the_kv_events(client, real_rt, kv_collector):
    chat_usage(client)
    assert chat_usage(client)["prompt_tokens_details"]["cached_tokens"] > 0
    kv_collector.clear()
    flushed = client.post("/flush_cache")
    assert flushed.status_code == 200 and flushed.json() == {}
    assert kv_collector == [AllBlocksCleared()]  # nothing was running: the cache is empty
    assert chat_usage(client)["prompt_tokens_details"]["cached_tokens"] == 0
    assert chat_usage(client)["prompt_tokens_details"]["cached_tokens"] > 0  # cached again from then on


def test_health_generate_runs_a_token_on_the_real_engine(client, real_rt):
    assert client.get("/health_generate").status_code == 200


def test_flush_cache_takes_an_operator_when_auth_is_on(client, real_rt, require_auth, make_tenant, make_key):
    tenant = make_tenant("ops")
    _, admin_key = make_key(tenant, is_admin=True)
    _, plain_key = make_key(tenant)
    assert client.post("/flush_cache").json()["error"]["code"] == "missing_api_key"
    refused = client.post("/flush_cache", headers={"Authorization": f"Bearer {plain_key}"})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "admin_key_required"
    flushed = client.post("/flush_cache", headers={"Authorization": f"Bearer {admin_key}"})
    assert flushed.status_code == 200 and flushed.json() == {}
    wrong = client.get("/flush_cache", headers={"Authorization": f"Bearer {admin_key}"})
    assert wrong.status_code == 405 and wrong["Allow"] == "POST"
    assert client.get("/get_model_info").status_code == 200  # the GET probes stay open


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
