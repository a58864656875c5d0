"""One /api/chat or /api/generate answer over the shared `inference.http.views.respond` flow: NDJSON lines, or the
folded object.

`OllamaWire` has the wire interface `respond` takes (`stream`, `media_type`, `frames(run)`, `body(run)`): every
line is one JSON object and a newline (application/x-ndjson; no blank lines: clients run json.loads on every
line); an error after the stream started (an engine error, a request cancelled or past its deadline, a bug
here) is a last line `{"error": "..."}` under the 200 already sent, as Ollama does.
"""
from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator

from inference.serving.choices import Choices
from inference.serving.deltas import Error, Finish
from inference.serving.errors import ApiError
from inference.serving.prepare import Prepared

from .encoder import OllamaStream, Timing, failure, fold

log = logging.getLogger("metrale.ollama")


def ndjson_line(obj: dict) -> bytes:
    """One object as an NDJSON line (compact JSON, then a newline)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


class OllamaWire:
    """An /api/chat or /api/generate request's answer: `frames(run)` for a stream, `body(run)` for a blocking one.

    kind: encoder.CHAT or GENERATE; model: the request's `model` as sent; context: generate's `context` carries
    the prompt's ids (False: chat, raw generate); logprobs: None, or the alternatives each token lists."""

    media_type = "application/x-ndjson"

    def __init__(self, kind: str, model: str, stream: bool, prepared: Prepared, timing: Timing, *,
                 context: bool = False, logprobs: int | None = None):
        self.kind = kind
        self.model = model
        self.stream = stream
        self.prepared = prepared
        self.timing = timing
        self.context = prepared.prompt_ids[0] if context else None
        self.logprobs = logprobs

    async def objects(self, run: Choices) -> AsyncIterator[dict | ApiError]:
        """The answer's objects; an ApiError as the last item when it fails."""
        self.timing.submitted = min((g.submitted_at for g in run.generations), default=None)
        stream = OllamaStream(self.kind, self.model, self.timing, context=self.context, logprobs=self.logprobs)
        async with contextlib.aclosing(run.merged()) as merged:
            async for _, delta in merged:
                if isinstance(delta, (Error, Finish)):
                    error = failure(delta)
                    yield error if error is not None else stream.end(delta, run.usage)
                    return
                for obj in stream.feed(delta):
                    yield obj

    async def frames(self, run: Choices) -> AsyncIterator[bytes]:
        """NDJSON lines of the objects; an error as a last `{"error": ...}` line."""
        objects = self.objects(run)
        async with contextlib.aclosing(objects):
            try:
                async for obj in objects:
                    if isinstance(obj, ApiError):
                        yield ndjson_line({"error": obj.message})
                        return
                    yield ndjson_line(obj)
            except Exception as exc:  # a bug must still end the stream in Ollama's shape
                log.exception("an Ollama stream failed")
                yield ndjson_line({"error": f"internal error: {exc}"})

    async def body(self, run: Choices) -> dict:
        """The blocking answer (fold of the same objects). Raises the answer's ApiError when it fails."""
        collected = []
        async with contextlib.aclosing(self.objects(run)) as objects:
            async for obj in objects:
                if isinstance(obj, ApiError):
                    raise obj
                collected.append(obj)
        return fold(collected)
