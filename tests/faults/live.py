"""Helpers for the fault tests against live servers: the real model's environment, a chat stream
read on a thread, the server's SQLite database read directly, and waits."""
from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path

import httpx


def model_env(smollm2_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of a live server serving SmolLM2 with a small KV pool."""
    return {"METRALE_MODEL": str(smollm2_dir), "METRALE_KV_CACHE_BYTES": str(128 << 20), **extra}


class ChatStream(threading.Thread):
    """A streamed chat completion read on a thread: `payloads` (sse data), `started` set once
    the first content chunk arrived."""

    def __init__(self, url: str, max_tokens: int, prompt: str = "Count from one to a thousand."):
        super().__init__(daemon=True)
        self.url, self.max_tokens, self.prompt = url, max_tokens, prompt
        self.payloads: list = []
        self.started = threading.Event()
        self.error: Exception | None = None

    def run(self):
        body = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": self.prompt}],
                "max_tokens": self.max_tokens, "stream": True, "ignore_eos": True,
                "temperature": 0}
        try:
            with httpx.stream("POST", self.url + "/v1/chat/completions", json=body,
                              timeout=120) as response:
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        data = line[len("data: "):]
                        self.payloads.append(data if data == "[DONE]" else json.loads(data))
                        if len(self.payloads) >= 2:
                            self.started.set()
        except Exception as exc:  # noqa: BLE001  (the test asserts on it)
            self.error = exc
        finally:
            self.started.set()


def wait_for(predicate, timeout_s: float, what: str, every_s: float = 0.1):
    """Poll `predicate()` until it returns something truthy; returns that."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


# The polls' client: a bare httpx.get builds a client, and with it an SSL context that loads the CA
# bundle, at every call (about 50 ms of CPU each; the waits below poll ten times a second). No
# connection is kept alive, so each poll connects afresh, as a bare httpx.get does.
_polls = httpx.Client(timeout=2, limits=httpx.Limits(max_keepalive_connections=0))


def answering(url: str):
    """The /health response, or None while nothing answers on `url`."""
    try:
        return _polls.get(url + "/health")
    except httpx.TransportError:
        return None


class ServerDb:
    """Read-only queries on a live server's SQLite database."""

    def __init__(self, path: Path):
        self.path = path

    def rows(self, sql: str, *args) -> list[tuple]:
        with sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=20) as con:
            return con.execute(sql, args).fetchall()

    def status(self, response_id: str) -> str:
        return self.rows("select status from responses_api_storedresponse where id = ?",
                         response_id)[0][0]

    def statuses(self) -> dict[str, str]:
        return dict(self.rows("select id, status from responses_api_storedresponse"))

    def events(self, response_id: str) -> list[dict]:
        return [json.loads(d) for (d,) in self.rows(
            "select data from responses_api_responseevent where response_id = ? "
            "order by sequence_number", response_id)]

    def output(self, response_id: str) -> list[dict]:
        return [json.loads(d) for (d,) in self.rows(
            "select data from responses_api_responseitem where response_id = ? and "
            "direction = 'output' order by position", response_id)]

    def deltas(self, response_id: str) -> int:
        return self.rows("select count(*) from responses_api_responseevent where response_id = ? "
                         "and type = 'response.output_text.delta'", response_id)[0][0]


def message_text(items: list[dict]) -> str:
    """The text of the message items among `items`."""
    return "".join(part.get("text", "") for item in items if item["type"] == "message"
                   for part in item["content"])
