"""A small request hops to no thread (metrale_site/asgi_handler.py, serving/prepare.light_work): /health/live,
a one-text embeddings request and a short chat completion run on the event loop from the first byte to the
last; a request whose code runs sync code on its thread is closed there, as Django closes it."""
from __future__ import annotations

import asyncio
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from asgiref.sync import SyncToAsync
from django.core import signals
from django.core.cache import close_caches
from django.core.handlers.base import reset_urlconf
from django.db import close_old_connections, reset_queries

from inference.operations.registry import serving
from inference.tenancy import recent
from metrale_site.asgi_handler import AsyncRequestHandler

from .asgi_client import AsgiRequest, request_signals_keep_the_connection, serve
from .conftest import EMBEDDING_MODEL
from .registries import registry_of

# Every receiver the handler may run on the event loop (asgi_handler.py's rule): Django's own, which touch
# only the calling thread's database connections and the request's context-local state.
KNOWN = {signals.request_started: {reset_queries, close_old_connections},
         signals.request_finished: {close_old_connections, close_caches, reset_urlconf}}


def test_it_knows_every_receiver_of_the_request_signals():
    for signal, known in KNOWN.items():
        sync_receivers, async_receivers = signal._live_receivers(AsyncRequestHandler)
        assert not async_receivers
        assert set(sync_receivers) <= known, set(sync_receivers) - known


class Hops:
    """Counts, while installed, the calls that would move work off the event loop: sync_to_async,
    an executor's submit (run_in_executor, the prepare pool) and a new Python thread."""

    def __init__(self):
        self.monkeypatch = pytest.MonkeyPatch()
        self.seen: list[str] = []

    def install(self):
        for owner, name in ((SyncToAsync, "__call__"), (ThreadPoolExecutor, "submit"), (threading.Thread, "start")):
            real = getattr(owner, name)

            def counted(*args, _real=real, _name=f"{owner.__name__}.{name}", **kwargs):
                self.seen.append(_name)
                return _real(*args, **kwargs)
            self.monkeypatch.setattr(owner, name, counted)

    def remove(self):
        self.monkeypatch.undo()


@pytest.fixture
def embeddings_beside(fake_rt, minilm_model):
    """fake_rt's chat model and all-MiniLM-L6-v2 on its runner's own thread, served by one registry."""
    from inference.engine.embedding_runner import EmbeddingRunner
    from inference.operations.runtime import EmbeddingService

    runner = EmbeddingRunner(minilm_model)
    runner.start_thread()
    service = EmbeddingService(EMBEDDING_MODEL, minilm_model.path, int(time.time()), minilm_model, runner)
    with serving(registry_of(fake_rt, service)):
        yield fake_rt
    runner.stop()


def post(path: str, payload: dict) -> AsgiRequest:
    data = json.dumps(payload).encode()
    return AsgiRequest("POST", path, {"content-type": "application/json", "content-length": str(len(data))}, data)


def test_small_requests_run_on_the_event_loop_alone(embeddings_beside, monkeypatch):
    rt = embeddings_beside
    # The tenant row is read again (through the ORM's thread) once a second: not within this test.
    monkeypatch.setattr(recent, "TTL_S", 600.0)
    requests = {
        "health": lambda: AsgiRequest("GET", "/health/live"),
        "embeddings": lambda: post("/v1/embeddings", {"model": EMBEDDING_MODEL, "input": "The quick brown fox."}),
        "chat": lambda: post("/v1/chat/completions", {"model": rt.model_id, "max_tokens": 1,
                                                      "messages": [{"role": "user", "content": "Hi"}]}),
    }
    hops = Hops()

    async def scenario():
        for make in requests.values():  # first use: the tenant row remembered, lazy set-ups made
            answer = await make().start()
            await answer.read_all()
        hops.install()
        try:
            for name, make in requests.items():
                answer = await make().start()
                await answer.read_all()
                assert answer.status == 200, name
                assert hops.seen == [], (name, hops.seen)
        finally:
            hops.remove()

    serve(scenario)


@pytest.mark.urls("tests.api.thread_urls")
def test_request_finished_runs_where_the_requests_sync_code_ran(db):
    """Under asyncio.run (no parent thread, as under daphne): a request that ran no sync code finishes on the
    loop's thread; one that did, on the thread its sync code ran on (Django's per-request thread)."""
    finished_on: list[int] = []

    def record(**kwargs):
        finished_on.append(threading.get_ident())

    async def one(path: str) -> int:
        answer = await AsgiRequest("GET", path, app=AsyncRequestHandler()).start()
        body = json.loads(await answer.read_all())
        assert answer.status == 200
        return body["thread"]

    signals.request_finished.connect(record)
    try:
        with request_signals_keep_the_connection():  # the test's own connection stays open
            loop_thread, view_thread = asyncio.run(one("/probe/loop")), threading.get_ident()
            sync_thread = asyncio.run(one("/probe/thread"))
    finally:
        signals.request_finished.disconnect(record)
    assert loop_thread == view_thread == finished_on[0]
    assert sync_thread != view_thread and finished_on[1] == sync_thread
