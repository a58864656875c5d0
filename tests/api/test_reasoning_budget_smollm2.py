"""The thinking budget on the real SmolLM2 engine in-process: a template that opens `<think>`, the `think`
parser, and `thinking_token_budget` make the engine's sampler force `</think>` after N reasoning tokens."""
import time

import pytest

from inference import runtime
from inference.engine.async_engine import AsyncEngine
from inference.engine.config import EngineConfig
from inference.engine.llm_engine import LLMEngine
from inference.runtime import Runtime

from .fake_engine import call
from .test_chat_reasoning import THINKING_TEMPLATE

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2_engine(smollm2_dir):
    engine = AsyncEngine(LLMEngine(EngineConfig(model_path=str(smollm2_dir), kv_cache_bytes=32 << 20,
                                                max_model_len=1024, decode_weights="model",
                                                prefill_weights="model")))
    yield engine
    engine.stop()
    engine._thread.join(timeout=10)  # not mid-step when the interpreter exits


@pytest.fixture
def real_rt(smollm2_engine, smollm2_dir, smollm2_tokenizer, monkeypatch, raw_asgi_requests, db):
    monkeypatch.setattr(smollm2_tokenizer, "chat_template", THINKING_TEMPLATE)
    rt = Runtime(smollm2_engine, smollm2_tokenizer, "smollm2-135m-instruct", smollm2_dir, int(time.time()))
    monkeypatch.setattr(runtime, "_runtime", rt)
    return rt


def test_smollm2_reasoning_is_closed_by_the_engine_after_the_budget(real_rt):
    body = call("POST", "/v1/chat/completions", {
        "model": "m", "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "thinking_token_budget": 5, "max_tokens": 16, "temperature": 0, "ignore_eos": True}).json()
    message = body["choices"][0]["message"]
    close = real_rt.tokenizer.encode("</think>")
    # 5 free tokens, then the forced close tag (whose tokens count as reasoning too).
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 5 + len(close)
    assert message["reasoning_content"] and "</think>" not in message["reasoning_content"]
    assert message["content"] and "</think>" not in message["content"]
    assert body["usage"]["completion_tokens"] == 16
