"""The HTTP request being served, as context variables: its id for every log line, its record for the request log.

`observe.ObservedRequests` sets both when a request arrives; asyncio tasks and asgiref's
thread hops copy them, and `in_request_context` carries them onto the prepare pool's threads.
`RequestIdFilter` puts the id on every log record (`%(request_id)s`, "-" outside a request);
`ClientFaultFilter` keeps a client's refused request to one line.
No Django: serving reads `current_record` to report what it generated.
"""
from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable

request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("metrale_request_id", default=None)
# The request log's record of this request (request_log.RequestRecord), None when nothing records it.
current_record: contextvars.ContextVar[object | None] = contextvars.ContextVar("metrale_request_record",
                                                                              default=None)


class RequestIdFilter(logging.Filter):
    """Adds `request_id` (the current request's x-request-id, else "-") to every record it sees;
    installed on the console handler (settings.LOGGING), so every line of a request names it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = request_id.get() or "-"
        return True


class ClientFaultFilter(logging.Filter):
    """Drops the traceback from Django's `django.security.*` records (a Host not in ALLOWED_HOSTS, a suspicious
    request): the client's fault, said in the record's one line; Django logs each with its exception's traceback,
    so anyone could fill the log with them. Installed on the console handler (settings.LOGGING)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("django.security."):
            record.exc_info, record.exc_text = None, None
        return True


def note_tenant(name: str) -> None:
    """The request's caller is tenant `name` (for its request log record, if it has one)."""
    record = current_record.get()
    if record is not None:
        record.tenant = name


def in_request_context(fn: Callable) -> Callable:
    """`fn` bound to a copy of the caller's context (for a thread pool, which does not copy it)."""
    context = contextvars.copy_context()
    return lambda *args: context.run(fn, *args)
