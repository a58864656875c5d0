"""/health before the model is up, and the model list."""
import logging

import pytest

from inference.operations import runtime

pytestmark = pytest.mark.django_db




def test_it_answers_503_loading_before_the_model_is_up(client, monkeypatch):
    monkeypatch.setattr(runtime, "_runtime", None)
    monkeypatch.setattr(runtime, "_error", None)
    monkeypatch.setattr(runtime, "_thread", None)
    r = client.get("/health")
    assert r.status_code == 503
    assert r.json() == {"status": "loading"}


def test_it_answers_chat_with_503_in_openai_shape_while_loading(client, monkeypatch):
    monkeypatch.setattr(runtime, "_runtime", None)
    monkeypatch.setattr(runtime, "_error", None)
    monkeypatch.setattr(runtime, "start_loading", lambda: None)
    r = client.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]},
                    content_type="application/json")
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "model_not_ready"
    assert r["Retry-After"] == "5"


def test_it_validates_before_needing_the_model(client, monkeypatch):
    monkeypatch.setattr(runtime, "start_loading", lambda: None)
    r = client.post("/v1/chat/completions", {"messages": []}, content_type="application/json")
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "messages"


def test_polls_while_the_model_loads_log_no_error_and_a_failed_load_still_does(client, monkeypatch, caplog):
    monkeypatch.setattr(runtime, "_runtime", None)
    monkeypatch.setattr(runtime, "_error", None)
    monkeypatch.setattr(runtime, "_thread", object())  # a load under way
    monkeypatch.setattr(runtime, "start_loading", lambda: None)
    with caplog.at_level("INFO"):
        for _ in range(3):
            assert client.get("/health").status_code == 503
        chat = client.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]},
                           content_type="application/json")
        assert chat.status_code == 503
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    monkeypatch.setattr(runtime, "_error", "OSError: no such model folder")
    with caplog.at_level("INFO"):
        assert client.get("/health").json()["status"] == "failed"
    assert [r.levelname for r in caplog.records if r.name == "django.request"] == ["ERROR"]
