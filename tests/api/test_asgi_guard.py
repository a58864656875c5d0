"""The ASGI guard around the app: over-size bodies refused before they are read, every API answer JSON in
OpenAI's shape, and every response ended, also when the application fails mid-stream."""
import asyncio
import json

import pytest

from inference.http.middleware import ApiAsgiGuard

from .asgi_client import AsgiRequest, serve, site_handler
from .fake_engine import call

ERROR_KEYS = {"message", "type", "param", "code"}


class Driver:
    """Drives one request through the guarded Django app with a body sent in `chunks` messages,
    recording how many of them the application asked for."""

    def __init__(self, path: str, chunks: list[bytes], headers: dict[str, str] | None = None):
        self.scope = AsgiRequest("POST", path, {"content-type": "application/json", **(headers or {})}).scope
        self.messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
                         for i, c in enumerate(chunks)]
        self.read = 0
        self.sent: list[dict] = []

    async def receive(self):
        if self.read < len(self.messages):
            self.read += 1
            return self.messages[self.read - 1]
        await asyncio.sleep(3600)  # the client waits for the answer

    async def send(self, message):
        self.sent.append(message)

    def run(self, app=None):
        serve(asyncio.wait_for, (app or ApiAsgiGuard(site_handler()))(self.scope, self.receive, self.send), 10)
        start = self.sent[0]
        body = b"".join(m.get("body", b"") for m in self.sent[1:])
        assert self.sent[-1]["type"] == "http.response.body" and not self.sent[-1].get("more_body")
        return start["status"], dict(start["headers"]), body


def test_a_declared_length_over_the_limit_is_a_413_before_any_body_is_read(fake_rt, settings):
    settings.METRALE = {**settings.METRALE, "MAX_REQUEST_BYTES": 1000}
    driver = Driver("/v1/chat/completions", [b"x" * 500] * 4, {"content-length": "2000"})
    status, headers, body = driver.run()
    assert status == 413 and driver.read == 0
    assert headers[b"content-type"] == b"application/json" and headers[b"x-request-id"]
    err = json.loads(body)["error"]
    assert set(err) == ERROR_KEYS and err["code"] == "request_too_large" and "2000" in err["message"]


def test_a_chunked_body_is_stopped_at_the_limit_and_answered_413(fake_rt, settings):
    settings.METRALE = {**settings.METRALE, "MAX_REQUEST_BYTES": 10_000}
    driver = Driver("/v1/chat/completions", [b"x" * 1000] * 1000)  # 1 MB, no Content-Length
    status, headers, body = driver.run()
    assert status == 413 and json.loads(body)["error"]["code"] == "request_too_large"
    assert driver.read == 11  # the message that crossed 10,000 bytes was the last one read
    assert fake_rt.engine.submissions == []


def test_a_chunked_body_within_the_limit_is_served(fake_rt):
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}).encode()
    status, _, answer = Driver("/v1/chat/completions", [body[i:i + 7] for i in range(0, len(body), 7)]).run()
    assert status == 200, answer
    assert json.loads(answer)["choices"][0]["message"]["content"]


@pytest.mark.parametrize("value", ["abc", "-1", "1e3", "9" * 30])
def test_an_unreadable_content_length_is_a_400(fake_rt, value):
    status, _, body = Driver("/v1/completions", [b"{}"], {"content-length": value}).run()
    assert status == 400 and json.loads(body)["error"]["code"] == "invalid_content_length"


@pytest.mark.parametrize("method, path, text", [
    ("GET", "/v1/models", lambda b: b["error"]["message"]),
    ("POST", "/v1/messages", lambda b: b["error"]["message"]),
    ("GET", "/api/tags", lambda b: b["error"]),
])
def test_a_host_outside_allowed_hosts_is_a_400_naming_it_in_one_log_line(fake_rt, caplog, method, path, text):
    answer = call(method, path, {} if method == "POST" else None, headers={"host": "evil.example"})
    assert answer.status == 400 and answer.headers["content-type"] == "application/json"
    assert text(answer.json()) == "The Host header 'evil.example' names no host this server answers to (its " \
                                  "ALLOWED_HOSTS)."
    refusals = [r for r in caplog.records if "evil.example" in r.getMessage()]
    assert len(refusals) == 1 and refusals[0].levelname == "WARNING" and refusals[0].exc_info is None
    assert fake_rt.engine.submissions == []
    assert call("GET", "/v1/models", headers={"host": "localhost"}).status == 200


@pytest.mark.parametrize("path, shape", [("/v1/chat/completions", "openai"), ("/v1/messages", "anthropic"),
                                         ("/api/chat", "ollama")])
@pytest.mark.parametrize("encoding", ["gzip", "br", " GZIP "])
def test_a_compressed_body_is_a_415_in_the_route_s_shape_before_it_is_read(fake_rt, path, shape, encoding):
    import gzip

    body = json.dumps({"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 3}).encode()
    for sent in (gzip.compress(body), body):  # compressed, or plain but labelled so: neither is read as JSON
        driver = Driver(path, [sent], {"content-encoding": encoding})
        status, headers, answer = driver.run()
        assert status == 415 and driver.read == 0 and headers[b"accept-encoding"] == b"identity"
        error = json.loads(answer)
        message = {"openai": lambda e: e["error"]["message"], "anthropic": lambda e: e["error"]["message"],
                   "ollama": lambda e: e["error"]}[shape](error)
        assert f"Content-Encoding {encoding.strip().lower()!r} is not supported" in message, error
        if shape == "openai":
            assert error["error"]["code"] == "unsupported_content_encoding"
        if shape == "anthropic":
            assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert fake_rt.engine.submissions == []
    status, _, answer = Driver(path, [body], {"content-encoding": "identity"}).run()
    assert status == 200, answer


@pytest.mark.parametrize("method, path, status", [
    ("GET", "/v1/", 404), ("GET", "/v1", 404), ("POST", "/v1/", 404), ("GET", "/tokenize/", 404),
    ("GET", "/health/", 404), ("POST", "/health", 405), ("DELETE", "/health", 405), ("PUT", "/health", 405),
    ("GET", "/v1/completions?x=%ff", 405), ("GET", "/v1/models?q=%FF", 200),
])
def test_every_api_answer_is_json(fake_rt, method, path, status):
    answer = call(method, path)
    assert answer.status == status, answer.body[:200]
    assert answer.headers["content-type"] == "application/json", answer.body[:200]
    if status >= 400:
        assert set(answer.json()["error"]) == ERROR_KEYS


def test_a_query_string_that_is_not_utf8_is_a_json_400(fake_rt):
    driver = Driver("/v1/models", [b""])
    driver.scope.update(method="GET", query_string=b"q=\xff")
    status, headers, body = driver.run()
    assert status == 400 and headers[b"content-type"] == b"application/json"
    assert set(json.loads(body)["error"]) == ERROR_KEYS


@pytest.mark.parametrize("content_type, raw", [
    ("multipart/form-data; boundary=xx", b'--xx\r\nContent-Disposition: form-data; name="a"\r\n\r\nb\r\n--xx--\r\n'),
    ("multipart/form-data", b"--"), ("multipart/form-data; boundary=", b"x"),
    ("multipart/form-data; boundary=xx; charset=nope", b"--xx--"), ("application/x-www-form-urlencoded", b"a=%ff"),
    ("application/json; charset=latin-1", b'{"prompt": "\xe9"}'), ("text/plain", b'{"prompt": "x"}'),
])
def test_bodies_of_other_content_types_are_answered_in_json(fake_rt, content_type, raw):
    answer = call("POST", "/v1/completions", raw=raw, headers={"content-type": content_type})
    assert answer.status in (200, 400), answer.body[:200]
    assert answer.headers["content-type"] == "application/json"


def test_a_non_api_path_keeps_django_s_own_answer(fake_rt):
    answer = call("GET", "/no-such-page")
    assert answer.status == 404 and "text/html" in answer.headers["content-type"]


async def failing_stream_app(scope, receive, send):
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
    raise RuntimeError("broken mid-stream")


async def failing_early_app(scope, receive, send):
    raise RuntimeError("broken before answering")


def test_an_application_error_mid_stream_ends_the_body():
    status, _, body = Driver("/v1/chat/completions", [b"{}"]).run(ApiAsgiGuard(failing_stream_app))
    assert status == 200 and body == b"data: 1\n\n"


def test_an_application_error_before_the_answer_is_a_500_in_openai_shape():
    status, headers, body = Driver("/v1/chat/completions", [b"{}"]).run(ApiAsgiGuard(failing_early_app))
    assert status == 500 and json.loads(body)["error"]["type"] == "server_error"


def test_a_responses_stream_that_fails_while_encoding_ends_with_an_error_event(fake_rt, monkeypatch):
    from responses_api import views

    real, count = views.sse_frame, [0]

    def breaks_on_the_third(event):
        count[0] += 1
        if count[0] == 3:
            raise UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")
        return real(event)

    monkeypatch.setattr(views, "sse_frame", breaks_on_the_third)
    answer = call("POST", "/v1/responses", {"input": "hi", "stream": True, "max_output_tokens": 4})
    assert answer.status == 200
    events = [json.loads(line[6:]) for line in answer.body.decode().splitlines() if line.startswith("data: ")]
    assert [e["type"] for e in events] == ["response.created", "response.in_progress", "error"]
    assert [e["sequence_number"] for e in events] == [0, 1, 2]
    assert events[-1]["code"] == "server_error"
