"""ASGI entry point: a channels ProtocolTypeRouter whose `http` is Django's ASGI app (asgi_handler.py) inside the API's ASGI
guard (inference.http.middleware.ApiAsgiGuard: body size limit, JSON errors, every response ended) inside
inference.http.observe.ObservedRequests (request id, request log, HTTP metrics), whose `websocket` is the
live dashboard (inference/routing.py), and the two rules daphne's HTTP layer needs before any
application sees a request (LimitedRequest).

Starting the server (daphne imports this module) also starts loading the model in
a background thread, so `/health` answers 503 "loading" until it is ready, and under daphne
makes SIGTERM drain the process (metrale_site/drain.py).
"""
import gc
import json
import os
import sys

import django
from channels.routing import ProtocolTypeRouter

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "metrale_site.settings")

# Django's ASGI application as get_asgi_application() makes it, with the handler that makes no thread for
# a request that needs none (asgi_handler.py).
django.setup(set_prefix=False)

from .asgi_handler import AsyncRequestHandler  # noqa: E402

django_asgi_app = AsyncRequestHandler()

# The engine thread gives the GIL up around every torch op and kernel call and needs it back at
# once while this process's event loop serves the streams; CPython lets a waiting thread wait
# up to the switch interval (5 ms by default) before the holder must yield. At 0.5 ms, 32
# streams through HTTP gave 236 tok/s vs 229 (mean of 3 interleaved runs each; SmolLM2, 2 vCPUs).
sys.setswitchinterval(0.0005)

from daphne import http_protocol  # noqa: E402
from django.conf import settings  # noqa: E402

from inference.operations import runtime  # noqa: E402
from inference.http.cors import cors_headers  # noqa: E402
from inference.http.middleware import ApiAsgiGuard, body_limit_bytes, request_id_from  # noqa: E402
from inference.http.error_shapes import shape_for_path  # noqa: E402

from . import spooled_body  # noqa: E402


class LimitedRequest(http_protocol.WebRequest):
    """daphne's request with the body limit applied where the body arrives, and form bodies left alone.

    twisted (under daphne) spools a whole body to a temporary file before daphne hands any of it to
    the application, then daphne queues all of it at once in 8 KiB messages (a 256 MiB chunked body
    cost +247 MB of RSS). Here a body over its limit (middleware.body_limit_bytes), by its Content-Length or
    as its chunks are counted, is dropped as it arrives (nothing is kept) and answered with a 413 in
    the route's error shape (inference.http.error_shapes) once the client has sent it (a client still sending would see a reset instead),
    (with the CORS headers of every answer of its path: inference.http.cors)
    or at once, before any of it is sent, when the client asked `Expect: 100-continue`; then the
    connection closes. A body twisted spooled to a file reaches the application as it reads it
    (spooled_body.py), not queued whole. And twisted parses multipart and urlencoded POST bodies itself,
    answering one it cannot parse with a bare `400` and no body: the application reads bodies here.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._parsePOSTFormSubmission = False
        self._limit = settings.METRALE["MAX_REQUEST_BYTES"]
        self._body_bytes = 0
        self._refused = False
        self._answered = False

    def gotLength(self, length):
        # The request line is parsed (the channel's) but not yet this request's own fields.
        path = getattr(self.channel, "_path", b"").split(b"?", 1)[0]
        self._limit = limit = body_limit_bytes(path.decode("latin-1"))
        if length is not None and length > limit:
            self._refused = True
            length = 0  # an empty in-memory body, not a spool file
            if (self.requestHeaders.getRawHeaders(b"expect") or [b""])[0].lower() == b"100-continue":
                # The client waits to be told to send: refuse now (no `100 Continue`), and it never does.
                self.requestHeaders.removeHeader(b"expect")
                super().gotLength(length)
                # The request line is parsed before the headers: its path is the channel's until the body is in.
                return self._answer_too_large(getattr(self.channel, "_path", b""))
        super().gotLength(length)

    def handleContentChunk(self, data):
        if self._refused:
            return
        self._body_bytes += len(data)
        if self._body_bytes > self._limit:
            self._refused = True
            self.content.seek(0)
            self.content.truncate()
            return
        super().handleContentChunk(data)

    def requestReceived(self, command, path, version):
        if not self._refused:
            return super().requestReceived(command, path, version)
        self._answer_too_large(path)

    def process(self):
        if spooled_body.is_spooled(self.content):  # fed as the application reads, not queued whole
            spooled_body.hand_over(self)
        return super().process()

    def _answer_too_large(self, path: bytes):
        if self._answered or self.channel is None:  # answered already (Expect: 100-continue)
            return
        self._answered = True
        limit = self._limit
        request_id = request_id_from(None)
        body = json.dumps(shape_for_path(path.split(b"?")[0].decode("latin-1")).body(
            413, f"The request body is more than {limit} bytes; this server accepts at most {limit} bytes.",
            code="request_too_large", request_id=request_id)).encode()
        cors = cors_headers(getattr(self.channel, "_command", b"POST").decode("latin-1"),
                            path.split(b"?")[0].decode("latin-1"),
                            [(name, value) for name, values in self.requestHeaders.getAllRawHeaders()
                             for value in values])
        head = (b"HTTP/1.1 413 Request Entity Too Large\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\nx-request-id: %s\r\nrequest-id: %s\r\n%sConnection: close\r\n\r\n"
                % (len(body), request_id.encode(), request_id.encode(),
                   b"".join(b"%s: %s\r\n" % header for header in cors)))
        self.channel.transport.write(head + body)
        self.channel.loseConnection()


# daphne's HTTPFactory builds each connection's requests from this module-level name.
http_protocol.WebRequest = LimitedRequest

# The modules every model load imports (torch with them), imported here so that they are in place before the line
# below. Everything imported so far (Django, DRF, torch, this project's modules: about 250,000 objects the cyclic
# collector tracks) lives as long as the process: kept out of the collector's reach (gc.freeze), a full collection
# scans only what came later. Without it each full collection walked them all (about 220 ms holding the GIL on the
# 2-vCPU EPYC: every stream and request of the process waited), and under 32 clients one came every few seconds:
# requests in flight outlive two young collections, so their objects reach the oldest generation, whose count of
# arrivals sets the next full collection off. With it a full collection walks some 40,000 objects, not 300,000:
# shorter pauses that come more often (the collector's total time about the same: 32 clients of one embedding text
# 1.8% faster, within that VM's noise). Models load after this line: their objects (which an unload must free) stay
# collectable.
from inference.engine import async_engine, embedding_model, llm_engine  # noqa: E402, F401

gc.collect()
gc.freeze()

if settings.METRALE["LOAD_ON_START"]:
    runtime.start_loading()

from . import drain  # noqa: E402

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from daphne import cli as daphne_cli  # noqa: E402

from inference.operations import replica  # noqa: E402
from inference.http.observe import ObservedRequests, QuietScrapesAccessLog  # noqa: E402
from inference.routing import websocket_urlpatterns  # noqa: E402

# daphne builds its access log from this name after loading the application: /metrics scrapes stay out.
daphne_cli.AccessLogGenerator = QuietScrapesAccessLog

# SIGTERM drains (drain.py): requests in flight finish, new ones are answered 503. Every HTTP
# request gets its id, log record and metrics (ObservedRequests); websockets (the dashboard) need
# a staff session from this site's own origin; the first request starts this replica's agent.
application = drain.gate(replica.started(ProtocolTypeRouter({
    "http": ObservedRequests(ApiAsgiGuard(django_asgi_app)),
    "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
})))
drain.install()
