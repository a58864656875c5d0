"""Helpers for the in-process Responses and Conversations API tests: a fake runtime, a scripted
generator in place of the engine (it records the prompt it was given), requests with an
`X-Tenant` header, and an SSE parser."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from asgiref.sync import async_to_sync

from inference.engine.tokenizer import Tokenizer
from inference.serving.deltas import Content, Finish, Reasoning, Usage


@dataclass
class FakeEngine:
    max_model_len: int = 2048

    @property
    def max_request_tokens(self) -> int:
        return self.max_model_len


@dataclass
class FakeRuntime:
    tokenizer: Tokenizer
    engine: FakeEngine = field(default_factory=FakeEngine)
    model_id: str = "smollm2-135m-instruct"
    # A folder without generation_config.json: sampling defaults come from settings.
    model_path: str = "/nonexistent-model-folder"

    @property
    def folder(self):
        from inference.engine.model_folder import ModelFolder

        return ModelFolder.read(self.model_path)


class Script:
    """Stands in for pipeline.generate: each call plays the next scripted turn (default: "Hello
    there." then stop). A Finish gets the real prompt length and the number of text deltas."""

    def __init__(self):
        self.turns: list[list] = []
        self.gens: list = []

    def then(self, *deltas) -> Script:
        self.turns.append(list(deltas))
        return self

    async def generate(self, engine, tokenizer, gen):
        self.gens.append(gen)
        deltas = self.turns.pop(0) if self.turns else [Content("Hello"), Content(" there."),
                                                       Finish("stop")]
        produced = 0
        for d in deltas:
            if isinstance(d, Finish):
                d = Finish(d.reason, Usage(len(gen.prompt_token_ids), produced))
            elif isinstance(d, (Content, Reasoning)):
                produced += 1
            yield d

    def prompt_text(self, tokenizer: Tokenizer, turn: int = -1) -> str:
        return tokenizer.decode(self.gens[turn].prompt_token_ids, skip_special_tokens=False)


def post(client, path, body, tenant="default"):
    return client.post(path, json.dumps(body) if not isinstance(body, bytes) else body,
                       content_type="application/json", headers={"X-Tenant": tenant})


def get(client, path, tenant="default", **query):
    return client.get(path, query, headers={"X-Tenant": tenant})


def delete(client, path, tenant="default"):
    return client.delete(path, headers={"X-Tenant": tenant})


async def _collect(chunks) -> list[bytes]:
    return [chunk async for chunk in chunks]


def sse_events(response) -> list[dict]:
    """The events of a Responses SSE body; checks each `event:` line names its data's type."""
    body = b"".join(async_to_sync(_collect)(response.streaming_content)).decode()
    assert "[DONE]" not in body
    events = []
    for frame in body.split("\n\n"):
        if not frame.strip():
            continue
        lines = dict(line.split(": ", 1) for line in frame.split("\n"))
        data = json.loads(lines["data"])
        assert lines["event"] == data["type"]
        events.append(data)
    return events
