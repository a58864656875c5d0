"""/health before the model is up, and the model list."""
import logging
import threading

import pytest

pytestmark = pytest.mark.django_db


def test_it_answers_503_loading_before_the_model_is_up(client):
    r = client.get("/health")
    assert r.status_code == 503
    assert r.json() == {"status": "loading"}


def test_a_chat_request_waits_for_the_model_that_is_loading(client, no_model_loading):
    """A request for a model that is loading waits for that load (not refused); one whose load fails
    gets 503 model_load_failed naming the model, in OpenAI's shape."""
    gate = threading.Event()
    no_model_loading.loader.gate = gate
    no_model_loading.load(no_model_loading.default().name)
    threading.Timer(0.3, gate.set).start()
    r = client.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]},
                    content_type="application/json")
    assert len(no_model_loading.loader.loads) == 1  # the request waited for the load under way
    assert r.status_code == 503
    error = r.json()["error"]
    assert error["code"] == "model_load_failed" and no_model_loading.default().name in error["message"]
    assert r["Retry-After"] == "5"


def test_it_validates_before_needing_the_model(client):
    r = client.post("/v1/chat/completions", {"messages": []}, content_type="application/json")
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "messages"


def test_polls_while_the_model_loads_log_no_error_and_a_failed_load_still_does(client, no_model_loading, caplog):
    gate = threading.Event()
    no_model_loading.loader.gate = gate
    no_model_loading.load(no_model_loading.default().name)  # a load under way
    with caplog.at_level("INFO"):
        for _ in range(3):
            assert client.get("/health").status_code == 503
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    no_model_loading.loader.fail[no_model_loading.default().name] = OSError("no such model folder")
    gate.set()
    for _ in range(200):
        if no_model_loading.default().state == "failed":
            break
        threading.Event().wait(0.01)
    caplog.clear()
    with caplog.at_level("INFO"):
        failed = client.get("/health").json()
        assert failed["status"] == "failed" and "no such model folder" in failed["error"]
    assert [r.levelname for r in caplog.records if r.name == "django.request"] == ["ERROR"]
