"""A scripted stand-in for AsyncEngine (same submit / handle contract), the real SmolLM2 tokenizer around it,
and helpers that drive the whole ASGI stack (middleware, auth wrapper, views) against it."""
from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field

from inference.engine.beam_search import Beam
from inference.engine.outputs import Failed, Finished, RequestRejected, TokenEvent
from inference.engine.request import EngineRequest
from inference.engine.sampling_params import SamplingParams
from inference.engine.tokenizer import Tokenizer

from .asgi_client import AsgiRequest, serve


@dataclass
class Submission:
    prompt_token_ids: list[int]
    params: SamplingParams
    request_id: str | None
    timeout_s: float | None
    handle: "FakeHandle"


class FakeHandle:
    """Yields its scripted events (a pause of `delay_s` before each); abort() is recorded."""

    def __init__(self, events: list, delay_s: float = 0.0):
        self.events = list(events)
        self.delay_s = delay_s
        self.aborted: str | None = None

    def __aiter__(self):
        return self

    async def __anext__(self):
        await asyncio.sleep(self.delay_s)
        if not self.events:
            raise StopAsyncIteration
        return self.events.pop(0)

    def abort(self, reason: str = "cancelled") -> None:
        if self.aborted is None:
            self.aborted = reason
        self.events.clear()


Script = Callable[[list[int], SamplingParams, int], list]


@dataclass
class FakeEngine:
    """`script(prompt_ids, params, submission_index)` gives each request's events."""

    tokenizer: Tokenizer
    script: Script
    max_model_len: int = 2048
    delay_s: float = 0.0
    submissions: list[Submission] = field(default_factory=list)
    block_size: int = 16
    num_waiting: int = 0

    @property
    def max_request_tokens(self) -> int:
        return self.max_model_len

    @property
    def num_running(self) -> int:
        """Scripted requests with events left."""
        return sum(1 for s in self.submissions if s.handle.events)

    def idle(self) -> bool:
        """No scripted request has events left (AsyncEngine.idle's meaning for a swap's drain)."""
        return all(not s.handle.events for s in self.submissions)

    def stop(self, timeout: float = 10.0) -> None:
        pass

    def submit(self, request: EngineRequest):
        prompt_token_ids, params = request.prompt_token_ids, request.params
        if len(prompt_token_ids) + params.max_tokens > self.max_model_len:
            raise RequestRejected("too long")
        events = self.script(prompt_token_ids, params, len(self.submissions))
        if request.beam is not None:
            events = beam_events(prompt_token_ids, events, request.beam.n)
        handle = FakeHandle(events, self.delay_s)
        self.submissions.append(Submission(list(prompt_token_ids), params, request.request_id, request.timeout_s,
                                           handle))
        return handle


def beam_events(prompt_ids: list[int], events: list, n: int) -> list:
    """A beam request's events, as the engine sends them: the script's tokens become `n` beams (the same
    output, each a little less likely than the one before) on one Finished (reason stop), or its Failed."""
    if any(isinstance(e, Failed) for e in events):
        return [e for e in events if isinstance(e, Failed)]
    output = [e.token_id for e in events if isinstance(e, TokenEvent)]
    beams = [Beam(list(prompt_ids) + output, -0.25 * len(output) - k, False, list(output),
                  [(-0.25, [(t, -0.25)]) for t in output]) for k in range(n)]
    return [Finished("stop", len(prompt_ids), len(output), 0.0, 0.0, beams=beams)]


def fake_logprobs(token_id: int, params: SamplingParams) -> tuple | None:
    """(sampled logprob, top-N) for a token: the token itself first at -0.25, then ids 10, 11, ... lower."""
    if params.logprobs is None:
        return None
    tops = [(token_id, -0.25)] + [(10 + k, -1.0 - k) for k in range(params.logprobs - 1)]
    return (-0.25, tops[:params.logprobs])


def reply(tokenizer: Tokenizer, text: str | list[str], reason: str = "stop", *, fail: str | None = None) -> Script:
    """A script answering `text` (or text[i] for submission i) token by token, then `reason` (or Failed)."""

    def script(prompt_ids, params, index):
        t = text if isinstance(text, str) else text[index % len(text)]
        ids = tokenizer.encode(t)[:params.max_tokens]
        events: list = [TokenEvent(i, fake_logprobs(i, params)) for i in ids]
        if fail is not None:
            return events + [Failed(fail)]
        end = "length" if len(ids) == params.max_tokens and reason == "stop" else reason
        prompt_lps = None
        if params.prompt_logprobs is not None:
            prompt_lps = [None] + [(-2.0, [(t, -2.0)][:params.prompt_logprobs]) for t in prompt_ids[1:]]
        return events + [Finished(end, len(prompt_ids), len(ids), 0.0, 0.0, 0, prompt_lps)]
    return script


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self):
        return json.loads(self.body)

    def events(self) -> list:
        """The SSE data payloads in order: dicts, and the string "[DONE]"."""
        out = []
        for frame in self.body.decode().split("\n\n"):
            for line in frame.splitlines():
                if line.startswith("data: "):
                    data = line[len("data: "):]
                    out.append(data if data == "[DONE]" else json.loads(data))
        return out


def call(method: str, path: str, body=None, headers: dict | None = None, raw: bytes | None = None) -> Answer:
    """One request through Django's ASGI handler (middleware, auth, views), read to the end."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else b"")
    hdrs = {"content-type": "application/json", "content-length": str(len(data)), **(headers or {})}

    async def run():
        req = await AsgiRequest(method, path, hdrs, data).start()
        return Answer(req.status, req.headers, await req.read_all())
    return serve(run)
