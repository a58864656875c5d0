"""Fixtures for the fuzz suite: the API tests' own (no model loading, a fresh cache, raw ASGI requests in the
test's transaction, the scripted engine)."""
from tests.api.conftest import fresh_locmem, no_model_loading, raw_asgi_requests  # noqa: F401
from tests.api.surface_fixtures import fake_rt, smollm2_tokenizer  # noqa: F401
