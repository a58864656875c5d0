"""Django's ASGI handler without a thread for a request whose own code never needs one.

Django's ASGIHandler serves each request inside an asgiref ThreadSensitiveContext: the request's sync
code (the ORM through sync_to_async, a sync middleware hook) runs on a thread made for that request at
its first such call, and the context joins it at the end through one more new thread. The handler
itself makes two such calls for every request: the request_started signal (Django's receivers
`reset_queries` and `close_old_connections`) and `response.close()` (request_finished:
`close_old_connections`, `close_caches`, `reset_urlconf`). So even GET /health/live made two threads
and hopped to one and back twice: 1.1 of its 2.3 ms of CPU in-process, most of a small request's
path (2 vCPUs, shared).

Those receivers act on the calling thread's database connections and the request's context-local
state. The event loop's thread holds no database connection (the ORM refuses to run there), so on
the loop they find what they would find on a thread made for the request: nothing, without I/O.
Here they run inline on the loop, and `response.close()` too, until the request's code has made
its thread; from then on it closes there, as Django closes it, so request_finished closes the
connections that request opened on it. Every receiver of these signals in this process is one of
Django's, which do no blocking work on a thread without connections (tests/api/test_request_threads.py
lists them; a new one must be as light, or be sent from the request's thread).

Everything else is Django's: the body read, the disconnect watch that cancels the view, the
response sending, the request and error handling.
"""
from __future__ import annotations

import asyncio

from asgiref.sync import SyncToAsync, ThreadSensitiveContext, sync_to_async
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.urls import set_script_prefix


def made_a_thread(context: ThreadSensitiveContext) -> bool:
    """Whether sync code of `context` (an entered ThreadSensitiveContext) has run on the thread asgiref
    makes for it: asgiref keeps that thread's executor in SyncToAsync.context_to_thread_executor from
    the first thread-sensitive call until the context exits."""
    return context in SyncToAsync.context_to_thread_executor


async def send_inline(signal, sender, **named) -> None:
    """Send `signal` on the calling thread: its sync receivers called, its async ones awaited
    (Signal.asend without the hop of its sync receivers to a thread). Raises what a receiver raises."""
    sync_receivers, async_receivers = signal._live_receivers(sender)
    for receiver in sync_receivers:
        receiver(signal=signal, sender=sender, **named)
    if async_receivers:
        await asyncio.gather(*(receiver(signal=signal, sender=sender, **named) for receiver in async_receivers))


class AsyncRequestHandler(ASGIHandler):
    """ASGIHandler whose request_started and response close run on the event loop until the request's
    own code has made its thread (see the module's rule)."""

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        async with ThreadSensitiveContext() as context:
            await self.serve(context, scope, receive, send)

    async def serve(self, context: ThreadSensitiveContext, scope, receive, send) -> None:
        """Serve one HTTP request inside `context` (its ThreadSensitiveContext), as ASGIHandler.handle does."""
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))
        await send_inline(signals.request_started, self.__class__, scope=scope)
        request, error_response = self.create_request(scope, body_file)
        if request is None:
            body_file.close()
            await self.send_response(error_response, send)
            await self.close_response(context, error_response)
            return

        async def respond():
            response = await self.run_get_response(request)
            try:
                await self.send_response(response, send)
            except asyncio.CancelledError:
                pass  # the client left while the response was being sent
            return response

        # The disconnect watch first: a client that leaves cancels the view.
        watch = asyncio.create_task(self.listen_for_disconnect(receive))
        answer = asyncio.create_task(respond())
        await asyncio.wait((watch, answer), return_when=asyncio.FIRST_COMPLETED)
        for task in (watch, answer):
            if task.done():
                try:
                    task.result()
                except RequestAborted:
                    pass
                except AssertionError:
                    body_file.close()
                    raise
            else:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        try:
            response = answer.result()
        except asyncio.CancelledError:
            if made_a_thread(context):
                await signals.request_finished.asend(sender=self.__class__)
            else:
                await send_inline(signals.request_finished, self.__class__)
        else:
            await self.close_response(context, response)
        body_file.close()

    @staticmethod
    async def close_response(context: ThreadSensitiveContext, response) -> None:
        """response.close() (its resources, then request_finished): on the request's thread once it has
        one, else inline."""
        if made_a_thread(context):
            await sync_to_async(response.close)()
        else:
            response.close()
