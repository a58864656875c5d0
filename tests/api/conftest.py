"""Fixtures for the API tests: tenants and keys (and the test client calling as one), the SmolLM2
tokenizer behind the scripted engine served by the process's registry (tests/api/registries.py), a
frozen rate-limit clock, and the cache backend (local memory, or the real Redis on 127.0.0.1:6379 under
a key prefix of the test's own)."""
from __future__ import annotations

import time
import uuid

import pytest

from inference.engine.tokenizer import Tokenizer
from inference.models import ApiKey, RateLimitContext, Tenant
from inference.operations.model_specs import configured_specs
from inference.operations.registry import ModelRegistry, serving
from inference.tenancy.ratelimiting import clock
from inference.operations.runtime import Runtime

from .asgi_client import request_signals_keep_the_connection
from .fake_engine import FakeEngine, reply
from .registries import FakeLoader, registry_of
from .tenant_client import TenantClient

REDIS_URL = "redis://127.0.0.1:6379/0"
EMBEDDING_MODEL = "all-minilm-l6-v2"


@pytest.fixture(autouse=True)
def no_model_loading():
    """In-process API tests never load a real model: the process's registry is one of the configured
    models whose loader refuses (a request naming one gets 503 model_load_failed). Tests that need a model
    serve a registry of their own (fake_rt, real_rt, embed_rt; tests/api/registries.registry_of)."""
    with serving(ModelRegistry(configured_specs(), FakeLoader())) as registry:
        yield registry


@pytest.fixture(autouse=True)
def no_batch_thread(monkeypatch):
    """In-process tests run a batch where they say (batch_support.run_batch), not on the server's
    batch thread, which would outlive the test's database."""
    from batches import execution

    monkeypatch.setattr(execution.embedded, "submit", lambda batch_id: None)


def redis_reachable() -> bool:
    try:
        import redis

        return bool(redis.Redis.from_url(REDIS_URL, socket_connect_timeout=0.5).ping())
    except Exception:
        return False


def use_locmem(settings):
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                                   "LOCATION": f"test-{uuid.uuid4().hex}"}}


def use_redis(settings):
    """Point the default cache at the real Redis under a fresh prefix; returns a cleanup."""
    if not redis_reachable():
        pytest.skip(f"Redis is not reachable at {REDIS_URL}")
    import redis

    prefix = f"metrale-test-{uuid.uuid4().hex}"
    settings.CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache",
                                   "LOCATION": REDIS_URL, "KEY_PREFIX": prefix}}

    def cleanup():
        client = redis.Redis.from_url(REDIS_URL)
        keys = list(client.scan_iter(match=f"{prefix}:*"))
        if keys:
            client.delete(*keys)
    return cleanup


@pytest.fixture(autouse=True)
def files_in_tmp(settings, tmp_path):
    """Uploaded and batch output files (STORAGES["files"]) go to the test's temporary folder."""
    settings.STORAGES = {**settings.STORAGES, "files": {"BACKEND": "django.core.files.storage.FileSystemStorage",
                                                       "OPTIONS": {"location": str(tmp_path / "files")}}}


@pytest.fixture(autouse=True)
def fresh_locmem(settings):
    """Every test starts with an empty local-memory cache of its own."""
    use_locmem(settings)


@pytest.fixture(params=["locmem", "redis"])
def cache_backend(request, settings):
    """Run the test once on local memory and once on the real Redis."""
    if request.param == "redis":
        cleanup = use_redis(settings)
        request.addfinalizer(cleanup)
    return request.param


@pytest.fixture
def frozen_clock(monkeypatch):
    """The rate limiter's clock, stopped; `frozen_clock.advance(seconds)` moves it."""

    class FrozenClock:
        now = 1_800_000_000.0

        def advance(self, seconds: float):
            self.now += seconds

    frozen = FrozenClock()
    monkeypatch.setattr(clock, "now", lambda: frozen.now)
    return frozen


@pytest.fixture
def require_auth(settings):
    settings.METRALE = {**settings.METRALE, "REQUIRE_AUTH": True}


@pytest.fixture
def make_tenant(db):
    """make_tenant(name, **limits) -> Tenant, with a tenant-wide RateLimitContext if limits given."""

    def make(name="acme", **limits):
        tenant = Tenant.objects.create(name=name)
        if limits:
            RateLimitContext.objects.create(tenant=tenant, **limits)
        return tenant
    return make


@pytest.fixture
def make_key(db):
    """make_key(tenant, **fields) -> (ApiKey, the full key)."""

    def make(tenant, **fields):
        key = ApiKey.objects.create(tenant=tenant, **fields)
        return key, key.new_key
    return make


@pytest.fixture
def raw_asgi_requests():
    """For a test that drives raw ASGI requests with async_to_sync itself (asgi_client.serve does
    both): the request signals keep the test's database connection for the whole test."""
    with request_signals_keep_the_connection():
        yield


@pytest.fixture
def as_tenant(client, require_auth, make_tenant, make_key):
    """as_tenant(name) -> TenantClient: a new tenant with a real API key, and the test client
    calling as it (`Authorization: Bearer <key>`, METRALE REQUIRE_AUTH on)."""

    def make(name="acme"):
        tenant = make_tenant(name)
        _, key = make_key(tenant)
        return TenantClient(client, tenant, key)
    return make


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_dir) -> Tokenizer:
    return Tokenizer.from_folder(smollm2_dir)


@pytest.fixture
def fake_rt(smollm2_dir, smollm2_tokenizer, monkeypatch, raw_asgi_requests, db) -> Runtime:
    """The process runtime replaced by a FakeEngine answering "Hello world"; set `fake_rt.engine.script`
    (e.g. with fake_engine.reply) to script other answers."""
    engine = FakeEngine(smollm2_tokenizer, reply(smollm2_tokenizer, "Hello world"))
    rt = Runtime(engine, smollm2_tokenizer, "smollm2-135m-instruct", smollm2_dir, int(time.time()))
    with serving(registry_of(rt)):
        yield rt


@pytest.fixture(scope="session")
def smollm2_engine(smollm2_dir):
    """The real SmolLM2 engine on float weights (one per test run), for in-process API tests."""
    from inference.engine.async_engine import AsyncEngine
    from inference.engine.config import EngineConfig
    from inference.engine.llm_engine import LLMEngine

    engine = AsyncEngine(LLMEngine(EngineConfig(model_path=str(smollm2_dir), kv_cache_bytes=32 << 20,
                                                max_model_len=1024, weights="model")))
    yield engine
    engine.stop()
    engine._thread.join(timeout=10)  # not mid-step when the interpreter exits


@pytest.fixture
def real_rt(smollm2_engine, smollm2_dir, smollm2_tokenizer, monkeypatch, raw_asgi_requests, db):
    """The process runtime replaced by the real SmolLM2 engine, with a chat template that opens
    `<think>` (test_chat_reasoning.THINKING_TEMPLATE), so the `think` parser reads its reasoning."""
    from .test_chat_reasoning import THINKING_TEMPLATE

    monkeypatch.setattr(smollm2_tokenizer, "chat_template", THINKING_TEMPLATE)
    rt = Runtime(smollm2_engine, smollm2_tokenizer, "smollm2-135m-instruct", smollm2_dir, int(time.time()))
    with serving(registry_of(rt)):
        yield rt


@pytest.fixture(scope="session")
def minilm_model():
    """all-MiniLM-L6-v2 (pulled where missing) as the engine's EmbeddingModel in float32."""
    from inference.engine.embedding_model import EmbeddingModel
    from tests.conftest import pulled_minilm

    return EmbeddingModel(pulled_minilm(), "float32")


@pytest.fixture
def embed_rt(smollm2_engine, smollm2_dir, smollm2_tokenizer, minilm_model, monkeypatch, raw_asgi_requests, db):
    """The process runtime: the real SmolLM2 engine with all-MiniLM-L6-v2 beside it (its runner's units on
    the engine's thread)."""
    from inference.engine.embedding_runner import EmbeddingRunner
    from inference.operations.runtime import EmbeddingService

    runner = EmbeddingRunner(minilm_model)
    smollm2_engine.attach_embeddings(runner)
    service = EmbeddingService(EMBEDDING_MODEL, minilm_model.path, int(time.time()), minilm_model, runner)
    rt = Runtime(smollm2_engine, smollm2_tokenizer, "smollm2-135m-instruct", smollm2_dir, int(time.time()))
    with serving(registry_of(rt, service)):
        yield rt
    smollm2_engine.detach_embeddings(runner)
