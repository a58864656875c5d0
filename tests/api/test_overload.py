"""A full engine waiting queue (EngineOverloaded at submit) is a 503 in OpenAI's error shape with Retry-After."""
import pytest

from inference.engine.outputs import EngineOverloaded

from .fake_engine import call


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/completions", {"prompt": "hi"}),
])
@pytest.mark.parametrize("stream", [False, True])
def test_a_full_waiting_queue_is_a_503_with_retry_after(fake_rt, monkeypatch, path, body, stream):
    def overloaded(request):
        raise EngineOverloaded("the server is at capacity: 8 requests are already waiting", retry_after_s=3)

    monkeypatch.setattr(fake_rt.engine, "submit", overloaded)
    r = call("POST", path, {"model": "smollm2-135m-instruct", "stream": stream, **body})
    assert r.status == 503
    assert r.headers["retry-after"] == "3"
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "server_error" and err["code"] == "overloaded"
    assert "8 requests are already waiting" in err["message"]
