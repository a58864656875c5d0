"""One Messages request's answer over the shared `inference.http.views.respond` flow: SSE events
with pings, or the body.

`MessagesWire` has the wire interface `respond` takes (`stream`, `frames(run)`, `body(run)`): every
frame is `event: NAME` + `data: JSON` (the SDK dispatches on the event line), `ping` right after
message_start and again after METRALE["ANTHROPIC_PING_S"] without an event (a long prompt's prefill),
no [DONE]; an error after the stream started (an engine error, a request cancelled or past its
deadline, a bug here) is an `event: error` frame in Anthropic's error shape, and the stream ends.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator

from django.conf import settings

from inference.serving.choices import Choices
from inference.serving.deltas import Error, Finish
from inference.serving.errors import ANTHROPIC, ApiError
from inference.serving.prepare import Prepared

from .encoder import MessageStream, failure, fold, new_message_id

log = logging.getLogger("metrale.anthropic")

PING = {"type": "ping"}
_TICK = object()


def sse_event(event: dict) -> bytes:
    """One event as an SSE frame: `event: <type>` then `data: <json>`."""
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {data}\n\n".encode()


def error_event(error: ApiError) -> dict:
    """The `error` event of an error after the stream started (Anthropic's error body)."""
    return ANTHROPIC.body(error.status, error.message)


async def with_ticks(source: AsyncIterator, interval_s: float) -> AsyncIterator:
    """`source`'s items, with `_TICK` whenever `interval_s` seconds pass without one. The pending
    read is cancelled (and awaited) when the consumer stops early."""
    pending: asyncio.Future | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(source))
            done, _ = await asyncio.wait({pending}, timeout=interval_s)
            if not done:
                yield _TICK
                continue
            finished, pending = pending, None
            try:
                item = finished.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending


class MessagesWire:
    """A Messages request's answer: `frames(run)` for a stream, `body(run)` for a blocking request."""

    def __init__(self, req: dict, prepared: Prepared):
        self.stream = req["stream"]
        self.warm_only = req["max_tokens"] == 0
        self.prepared = prepared

    def _message(self) -> MessageStream:
        return MessageStream(new_message_id(), self.prepared.model, self.prepared.prompt_tokens,
                             warm_only=self.warm_only)

    async def events(self, run: Choices) -> AsyncIterator[dict]:
        """The message's events (pings among them); an ApiError as the last item when it fails."""
        message = self._message()
        for event in message.start():
            yield event
        yield PING
        # Closed in this order: the pending read (with_ticks) before the merge it reads from.
        async with contextlib.aclosing(run.merged()) as merged, \
                contextlib.aclosing(with_ticks(merged, settings.METRALE["ANTHROPIC_PING_S"])) as items:
            async for item in items:
                if item is _TICK:
                    yield PING
                    continue
                _, delta = item
                if isinstance(delta, (Error, Finish)):
                    error = failure(delta)
                    if error is not None:
                        yield error
                        return
                    for event in message.end(delta, run.usage):
                        yield event
                    return
                for event in message.feed(delta):
                    yield event

    async def frames(self, run: Choices) -> AsyncIterator[bytes]:
        """SSE frames of the events; an error as an `event: error` frame that ends the stream."""
        events = self.events(run)
        async with contextlib.aclosing(events):
            try:
                async for event in events:
                    if isinstance(event, ApiError):
                        yield sse_event(error_event(event))
                        return
                    yield sse_event(event)
            except Exception as exc:  # a bug must still end the stream in Anthropic's shape
                log.exception("an Anthropic Messages stream failed")
                yield sse_event(error_event(ApiError(500, f"internal error: {exc}")))

    async def body(self, run: Choices) -> dict:
        """The blocking message (fold of the same events). Raises the request's ApiError when it fails."""
        collected = []
        async with contextlib.aclosing(self.events(run)) as events:
            async for event in events:
                if isinstance(event, ApiError):
                    raise event
                if event is not PING:
                    collected.append(event)
        return fold(collected)
