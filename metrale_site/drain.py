"""Graceful shutdown under daphne: on SIGTERM stop taking requests, let running work finish
within a grace period, end the rest in-band, record this process's stop, and exit 0.

What daphne and Twisted do by themselves: Twisted's reactor installs SIGTERM and SIGINT
handlers that call `reactor.stop()` at once, and daphne's "before shutdown" trigger
(Server.kill_all_applications) then cancels every connection's application task: streams are
cut mid-way, background responses are recorded as cancelled. So `install()` (called by
metrale_site/asgi.py, under daphne's asyncio reactor only) replaces those two handlers once the
reactor runs, and stops the reactor itself when the drain is over; daphne's own shutdown then
finds nothing left to cancel.

The drain (`drain()`):
1. New HTTP requests are answered 503 by `gate` (in the route's error shape, with Retry-After;
   /health answers {"status": "draining"}), so a load balancer takes this process out.
2. Requests in flight and background responses (responses_api.live) run on, for up to
   METRALE["SHUTDOWN_GRACE_S"] seconds.
3. Whatever still runs then is ended in-band by the engine (AsyncEngine.fail_all): a stream
   gets its surface's error event, a blocking request a 500, and a background response is
   recorded `failed` with the reason (not resumable: a different process would generate
   different tokens after the events already sent, so it could not continue them).
4. The heartbeat records a clean stop (batch runs stopped at step 1, batches.execution.stop_runs,
   are taken over by the next process), the engine thread stops, the reactor stops.
A second SIGINT stops at once (a developer's second Ctrl-C); a second SIGTERM changes nothing
(a process manager may signal both `manage.py serve` and its child).
"""
from __future__ import annotations

import asyncio
import json
import logging
import signal
import threading
import time

from django.conf import settings

log = logging.getLogger("metrale")

SHUTDOWN_MESSAGE = "The server is shutting down; this request was stopped before it finished."
# After the grace period, requests ended in-band get this long to record their end.
SETTLE_S = 5.0
RETRY_AFTER_S = 5

_inflight: set[asyncio.Task] = set()
_draining_since: float | None = None
_task: asyncio.Task | None = None  # the drain, once a signal started it


def draining() -> bool:
    """Whether this process has begun to shut down."""
    return _draining_since is not None


def gate(app):
    """Wrap an ASGI application: count HTTP requests in flight, and answer new ones with 503
    while draining. The URLconf is loaded here, once: a refusal words its error in the route's
    shape (its URL resolved), which must not import every view on the event loop mid-drain."""
    from django.urls import get_resolver

    get_resolver().url_patterns

    async def gated(scope, receive, send):
        if scope["type"] != "http":
            return await app(scope, receive, send)
        if draining() and scope["path"] != "/health/live":  # liveness: the process still answers
            return await _refuse(scope, send)
        task = asyncio.current_task()
        _inflight.add(task)
        try:
            return await app(scope, receive, send)
        finally:
            _inflight.discard(task)

    return gated


async def _refuse(scope, send) -> None:
    from inference.http.cors import cors_headers
    from inference.http.error_shapes import shape_for_path

    status = 503
    if scope["path"].rstrip("/") == "/health":
        body = {"status": "draining"}
    else:
        shape = shape_for_path(scope["path"])  # the route's own error shape (Anthropic's: 529)
        status = shape.status(503)
        body = shape.body(503, "The server is shutting down; retry shortly or on another server.",
                          type="server_error", code="server_shutting_down")
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
        (b"retry-after", str(RETRY_AFTER_S).encode()), (b"connection", b"close"),
        *cors_headers(scope.get("method", "GET"), scope["path"], scope.get("headers", ()))]})
    await send({"type": "http.response.body", "body": data})


def _running() -> int:
    """Requests in flight plus background responses running in this process."""
    from responses_api import live

    return len(_inflight) + len(live.running())


async def _until_idle(deadline: float) -> None:
    while _running() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


async def drain() -> None:
    """Drain this process (see the module doc); returns once nothing of it is left running or
    every bound passed. Does not stop the reactor."""
    global _draining_since
    from inference.operations import heartbeat
    from inference.operations.model_specs import CHAT
    from inference.operations.registry import process_registry
    from responses_api import live

    if _draining_since is not None:
        return
    _draining_since = time.monotonic()
    from batches.execution import stop_runs

    stop_runs()  # batch lines are not drained: the next owner of their batch runs them
    grace_s = settings.METRALE["SHUTDOWN_GRACE_S"]
    log.info("shutting down: %d request(s) and background response(s) get %.0f s to finish",
             _running(), grace_s)
    await _until_idle(_draining_since + grace_s)
    engines = [rt.engine for _, rt in process_registry().loaded_models(CHAT)]
    if _running():
        log.warning("shutting down: ending %d still running", _running())
        for engine in engines:
            engine.fail_all(SHUTDOWN_MESSAGE)
        await _until_idle(time.monotonic() + SETTLE_S)
    leftovers = [entry.task for entry in live.running() if entry.task is not None]
    for task in leftovers:  # one that never reached the engine: recorded as cancelled
        task.cancel()
    if leftovers:
        await asyncio.wait(leftovers, timeout=SETTLE_S)
    await asyncio.to_thread(heartbeat.stop)
    for engine in engines:
        await asyncio.to_thread(engine.stop)
    log.info("shut down after %.1f s", time.monotonic() - _draining_since)


def install() -> None:
    """Under daphne (Twisted's asyncio reactor in this process's main thread): once the reactor
    runs, SIGTERM and SIGINT drain this process and then stop the reactor. Elsewhere (tests,
    another ASGI server) a no-op."""
    import sys

    reactor = sys.modules.get("twisted.internet.reactor")
    if getattr(reactor, "_asyncioEventloop", None) is None:
        return
    if threading.current_thread() is not threading.main_thread():
        return
    reactor.callWhenRunning(_take_signals, reactor)


def _take_signals(reactor) -> None:
    def on_signal(signum, _frame):
        reactor.callFromThread(_on_signal, reactor, signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def _on_signal(reactor, signum: int) -> None:
    global _task
    if not draining():
        log.info("received %s", signal.Signals(signum).name)
        _task = asyncio.ensure_future(drain(), loop=reactor._asyncioEventloop)
        _task.add_done_callback(lambda task: _stop(reactor, task))
    elif signum == signal.SIGINT:
        log.warning("received SIGINT again: stopping now")
        _stop(reactor, None)


def _stop(reactor, task: asyncio.Task | None) -> None:
    if task is not None and not task.cancelled() and task.exception() is not None:
        log.error("draining failed", exc_info=task.exception())
    if reactor.running:
        reactor.stop()

