"""Fixtures for the in-process Responses and Conversations API tests: the real SmolLM2 tokenizer
and chat template, the scripted generator (support.Script) in place of the engine, and the
tenant taken from an `X-Tenant` header (until auth sets request.principal)."""

import pytest

from inference.engine.tokenizer import Tokenizer

from .support import FakeRuntime, Script


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_dir) -> Tokenizer:
    return Tokenizer.from_folder(smollm2_dir)


@pytest.fixture
def script(monkeypatch, smollm2_tokenizer, db) -> Script:
    from responses_api import service, views

    s = Script()
    rt = s.rt = FakeRuntime(smollm2_tokenizer)
    monkeypatch.setattr(views, "_ready_runtime", lambda: rt)
    monkeypatch.setattr(service, "generate", s.generate)
    monkeypatch.setattr(views, "tenant_key_for",
                        lambda request: request.headers.get("X-Tenant", "default"))
    return s
