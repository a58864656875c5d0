"""Helpers for the in-process Ollama tests: requests through the whole ASGI stack, NDJSON bodies read as the
`ollama` client reads them (one json.loads per line), and Ollama's error shape."""
from __future__ import annotations

import json

from ..fake_engine import Answer, call

MODEL = "smollm2-135m-instruct"
USER = [{"role": "user", "content": "hi"}]


def chat(**body) -> Answer:
    """POST /api/chat with the served model and a user message, overridden by `body` (streamed by default)."""
    return call("POST", "/api/chat", {"model": MODEL, "messages": USER, **body})


def generate(**body) -> Answer:
    """POST /api/generate with the served model and a prompt, overridden by `body`."""
    return call("POST", "/api/generate", {"model": MODEL, "prompt": "hi", **body})


def lines(answer: Answer) -> list[dict]:
    """An NDJSON body's objects: every line one JSON object, the body ending with a newline, no blank line."""
    assert answer.status == 200, answer.body
    assert answer.headers["content-type"] == "application/x-ndjson"
    text = answer.body.decode()
    assert text.endswith("\n") and "\n\n" not in text
    return [json.loads(line) for line in text.split("\n")[:-1]]


def ollama_error(answer: Answer, status: int) -> str:
    """The message of an answer in Ollama's error shape (after checking its status and that `error` is all it has)."""
    assert answer.status == status, answer.body
    assert answer.headers["content-type"] == "application/json"
    body = answer.json()
    assert set(body) == {"error"} and isinstance(body["error"], str) and body["error"], body
    return body["error"]
