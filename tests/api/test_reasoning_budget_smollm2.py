"""The thinking budget on the real SmolLM2 engine in-process: a template that opens `<think>`, the `think`
parser, and `thinking_token_budget` make the engine's sampler force `</think>` after N reasoning tokens."""
import pytest

from .fake_engine import call

pytestmark = pytest.mark.slow


def test_smollm2_reasoning_is_closed_by_the_engine_after_the_budget(real_rt):
    body = call("POST", "/v1/chat/completions", {
        "model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "thinking_token_budget": 5, "max_tokens": 16, "temperature": 0, "ignore_eos": True}).json()
    message = body["choices"][0]["message"]
    close = real_rt.tokenizer.encode("</think>")
    # 5 free tokens, then the forced close tag (whose tokens count as reasoning too).
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 5 + len(close)
    assert message["reasoning_content"] and "</think>" not in message["reasoning_content"]
    assert message["content"] and "</think>" not in message["content"]
    assert body["usage"]["completion_tokens"] == 16
