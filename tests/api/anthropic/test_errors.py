"""Anthropic's error shape on the Messages routes from every layer: the endpoint wrapper (400, 401, 404, 405, 429,
529), the ASGI guard (413, a 500 before the answer), unknown paths, errors after the stream started (an engine
failure, an operator's cancel), and the `request-id` header on every answer; x-api-key auth."""
import json

import pytest

from anthropic_api import views as anthropic_views
from inference.http.api import by_method, openai_endpoint
from inference.operations.checks import check_guarded_routes
from inference.engine.outputs import EngineOverloaded
from inference.http.error_shapes import shape_for_path
from inference.serving.errors import ANTHROPIC, OPENAI

from ..test_asgi_guard import Driver
from ..fake_engine import call, reply
from .support import USER, messages, sse_frames

BODY = {"model": "smollm2-135m-instruct", "max_tokens": 16, "messages": USER}


def anthropic_error(answer, status: int, kind: str) -> str:
    """The message of an Anthropic-shaped error answer (after checking its status, type and request id)."""
    assert answer.status == status, answer.body
    body = answer.json()
    assert set(body) == {"type", "error", "request_id"} and body["type"] == "error"
    assert set(body["error"]) == {"type", "message"} and body["error"]["type"] == kind
    assert body["request_id"] == answer.headers["request-id"] == answer.headers["x-request-id"]
    return body["error"]["message"]


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_auth_errors_are_authentication_errors(fake_rt, require_auth, path):
    assert "x-api-key" in anthropic_error(call("POST", path, BODY), 401, "authentication_error")
    anthropic_error(call("POST", path, BODY, headers={"x-api-key": "mk-nope"}), 401, "authentication_error")


def post(client, path, body, headers):
    """POST through Django's test client (keys made in the test's transaction are visible to it)."""
    return client.post(path, data=body, content_type="application/json", headers=headers)


def test_x_api_key_and_bearer_both_authenticate(client, fake_rt, require_auth, make_tenant, make_key):
    _, key = make_key(make_tenant())
    for headers in ({"x-api-key": key}, {"authorization": f"Bearer {key}"},
                    {"x-api-key": key, "anthropic-version": "2099-01-01"}):
        assert post(client, "/v1/messages", BODY, headers).status_code == 200
    # The OpenAI routes take the same keys either way (and keep OpenAI's shape).
    assert client.get("/v1/models", headers={"x-api-key": key}).status_code == 200


def test_unknown_paths_under_messages_are_not_found_errors(fake_rt):
    anthropic_error(call("POST", "/v1/messages/batches/x", BODY), 404, "not_found_error")
    assert "error" in call("POST", "/v1/nothing-here", BODY).json()  # OpenAI's shape elsewhere


def test_other_methods_are_invalid_request_errors(fake_rt):
    assert "GET is not allowed" in anthropic_error(call("GET", "/v1/messages"), 405, "invalid_request_error")


def test_an_unknown_model_is_a_not_found_error(fake_rt, settings):
    settings.METRALE = {**settings.METRALE, "ACCEPT_ANY_MODEL_NAME": False}
    assert "claude-x" in anthropic_error(messages(model="claude-x"), 404, "not_found_error")
    assert messages(model="smollm2-135m-instruct").status == 200


@pytest.mark.parametrize("block, named", [
    ({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"}}, "'image'"),
    ({"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}, "'document'"),
])
def test_media_blocks_are_a_400_naming_the_block(fake_rt, block, named):
    message = anthropic_error(messages(messages=[{"role": "user", "content": [block]}]), 400, "invalid_request_error")
    assert "messages[0].content[0]" in message and named in message


def test_a_body_over_the_limit_is_request_too_large(fake_rt, settings):
    settings.METRALE = {**settings.METRALE, "MAX_REQUEST_BYTES": 1000}
    answer = call("POST", "/v1/messages", raw=b'{"model": "smollm2-135m-instruct", "pad": "' + b"x" * 2000 + b'"}')
    anthropic_error(answer, 413, "request_too_large")


def test_a_rate_limited_request_is_a_rate_limit_error_with_retry_after(client, fake_rt, require_auth, make_tenant,
                                                                         make_key, frozen_clock):
    _, key = make_key(make_tenant("limited", requests_per_minute=1))
    headers = {"x-api-key": key}
    assert post(client, "/v1/messages", BODY, headers).status_code == 200
    denied = post(client, "/v1/messages", BODY, headers)
    assert denied.status_code == 429
    body = denied.json()
    assert body["type"] == "error" and body["error"]["type"] == "rate_limit_error"
    assert int(denied.headers["retry-after"]) >= 1


def test_messages_answers_carry_anthropics_ratelimit_headers_beside_openais(client, fake_rt, require_auth,
                                                                             make_tenant, make_key, frozen_clock):
    from datetime import datetime, timezone

    tenant = make_tenant("limited", requests_per_minute=2, tokens_per_minute=6000)
    _, key = make_key(tenant)
    headers = {"x-api-key": key}
    now = frozen_clock.now

    def reset_in_s(answer, axis: str) -> float:
        moment = answer.headers[f"anthropic-ratelimit-{axis}-reset"]
        assert moment.endswith("Z") and "T" in moment  # RFC 3339, UTC
        return datetime.strptime(moment, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp() - now

    ok = post(client, "/v1/messages", BODY, headers)
    assert ok.status_code == 200
    assert ok.headers["anthropic-ratelimit-requests-limit"] == ok.headers["x-ratelimit-limit-requests"] == "2"
    assert ok.headers["anthropic-ratelimit-requests-remaining"] == ok.headers["x-ratelimit-remaining-requests"] == "1"
    assert 0 < reset_in_s(ok, "requests") <= 31  # half the bucket back at 2 a minute
    assert ok.headers["anthropic-ratelimit-tokens-limit"] == "6000"
    assert ok.headers["anthropic-ratelimit-tokens-remaining"] == ok.headers["x-ratelimit-remaining-tokens"]
    assert int(ok.headers["anthropic-ratelimit-tokens-remaining"]) < 6000  # the reservation was debited
    assert 0 < reset_in_s(ok, "tokens") <= 60
    bad = post(client, "/v1/messages", {**BODY, "max_tokens": -1}, headers)  # answered before admission
    assert bad.status_code == 400 and bad.headers["anthropic-ratelimit-requests-remaining"] == "1"
    post(client, "/v1/messages/count_tokens", {"model": BODY["model"], "messages": USER}, headers)
    denied = post(client, "/v1/messages", BODY, headers)
    assert denied.status_code == 429 and denied.headers["anthropic-ratelimit-requests-remaining"] == "0"
    assert reset_in_s(denied, "requests") == pytest.approx(60, abs=1)
    assert reset_in_s(denied, "requests") >= int(denied.headers["retry-after"])
    # The OpenAI routes keep OpenAI's headers only; an axis not enforced has no Anthropic header.
    assert not any(h.startswith("anthropic-") for h in client.get("/v1/models", headers=headers).headers)
    _, free = make_key(make_tenant("free"))
    unlimited = post(client, "/v1/messages", BODY, {"x-api-key": free})
    assert unlimited.headers["x-ratelimit-limit-requests"] == "unlimited"
    assert not any(h.startswith("anthropic-ratelimit") for h in unlimited.headers)


@pytest.mark.parametrize("stream", [False, True])
def test_a_full_waiting_queue_is_overloaded_error_529(fake_rt, monkeypatch, stream):
    def overloaded(request):
        raise EngineOverloaded("8 requests are already waiting", retry_after_s=3)

    monkeypatch.setattr(fake_rt.engine, "submit", overloaded)
    answer = messages(stream=stream)
    assert "8 requests are already waiting" in anthropic_error(answer, 529, "overloaded_error")
    assert answer.headers["retry-after"] == "3"


def test_an_engine_failure_after_the_stream_started_is_an_error_event(fake_rt):
    fake_rt.engine.script = reply(fake_rt.tokenizer, "Hello", fail="the device fell over")
    frames = sse_frames(messages(stream=True))
    assert frames[0][0] == "message_start"
    name, data = frames[-1]
    assert name == "error" and data["error"] == {"type": "api_error", "message": "the device fell over"}
    blocking = messages()
    assert "the device fell over" in anthropic_error(blocking, 500, "api_error")


def test_an_operator_cancel_ends_the_stream_with_an_error_event(fake_rt):
    fake_rt.engine.script = reply(fake_rt.tokenizer, "Hello world", reason="cancelled")
    frames = sse_frames(messages(stream=True))
    assert [n for n, _ in frames][-1] == "error" and "message_stop" not in [n for n, _ in frames]
    assert "cancelled" in frames[-1][1]["error"]["message"]
    blocking = messages()
    assert "cancelled" in anthropic_error(blocking, 500, "api_error")
    assert blocking.headers["x-should-retry"] == "false"  # the SDK does not retry what an operator ended


def test_a_request_past_its_deadline_is_a_timeout_error(fake_rt):
    fake_rt.engine.script = reply(fake_rt.tokenizer, "Hello world", reason="timeout")
    anthropic_error(messages(), 504, "timeout_error")
    assert sse_frames(messages(stream=True))[-1][1]["error"]["type"] == "timeout_error"


def test_an_exception_before_the_answer_is_an_api_error(fake_rt, monkeypatch):
    async def broken(*args, **kwargs):
        raise RuntimeError("bug")

    monkeypatch.setattr(anthropic_views, "prepare", broken)
    anthropic_error(messages(), 500, "api_error")


def test_the_drain_gate_answers_in_the_route_s_shape(fake_rt, monkeypatch):
    import asyncio

    from metrale_site import drain

    monkeypatch.setattr(drain, "draining", lambda: True)
    sent = []

    async def send(message):
        sent.append(message)

    async def app(scope, receive, send):
        raise AssertionError("a draining server runs nothing")

    asyncio.run(drain.gate(app)({"type": "http", "path": "/v1/messages"}, None, send))
    assert sent[0]["status"] == 529 and b"overloaded_error" in sent[1]["body"]


def test_every_answer_has_a_request_id(fake_rt):
    for answer in (messages(), messages(stream=True), messages(temperature=5), call("GET", "/v1/messages"),
                   call("POST", "/v1/messages/count_tokens", {"model": "smollm2-135m-instruct", "messages": USER})):
        assert answer.headers["request-id"].startswith("req_")


def test_the_error_shape_is_read_from_the_route():
    assert shape_for_path("/v1/messages") is ANTHROPIC and shape_for_path("/v1/messages/count_tokens") is ANTHROPIC
    assert shape_for_path("/v1/messages/anything/else") is ANTHROPIC
    assert shape_for_path("/v1/chat/completions") is OPENAI and shape_for_path("/nowhere") is OPENAI
    assert check_guarded_routes(None) == []


def test_w002_flags_one_url_with_two_error_shapes(monkeypatch):
    from inference.operations import checks

    mixed = by_method(GET=openai_endpoint(anthropic_views.unknown_route.__wrapped__),
                      POST=anthropic_views.unknown_route)
    monkeypatch.setattr(checks, "guarded_routes", lambda: [("v1/mixed", mixed)])
    warnings = check_guarded_routes(None)
    assert [w.id for w in warnings] == ["metrale.W002"] and "different error shapes" in warnings[0].msg


def test_a_chunked_body_over_the_limit_is_request_too_large(fake_rt, settings):
    settings.METRALE = {**settings.METRALE, "MAX_REQUEST_BYTES": 1000}
    status, headers, body = Driver("/v1/messages", [b"x" * 500] * 4).run()
    assert status == 413 and json.loads(body)["error"]["type"] == "request_too_large"
    assert headers[b"request-id"] == headers[b"x-request-id"]
