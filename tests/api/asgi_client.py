"""A hand-driven ASGI request against the site's Django handler (metrale_site/asgi_handler.py) inside the
API's ASGI guard (as metrale_site/asgi.py serves it): read a stream chunk by chunk, and disconnect in the
middle, as a client that goes away does; `serve` runs such requests inside the test's database
transaction, as Django's test client runs its own."""
from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit

from asgiref.sync import async_to_sync
from django.core import signals
from django.db import close_old_connections
from django.test.signals import setting_changed

from inference.http.middleware import ApiAsgiGuard
from metrale_site.asgi_handler import AsyncRequestHandler


_handler: AsyncRequestHandler | None = None


def site_handler() -> AsyncRequestHandler:
    """The site's Django handler, built once and built again after any settings change (a test's
    `settings` fixture or override_settings may change the middleware): building one loads the middleware,
    whose WhiteNoise walks every static file, 4-20 ms a request when each request built its own."""
    global _handler
    if _handler is None:
        _handler = AsyncRequestHandler()
    return _handler


def _forget_handler(**kwargs) -> None:
    global _handler
    _handler = None


setting_changed.connect(_forget_handler)


class AsgiRequest:
    def __init__(self, method: str, url: str, headers: dict[str, str] | None = None,
                 body: bytes = b"", send_buffer: int = 0, app=None):
        """send_buffer: how many messages the server may send ahead of the reader (0: any);
        a small one makes the server wait in `send`, as it does for a slow client. app: the ASGI
        application (default: the site's Django handler inside ApiAsgiGuard)."""
        self.app = app
        parts = urlsplit(url)
        self.scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": method, "scheme": "http", "path": parts.path, "raw_path": parts.path.encode(),
            "query_string": parts.query.encode(), "root_path": "",
            "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
            "client": ("127.0.0.1", 40000), "server": ("testserver", 80),
        }
        self.body = body
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.outbox: asyncio.Queue = asyncio.Queue(maxsize=send_buffer)
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self.task: asyncio.Task | None = None
        self.finished = False

    async def start(self, timeout_s: float = 10.0) -> "AsgiRequest":
        """Send the request and wait for the response's status and headers."""
        await self.inbox.put({"type": "http.request", "body": self.body, "more_body": False})
        app = self.app or ApiAsgiGuard(site_handler())
        self.task = asyncio.create_task(app(self.scope, self.inbox.get, self.outbox.put))
        message = await asyncio.wait_for(self.outbox.get(), timeout_s)
        assert message["type"] == "http.response.start", message
        self.status = message["status"]
        self.headers = {k.decode().lower(): v.decode() for k, v in message["headers"]}
        return self

    async def chunk(self, timeout_s: float = 10.0) -> bytes:
        """The next body chunk (b"" once the body has ended)."""
        if self.finished:
            return b""
        message = await asyncio.wait_for(self.outbox.get(), timeout_s)
        assert message["type"] == "http.response.body", message
        if not message.get("more_body", False):
            self.finished = True
        return message.get("body", b"")

    async def read_all(self, timeout_s: float = 10.0) -> bytes:
        body = b""
        while not self.finished:
            body += await self.chunk(timeout_s)
        await asyncio.wait_for(self.task, timeout_s)
        return body

    async def disconnect(self, timeout_s: float = 10.0) -> None:
        """Go away mid-response and wait until the server has finished with the request."""
        await self.inbox.put({"type": "http.disconnect"})
        await asyncio.wait_for(self.task, timeout_s)


_holds = 0


@contextlib.contextmanager
def request_signals_keep_the_connection():
    """Hold off close_old_connections on request_started / request_finished (as Django's test client
    does around each request): it would close the test's connection, inside its transaction. Nests."""
    global _holds
    if _holds == 0:
        signals.request_started.disconnect(close_old_connections)
        signals.request_finished.disconnect(close_old_connections)
    _holds += 1
    try:
        yield
    finally:
        _holds -= 1
        if _holds == 0:
            signals.request_started.connect(close_old_connections)
            signals.request_finished.connect(close_old_connections)


def serve(scenario, *args, **kwargs):
    """Run the async function `scenario` (raw ASGI requests, websocket communicators) from this thread
    through async_to_sync, as Django's test client runs a request: Django's thread-sensitive work
    (sync_to_async: the ORM of middleware and views) then runs on this thread, in the test's own
    connection and transaction, so what the requests write is rolled back with the test (under
    asyncio.run it ran on asgiref's executor thread, on a connection of its own, committed and left
    for the tests after). Returns what `scenario` returns."""
    with request_signals_keep_the_connection():
        return async_to_sync(scenario)(*args, **kwargs)
