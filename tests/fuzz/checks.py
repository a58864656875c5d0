"""What every answer to a generated body must be: never a 5xx, JSON (or a well-formed SSE or NDJSON stream), every
error in its route's shape (OpenAI's, Anthropic's on the Messages routes, Ollama's on /api), and a 400 for a body
whose one mutated field is at fault naming that field (in `param`; Anthropic's and Ollama's shapes have none)."""
from __future__ import annotations

import json
import re

from .routes import Route
from .strategies import Body

ERROR_KEYS = {"message", "type", "param", "code"}
# Where a 400 about the prompt's size points, per route: the prompt's own field.
PROMPT_FIELD = {"/v1/chat/completions": "messages", "/v1/completions": "prompt", "/v1/responses": "input",
                "/tokenize": "prompt"}
# Cross-field rules name the field that needs the other one (stream_options needs stream, ...): with
# only one field mutated, the named field is still the mutated one or one of the route's base fields.


def root(param: str) -> str:
    return re.split(r"[.\[]", param, maxsplit=1)[0]


def check_error(err: dict, where: str) -> None:
    assert set(err) == ERROR_KEYS, (where, err)
    assert isinstance(err["message"], str) and err["message"], (where, err)
    assert isinstance(err["type"], str) and err["type"], (where, err)
    assert err["param"] is None or isinstance(err["param"], str), (where, err)
    assert err["code"] is None or isinstance(err["code"], str), (where, err)


def check_anthropic_error(answer: dict, where: str) -> None:
    assert set(answer) <= {"type", "error", "request_id"} and answer["type"] == "error", (where, answer)
    assert set(answer["error"]) == {"type", "message"}, (where, answer)
    assert isinstance(answer["error"]["message"], str) and answer["error"]["message"], (where, answer)


def check_anthropic_stream(body: bytes, where: str) -> None:
    """Every frame an `event:` line naming its data's type; message_start first; message_stop or error last."""
    names = []
    for frame in body.decode("utf-8").split("\n\n"):
        if frame.strip():
            event, data = frame.split("\n")
            payload = json.loads(data[len("data: "):])
            assert event == f"event: {payload['type']}", (where, frame)
            if payload["type"] == "error":
                check_anthropic_error(payload, where)
            names.append(payload["type"])
    assert names[0] == "message_start" and names[-1] in ("message_stop", "error"), (where, names)


def check_ollama_error(answer, where: str) -> None:
    assert isinstance(answer, dict) and set(answer) == {"error"}, (where, answer)
    assert isinstance(answer["error"], str) and answer["error"], (where, answer)


def check_ndjson(body: bytes, where: str) -> None:
    """Every line one JSON object, the body ending with a newline; the last line a final object (done) or an
    error, and only the last."""
    text = body.decode("utf-8")
    assert text.endswith("\n") and "\n\n" not in text, (where, text[-200:])
    objects = [json.loads(line) for line in text.split("\n")[:-1]]
    assert objects and all(isinstance(o, dict) for o in objects), where
    for o in objects[:-1]:
        assert "error" not in o and o.get("done") is not True, (where, o)
    last = objects[-1]
    if "error" in last:
        check_ollama_error(last, where)
    else:
        assert last.get("done") is True or last.get("status") == "success", (where, last)


def sse_payloads(body: bytes) -> list:
    payloads = []
    for frame in body.decode("utf-8").split("\n\n"):
        for line in frame.splitlines():
            if line.startswith("data: "):
                data = line[len("data: "):]
                payloads.append(data if data == "[DONE]" else json.loads(data))
    return payloads


def check_stream(route: Route, body: bytes, where: str) -> None:
    payloads = sse_payloads(body)
    assert payloads, where
    for p in payloads:
        if isinstance(p, dict) and "error" in p:
            check_error(p["error"], where)
    if route.path == "/v1/responses":
        kinds = [p["type"] for p in payloads]
        assert kinds[0] == "response.created", (where, kinds[:3])
        seq = [p["sequence_number"] for p in payloads]
        assert seq == list(range(len(seq))), (where, seq)
        assert kinds[-1] in ("response.completed", "response.incomplete", "response.failed", "error"), (where, kinds)
    else:
        assert payloads[-1] == "[DONE]", (where, payloads[-2:])


def check_ollama_answer(status: int, content_type: str, content: bytes, where: str) -> dict | None:
    """An answer on Ollama's routes: NDJSON lines (check_ndjson), an empty 200 (copy, delete), JSON, every error
    `{"error": "..."}` and nothing else (its shape names no field). Returns the error object of a 4xx."""
    if content_type == "application/x-ndjson":
        assert status == 200, where
        check_ndjson(content, where)
        return None
    if status == 200 and not content:
        return None
    assert content_type == "application/json", where
    answer = json.loads(content)
    if status < 400:
        assert isinstance(answer, dict) and "error" not in answer, where
        return None
    check_ollama_error(answer, where)
    return answer


def check_answer(route: Route, body: Body, status: int, headers: dict[str, str], content: bytes) -> dict | None:
    """Assert the rules above for one answer; returns the error object of a 4xx (None otherwise)."""
    where = f"{route.path} {body.raw[:300]!r} -> {status} {content[:300]!r}"
    assert status < 500, where
    content_type = headers.get("content-type", "")
    if route.shape == "ollama":
        return check_ollama_answer(status, content_type, content, where)
    if content_type.startswith("text/event-stream"):
        assert status == 200, where
        if route.shape == "anthropic":
            check_anthropic_stream(content, where)
        else:
            check_stream(route, content, where)
        return None
    assert content_type == "application/json", where
    answer = json.loads(content)
    if status < 400:
        assert isinstance(answer, dict), where
        return None
    if route.shape == "anthropic":
        check_anthropic_error(answer, where)
        return answer["error"]
    check_error(answer["error"], where)
    err = answer["error"]
    if status == 400 and body.mutated is not None and err["code"] != "invalid_json":
        assert err["param"] is not None, where
        allowed = {body.mutated, *route.base}
        if err["code"] == "context_length_exceeded":
            allowed.add(PROMPT_FIELD.get(route.path, body.mutated))
        assert root(err["param"]) in allowed, where
    return err
