"""Responses being generated in this process: their events so far, for followers to tail.

A background response publishes every event here as it is made (and writes it to the
database in batches); GET /v1/responses/{id}?stream=true follows the live copy while the
response runs in this process, and reads the database otherwise.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator


class LiveResponse:
    """The events of one running response; `events[i]["sequence_number"] == i`.

    Publishing happens on the server's event loop; a follower may wait on any loop (its
    wake-up is posted with call_soon_threadsafe).
    """

    def __init__(self, response_id: str):
        self.id = response_id
        self.events: list[dict] = []
        self.done = False
        self.task: asyncio.Task | None = None
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    def publish(self, event: dict) -> None:
        self.events.append(event)
        self._wake()

    def finish(self) -> None:
        self.done = True
        self._wake()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for loop, event in waiters:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # that follower's loop has closed
                pass

    async def follow(self, starting_after: int = -1) -> AsyncIterator[dict]:
        """Every event with sequence_number > starting_after, waiting for new ones until the
        response ends."""
        i = starting_after + 1
        while True:
            while i < len(self.events):
                yield self.events[i]
                i += 1
            if self.done:
                return
            woken = asyncio.Event()
            self._waiters.append((asyncio.get_running_loop(), woken))
            if i < len(self.events) or self.done:
                continue
            await woken.wait()


_running: dict[str, LiveResponse] = {}


def register(response_id: str) -> LiveResponse:
    """A new live entry for a response that starts running in this process."""
    live = LiveResponse(response_id)
    _running[response_id] = live
    return live


def get(response_id: str) -> LiveResponse | None:
    """The live entry of a response running in this process, or None."""
    return _running.get(response_id)


def unregister(response_id: str) -> None:
    _running.pop(response_id, None)


def running() -> list[LiveResponse]:
    """The responses running in this process now."""
    return list(_running.values())
