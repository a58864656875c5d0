"""A large request body handed to the application from twisted's spool file as the application reads it, not queued whole.

twisted writes a body of 100,000 bytes or more to a temporary file as it arrives; daphne then
reads all of it into the application's queue at once, in `request_buffer_size` messages, before
the application has read any (a 150 MB upload cost +154 MB of RSS). `hand_over(request)`, called
by metrale_site/asgi.py's LimitedRequest before daphne's `process`, gives daphne an empty view of
that file to queue and instead feeds the file's chunks to the application's queue a few at a
time, as it empties; Django then spools what it reads to its own temporary file (FILE_UPLOAD_*
settings), so an upload of METRALE["MAX_FILE_BYTES"] goes from disk to disk.
"""
from __future__ import annotations

import asyncio
import io

CHUNK_BYTES = 64 << 10
AHEAD = 4  # messages queued ahead of the application
WAIT_S = 0.002


class _EmptyView:
    """What daphne reads instead of the spool file: nothing (one empty message, which the feeder
    replaces); closing it closes the file, as twisted does when the request ends."""

    def __init__(self, spool):
        self.spool = spool

    def seek(self, *args):
        return 0

    def read(self, *args):
        return b""

    @property
    def closed(self):
        return self.spool.closed

    def close(self):
        self.spool.close()


class _Server:
    """daphne's server seen by one request: its application's queue is fed by `feed`."""

    def __init__(self, server, request, spool):
        self._server, self._request, self._spool = server, request, spool

    def __getattr__(self, name):
        return getattr(self._server, name)

    def create_application(self, protocol, scope):
        queue = self._server.create_application(protocol, scope)
        if queue is None:
            return None
        put = queue.put_nowait
        started = False

        def put_nowait(message):
            nonlocal started
            if message.get("type") == "http.request" and not started:
                started = True  # daphne's one empty message: the file's chunks go instead
                asyncio.ensure_future(_feed(self._request, self._spool, queue, put))
                return
            put(message)
        queue.put_nowait = put_nowait
        return queue


def is_spooled(content) -> bool:
    """Whether twisted spooled the body to a file (a declared length under 100,000 bytes stays in a BytesIO,
    which has a `fileno` method too: daphne queues such a body whole, as it is small)."""
    return content is not None and hasattr(content, "fileno") and not isinstance(content, io.BytesIO)


def hand_over(request) -> None:
    """Make daphne's `process` of `request` (a daphne WebRequest whose body twisted spooled)
    feed the application from the spool file as it reads, instead of queueing all of it."""
    spool = request.content
    request.content = _EmptyView(spool)
    request.server = _Server(request.server, request, spool)


async def _feed(request, spool, queue: asyncio.Queue, put) -> None:
    """Put the spool file's chunks into the application's queue, at most AHEAD waiting at once,
    until the last one (more_body false), the response ended, or the client left. An answer given before the
    body was wanted (the ASGI guard's 413 or 415) may have ended the request, and twisted closed the file, before
    this first runs."""
    if request.finished or request._disconnected or spool.closed:
        return
    spool.seek(0)
    while True:
        while queue.qsize() >= AHEAD:
            if request.finished or request._disconnected:
                return
            await asyncio.sleep(WAIT_S)
        if request.finished or request._disconnected or spool.closed:
            return
        data = spool.read(CHUNK_BYTES)
        more = len(data) == CHUNK_BYTES and spool.read(1) != b""
        if more:
            spool.seek(-1, 1)
        put({"type": "http.request", "body": data, "more_body": more})
        if not more:
            return
