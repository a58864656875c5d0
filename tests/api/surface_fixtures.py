"""Fixtures for the chat/completions surface tests: the real SmolLM2 tokenizer behind a scripted engine."""
from __future__ import annotations

import time

import pytest

from inference import runtime
from inference.engine.tokenizer import Tokenizer
from inference.runtime import Runtime

from .fake_engine import FakeEngine, reply


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_dir) -> Tokenizer:
    return Tokenizer.from_folder(smollm2_dir)


@pytest.fixture
def fake_rt(smollm2_dir, smollm2_tokenizer, monkeypatch, raw_asgi_requests, db) -> Runtime:
    """The process runtime replaced by a FakeEngine answering "Hello world"; set `fake_rt.engine.script`
    (e.g. with fake_engine.reply) to script other answers."""
    engine = FakeEngine(smollm2_tokenizer, reply(smollm2_tokenizer, "Hello world"))
    rt = Runtime(engine, smollm2_tokenizer, "smollm2-135m-instruct", smollm2_dir, int(time.time()))
    monkeypatch.setattr(runtime, "_runtime", rt)
    monkeypatch.setattr(runtime, "start_loading", lambda: None)
    return rt
