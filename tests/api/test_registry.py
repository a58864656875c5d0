"""The process's models as one registry (inference/operations/registry.py) with scripted engines: a request loads the
model it names (concurrent first requests load it once, and wait), keep_alive (the body field and the model's own)
unloads idle models, the memory budget evicts least-recently-used idle models and never a busy or pinned one, a
model that cannot load fails its requests with 503 naming it and its cause (marked failed, retried later) while
the others serve, an unknown model is a 404 naming it in each route's shape, /v1/models, /health and
/metrics show each model's state, and names added while the process runs (aliases, pulled models) come and go."""
from __future__ import annotations

import asyncio
import json
import math
import threading
import time

import pytest

from inference.operations.model_specs import CHAT, ModelSpec
from inference.operations.registry import (FAILED, LOADED, UNLOADED, ModelBudgetBusy, ModelLoadFailed,
                                           serving)
from inference.operations.runtime import Runtime

from .fake_engine import FakeEngine, call, reply
from .registries import FakeLoader

pytestmark = pytest.mark.django_db

A, B, C = "model-a", "model-b", "model-c"


class Clock:
    """The registry's monotonic clock, moved by hand."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture
def models(smollm2_tokenizer, smollm2_dir, raw_asgi_requests):
    """make(*names, **registry kwargs) -> (registry, loader, clock): chat models `names`, each a fresh
    FakeEngine answering with its own name on every load, served as the process's registry."""
    from inference.operations.registry import ModelRegistry

    stack = []

    def make(*names, sizes=None, estimates=None, fail=None, gate=None, **kw):
        def factory(name):
            def new():
                return Runtime(FakeEngine(smollm2_tokenizer, reply(smollm2_tokenizer, f"I am {name}")),
                               smollm2_tokenizer, name, smollm2_dir, int(time.time()))
            return new

        loader = FakeLoader({n: factory(n) for n in names}, sizes=sizes, estimates=estimates, fail=fail, gate=gate)
        clock = Clock()
        registry = ModelRegistry([ModelSpec(n, smollm2_dir, CHAT) for n in names], loader, clock=clock, **kw)
        ctx = serving(registry)
        ctx.__enter__()
        stack.append(ctx)
        return registry, loader, clock

    yield make
    for ctx in reversed(stack):
        ctx.__exit__(None, None, None)


def chat(model, **extra):
    return call("POST", "/v1/chat/completions", {"model": model, "max_tokens": 8,
                                                  "messages": [{"role": "user", "content": "hi"}], **extra})


def content(answer) -> str:
    assert answer.status == 200, answer.body
    return answer.json()["choices"][0]["message"]["content"]


def test_a_request_loads_the_model_it_names_and_each_model_answers_as_itself(models):
    registry, loader, _ = models(A, B, pinned=[])
    assert [s["state"] for s in registry.states()] == [UNLOADED, UNLOADED]
    assert content(chat(B)) == f"I am {B}"
    assert loader.loads == [B] and registry.entries[B].state == LOADED and registry.entries[A].state == UNLOADED
    assert content(chat("")) == f"I am {A}"  # no model named: the first chat model
    assert content(chat(B)) == f"I am {B}" and loader.loads == [B, A]  # loaded once


def test_concurrent_first_requests_load_the_model_once_and_all_wait_for_it(models):
    from .asgi_client import AsgiRequest, serve

    gate = threading.Event()
    registry, loader, _ = models(A, pinned=[], gate=gate)

    async def many():
        async def one():
            req = await AsgiRequest("POST", "/v1/chat/completions", {"content-type": "application/json"},
                                    b'{"model": "model-a", "max_tokens": 4, "messages": [{"role": "user", '
                                    b'"content": "hi"}]}').start(timeout_s=60)  # the load is held until all wait
            return req.status, await req.read_all()

        tasks = [asyncio.ensure_future(one()) for _ in range(6)]
        deadline = time.monotonic() + 30
        while registry.entries[A].holds < 6 and time.monotonic() < deadline:  # every request is waiting for it
            await asyncio.sleep(0.02)
        assert registry.entries[A].state == "loading" and not any(t.done() for t in tasks)
        listed = await AsgiRequest("GET", "/v1/models", {}, b"").start(timeout_s=60)
        assert [m["state"] for m in json.loads(await listed.read_all())["data"]] == ["loading"]
        gate.set()
        return await asyncio.gather(*tasks)

    answers = serve(many)
    assert [status for status, _ in answers] == [200] * 6
    assert loader.loads == [A]
    assert registry.entries[A].holds == 0 and registry.entries[A].requests == 6


def test_keep_alive_unloads_an_idle_model_and_never_a_pinned_or_held_one(models):
    registry, loader, clock = models(A, B, keep_alive_s=300.0)  # A pinned (the first chat model)
    content(chat(A))
    content(chat(B))
    clock.now += 299
    assert registry.reap() == []
    clock.now += 2
    assert registry.reap() == [B] and loader.released == [B]
    assert registry.entries[A].state == LOADED  # pinned: never unloaded
    hold = registry.acquire_blocking(registry.entries[B])
    clock.now += 10_000
    assert registry.reap() == []  # held by a request
    hold.release()
    clock.now += 301
    assert registry.reap() == [B]


@pytest.mark.parametrize("keep_alive, unloaded", [(0, True), ("0s", True), ("10m", False), (-1, False),
                                                  ("-1m", False)])
def test_the_keep_alive_body_field_sets_how_long_the_model_stays(models, keep_alive, unloaded):
    registry, _, clock = models(A, B)
    content(chat(B, keep_alive=keep_alive))
    clock.now += 60
    assert (registry.reap() == [B]) is unloaded
    expected = 0.0 if unloaded else (600.0 if keep_alive == "10m" else math.inf)
    assert registry.entries[B].keep_alive_s == expected


@pytest.mark.parametrize("keep_alive", ["5 minutes", "", "1x", True, [], {}, "NaN"])
def test_a_bad_keep_alive_is_a_400_naming_it(models, keep_alive):
    models(A)
    answer = chat(A, keep_alive=keep_alive)
    assert answer.status == 400, answer.body
    assert answer.json()["error"]["param"] == "keep_alive"


def test_the_keep_alive_field_is_on_every_generating_and_embedding_route(models):
    models(A)
    bodies = {"/v1/completions": {"model": A, "prompt": "hi", "max_tokens": 2},
              "/v1/responses": {"model": A, "input": "hi", "max_output_tokens": 16},
              "/v1/messages": {"model": A, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
              "/v1/embeddings": {"model": "anything", "input": "hi"}}
    for path, body in bodies.items():
        answer = call("POST", path, {**body, "keep_alive": "forever"})
        assert answer.status == 400, (path, answer.body)
        shape = answer.json()["error"]
        assert "keep_alive" in (shape.get("param") or shape["message"]), (path, shape)


def test_the_keep_alive_field_sets_its_model_s_on_every_generating_route(models):
    registry, loader, clock = models(A, B)
    bodies = {"/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
              "/v1/completions": {"prompt": "hi", "max_tokens": 2},
              "/v1/responses": {"input": "hi", "max_output_tokens": 16},
              "/v1/messages": {"max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}}
    for seconds, (path, body) in enumerate(bodies.items(), start=1):
        answer = call("POST", path, {**body, "model": B, "keep_alive": f"{seconds}m"})
        assert answer.status == 200, (path, answer.body)
        assert registry.entries[B].keep_alive_s == 60.0 * seconds, path
        clock.now += 60.0 * seconds - 1
        assert registry.reap() == [], path
        clock.now += 2
        assert registry.reap() == [B], path  # unloaded once its own keep_alive passed
    assert loader.loads.count(B) == len(bodies)


def test_the_keep_alive_field_sets_the_embedding_model_s_on_the_embeddings_route(minilm_model, raw_asgi_requests):
    from inference.engine.embedding_runner import EmbeddingRunner
    from inference.operations.runtime import EmbeddingService

    from .conftest import EMBEDDING_MODEL
    from .registries import registry_of

    runner = EmbeddingRunner(minilm_model)
    runner.start_thread()
    clock = Clock()
    registry = registry_of(EmbeddingService(EMBEDDING_MODEL, minilm_model.path, 0, minilm_model, runner),
                           pinned=[], clock=clock)
    try:
        with serving(registry):
            answer = call("POST", "/v1/embeddings", {"model": EMBEDDING_MODEL, "input": "hi", "keep_alive": 0})
        assert answer.status == 200, answer.body
        assert registry.entries[EMBEDDING_MODEL].keep_alive_s == 0.0
        assert registry.reap() == [EMBEDDING_MODEL] and registry.loader.released == [EMBEDDING_MODEL]
    finally:
        runner.stop()


def test_the_budget_unloads_the_least_recently_used_idle_model_first(models):
    registry, loader, clock = models(A, B, C, pinned=[], sizes={A: 40, B: 40, C: 40}, estimates={A: 40, B: 40, C: 40},
                                     budget_bytes=100)
    content(chat(A))
    clock.now += 1
    content(chat(B))
    clock.now += 1
    content(chat(A))  # A used last: B is the least recently used
    clock.now += 1
    content(chat(C))
    assert registry.entries[B].state == UNLOADED and loader.released == [B]
    assert {registry.entries[A].state, registry.entries[C].state} == {LOADED}
    assert registry.resident_bytes() == 80


def test_the_budget_never_unloads_a_busy_model_and_the_load_fails_with_503_after_the_wait(models):
    registry, loader, _ = models(A, B, pinned=[], sizes={A: 60, B: 60}, estimates={A: 60, B: 60},
                                 budget_bytes=100, load_wait_s=0.2)
    content(chat(A))
    hold = registry.acquire_blocking(registry.entries[A])  # a request running on A
    answer = chat(B)
    assert answer.status == 503 and answer.json()["error"]["code"] == "model_budget_busy"
    assert B in answer.json()["error"]["message"] and answer.headers["retry-after"] == "5"
    assert registry.entries[A].state == LOADED and loader.released == []
    assert registry.entries[B].state == UNLOADED  # not failed: retried once there is room
    hold.release()
    assert content(chat(B)) == f"I am {B}" and loader.released == [A]


def test_a_model_too_big_for_the_whole_budget_fails_naming_the_model_and_the_budget(models):
    registry, loader, _ = models(A, B, sizes={A: 10}, estimates={A: 10, B: 500}, budget_bytes=100)
    answer = chat(B)
    assert answer.status == 503
    error = answer.json()["error"]
    assert error["code"] == "model_load_failed" and f"'{B}'" in error["message"] and "budget" in error["message"]
    assert loader.loads == [] and registry.entries[B].state == FAILED


def test_a_model_that_cannot_load_fails_its_requests_is_marked_failed_and_retried_while_others_serve(models):
    registry, loader, _ = models(A, B, fail={B: OSError("truncated GGUF: 12 bytes of 4096")})
    answer = chat(B)
    assert answer.status == 503
    error = answer.json()["error"]
    assert error["code"] == "model_load_failed" and error["param"] == "model"
    assert f"'{B}'" in error["message"] and "truncated GGUF" in error["message"]
    listed = {m["id"]: m for m in call("GET", "/v1/models").json()["data"]}
    assert listed[B]["state"] == "failed" and "truncated GGUF" in listed[B]["error"]
    assert content(chat(A)) == f"I am {A}"  # the other model keeps serving
    assert call("GET", "/health").status == 200
    del loader.fail[B]
    assert content(chat(B)) == f"I am {B}"  # retried on a later request
    assert loader.loads.count(B) == 2 and registry.entries[B].error is None


def test_an_unknown_model_is_a_404_naming_it_in_each_route_s_shape(models):
    models(A)
    openai = chat("no-such-model")
    assert openai.status == 404
    assert openai.json()["error"]["code"] == "model_not_found" and "no-such-model" in openai.json()["error"]["message"]
    assert repr(A) in openai.json()["error"]["message"]  # what the server does serve
    anthropic = call("POST", "/v1/messages", {"model": "no-such-model", "max_tokens": 2,
                                              "messages": [{"role": "user", "content": "hi"}]})
    assert anthropic.status == 404 and anthropic.json()["type"] == "error"
    assert "no-such-model" in anthropic.json()["error"]["message"]
    embeddings = call("POST", "/v1/embeddings", {"model": "no-such-model", "input": "hi"})
    assert embeddings.status == 404 and embeddings.json()["error"]["code"] == "model_not_found"
    for path, body in (("/v1/completions", {"prompt": "hi"}), ("/v1/responses", {"input": "hi"}),
                       ("/tokenize", {"prompt": "hi"}), ("/detokenize", {"tokens": [1, 2]})):
        answer = call("POST", path, {**body, "model": "no-such-model"})
        assert answer.status == 404, (path, answer.body)
        error = answer.json()["error"]
        assert error["code"] == "model_not_found" and "no-such-model" in error["message"], (path, answer.body)
    counted = call("POST", "/v1/messages/count_tokens", {"model": "no-such-model",
                                                         "messages": [{"role": "user", "content": "hi"}]})
    assert counted.status == 404 and counted.json()["type"] == "error"
    assert counted.json()["error"]["type"] == "not_found_error" and "no-such-model" in counted.json()["error"]["message"]
    assert anthropic.json()["error"]["type"] == "not_found_error"


def test_models_health_and_metrics_show_each_model_and_its_state(models):
    registry, _, _ = models(A, B, C, sizes={A: 1_000_000}, fail={C: ValueError("unsupported tensor type 99")})
    content(chat(A))
    chat(C)
    listed = {m["id"]: m for m in call("GET", "/v1/models").json()["data"]}
    assert [listed[n]["state"] for n in (A, B, C)] == ["loaded", "unloaded", "failed"]
    assert listed[A]["resident_bytes"] == 1_000_000 and listed[A]["pinned"] and listed[A]["kind"] == "chat"
    assert listed[B]["keep_alive"] == "5m" and listed[B]["resident_bytes"] is None
    assert call("GET", f"/v1/models/{B}").json()["state"] == "unloaded"
    health = call("GET", "/health").json()
    assert health["models"] == {A: "loaded", B: "unloaded", C: "failed"}
    metrics = call("GET", "/metrics").body.decode()
    assert f'metrale:model_loaded{{model_name="{A}",state="loaded"}} 1.0' in metrics
    assert f'metrale:model_loaded{{model_name="{C}",state="failed"}} 0.0' in metrics
    assert f'metrale:model_resident_bytes{{model_name="{A}"}} 1e+06' in metrics


def test_an_operator_unload_and_pin(models):
    registry, loader, clock = models(A, B)
    content(chat(B))
    assert not registry.unload(A)  # pinned: only a forced unload
    assert registry.unload(B) and registry.entries[B].state == UNLOADED
    registry.pin(B)  # pinning loads it
    for _ in range(100):
        if registry.entries[B].state == LOADED:
            break
        time.sleep(0.01)
    clock.now += 10_000
    assert registry.entries[B].pinned and registry.reap() == []


def test_health_is_ready_when_an_operator_unloaded_the_pinned_default_and_its_next_request_loads_it(
        models, monkeypatch):
    from inference.operations import runtime

    started = threading.Event()
    started.set()
    monkeypatch.setattr(runtime, "_started", started)  # the server's start-up has begun
    registry, _, _ = models(A, B)
    # Pinned and its start-up load not yet behind it: loading.
    assert call("GET", "/health").status == 503 and call("GET", "/health").json()["status"] == "loading"
    content(chat(A))
    assert call("GET", "/health").json()["status"] == "ready"
    assert registry.unload(A, force=True) and registry.entries[A].state == UNLOADED
    health = call("GET", "/health")
    assert health.status == 200 and health.json()["status"] == "ready" and health.json()["models"][A] == "unloaded"
    assert content(chat(A)) == f"I am {A}" and registry.entries[A].state == LOADED


def test_acquire_raises_model_load_failed_and_releases_its_hold(models):
    registry, _, _ = models(A, fail={A: RuntimeError("boom")}, pinned=[])
    with pytest.raises(ModelLoadFailed) as failed:
        registry.acquire_blocking(registry.entries[A])
    assert failed.value.model == A and "boom" in failed.value.cause
    assert registry.entries[A].holds == 0
    assert not isinstance(failed.value, ModelBudgetBusy)


def test_the_admin_shows_each_model_live_with_load_unload_and_pin(models, admin_client):
    from adapters.models import ModelSetting

    registry, loader, _ = models(A, B, sizes={A: 2_500_000})
    content(chat(A))
    page = admin_client.get("/admin/adapters/modelsetting/").content.decode()
    assert A in page and B in page and "2.5" in page  # resident MB
    import re

    assert re.findall(r'class="field-live_state">(\w+)<', page) == ["loaded", "unloaded"]
    pk = {row.name: row.pk for row in ModelSetting.objects.all()}
    admin_client.post("/admin/adapters/modelsetting/", {"action": "pin_models", "_selected_action": [pk[B]]})
    assert registry.entries[B].pinned and ModelSetting.objects.get(name=B).pinned is True
    for _ in range(200):
        if registry.entries[B].state == LOADED:
            break
        time.sleep(0.01)
    assert registry.entries[B].state == LOADED  # pinning loads it
    page = admin_client.post("/admin/adapters/modelsetting/", {"action": "unload_models", "_selected_action": [pk[A]]},
                             follow=True).content.decode()
    assert registry.entries[A].state == UNLOADED and loader.released == [A]
    assert f"Model {A}: unloaded." in page  # the name as it is (the admin capitalises a message's first letter)
    admin_client.post("/admin/adapters/modelsetting/", {"action": "load_models", "_selected_action": [pk[A]]})
    for _ in range(200):
        if registry.entries[A].state == LOADED:
            break
        time.sleep(0.01)
    assert registry.entries[A].state == LOADED and loader.loads.count(A) == 2
    admin_client.post(f"/admin/adapters/modelsetting/{pk[B]}/change/", {"pinned": "false", "keep_alive": "90s"})
    assert registry.entries[B].keep_alive_s == 90.0 and not registry.entries[B].pinned


def test_manage_models_commands_reach_the_registry_through_the_database(models):
    from django.core.management import call_command

    from adapters import swap_watch
    from adapters.models import ModelSetting

    registry, _, _ = models(A, B)
    swap_watch.run_model_commands(registry)  # a server's report
    ModelSetting.objects.filter(name=B).update(command="load")
    assert swap_watch.run_model_commands(registry) == [(B, "load")]
    for _ in range(200):
        if registry.entries[B].state == LOADED:
            break
        time.sleep(0.01)
    swap_watch.run_model_commands(registry)
    from io import StringIO

    out = StringIO()
    call_command("models", "list", stdout=out)
    assert f"{B}\tloaded" in out.getvalue() and f"{A}\tunloaded" in out.getvalue()
    call_command("models", "unload", B, "--no-wait", stdout=StringIO())
    assert swap_watch.run_model_commands(registry) == [(B, "unload")]
    assert registry.entries[B].state == UNLOADED and ModelSetting.objects.get(name=B).state == UNLOADED
    from django.core.management import CommandError

    with pytest.raises(CommandError, match="no server serves a model named 'nope'"):
        call_command("models", "load", "nope")


def test_the_operators_choices_apply_over_the_configuration_where_they_may_and_the_log_says_so(models, tmp_path,
                                                                                              caplog):
    from adapters import swap_watch
    from adapters.models import ModelSetting, ServedModel
    from adapters.operator_choices import apply_operator_choices

    registry, _, _ = models(A, B)
    ServedModel.objects.create(pk=1, path=str(tmp_path / "other"), served_name="other", configured="/not/this/one")
    ModelSetting.objects.create(name=B, pinned=True, keep_alive="-1")
    ModelSetting.objects.create(name="not-configured", pinned=True)
    with caplog.at_level("INFO"):
        apply_operator_choices(registry=registry)
    assert registry.names() == [A, B]  # a swap made over another configured default: the configuration wins
    assert "configuration wins" in caplog.text
    assert registry.entries[B].pinned and registry.entries[B].keep_alive_s == math.inf
    assert "not-configured" not in registry.entries  # which models exist is the configuration's
    ServedModel.objects.filter(pk=1).update(configured=swap_watch.configured_default())
    caplog.clear()
    with caplog.at_level("INFO"):
        apply_operator_choices(registry=registry)
        registry.log_configuration()
    assert registry.names() == ["other", B] and registry.default().pinned  # the swap, in the default's place
    assert "the operators' swap applies" in caplog.text
    line = [r.getMessage() for r in caplog.records if r.getMessage().startswith("models configured")][-1]
    assert f"pinned (loaded at start, never unloaded): other, {B}" in line and "loaded: none" in line


def test_with_several_chat_models_a_dead_engine_marks_its_model_failed_and_the_others_serve(models):
    from inference.operations.runtime import ModelLoader

    registry, loader, _ = models(A, B)
    content(chat(A))
    content(chat(B))
    several = ModelLoader()
    several.several_chat_models = True
    several.on_fatal(registry, B)(RuntimeError("a kernel fault"))
    assert registry.entries[B].state == FAILED and "a kernel fault" in registry.entries[B].error
    assert content(chat(A)) == f"I am {A}"  # the other model's requests go on
    assert content(chat(B)) == f"I am {B}" and loader.loads.count(B) == 2  # loaded again on its next request


def test_names_added_while_running_aliases_pulled_models_and_their_removal(models, smollm2_dir):
    registry, loader, clock = models(A, B, pinned=[A], keep_alive_s=60)
    loader.models[C] = loader.models[B]  # what a pull fetched: the loader can load it, the configuration has it not
    registry.alias("copy-of-b", B)
    registry.alias("copy-of-copy", "copy-of-b")  # an alias of an alias selects its model
    assert registry.find("copy-of-copy") is registry.entries[B] and registry.aliases_of(B) == ["copy-of-b",
                                                                                                "copy-of-copy"]
    with pytest.raises(KeyError):
        registry.alias("x", "nothing")
    with pytest.raises(ValueError):
        registry.alias(A, B)  # a served model's own name
    added = registry.add(ModelSpec(C, smollm2_dir, CHAT))
    assert added.added and added.state == UNLOADED and added.keep_alive_s == 60 and registry.add(added.spec) is added
    registry.load(C).result(10)
    assert registry.expires_in_s(C) == 60 and registry.expires_in_s(B) is None  # idle since now; B not loaded
    clock.now += 45
    assert registry.expires_in_s(C) == 15
    registry.load(A).result(10)
    assert math.isinf(registry.expires_in_s(A))  # pinned
    hold = registry.acquire_blocking(registry.entries[C])
    with pytest.raises(ValueError, match="answering requests"):
        registry.remove(C)
    hold.release()
    registry.alias("copy-of-c", C)
    registry.remove(C)
    assert C not in registry.entries and "copy-of-c" not in registry.aliases and C in loader.released
    registry.remove("copy-of-b")
    assert "copy-of-b" not in registry.aliases and B in registry.entries
    with pytest.raises(ValueError, match="configured"):
        registry.remove(B)
    with pytest.raises(KeyError):
        registry.remove("never-served")
