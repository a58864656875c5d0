"""Thinking on the real SmolLM2 engine through /v1/messages, with a chat template that opens `<think>`
(tests/api/conftest.py real_rt): the budget's cap closes the block, and the message is a signed thinking
block first, then text; the stream carries the same blocks."""
from anthropic_api import signatures
from anthropic_api.encoder import fold

from .support import check_event_order, messages, sse_frames

# SmolLM2 was not trained to think: after the forced close tag it would end the turn at once, so
# min_tokens (a sampling extension Messages accepts) keeps it writing the answer.
BODY = {"max_tokens": 24, "thinking": {"type": "enabled", "budget_tokens": 3}, "temperature": 0, "min_tokens": 12,
        "messages": [{"role": "user", "content": "What is 2 + 2?"}]}


def test_a_thinking_block_comes_first_with_its_signature_then_text(real_rt):
    body = messages(**BODY).json()
    thinking, *rest = body["content"]
    assert thinking["type"] == "thinking" and thinking["thinking"]
    assert signatures.verifies(thinking["thinking"], thinking["signature"])
    assert [b["type"] for b in rest] == ["text"] and rest[0]["text"]
    assert body["stop_reason"] in ("end_turn", "max_tokens")
    frames = sse_frames(messages(stream=True, **BODY))
    check_event_order(frames)
    streamed = fold([d for n, d in frames if n != "ping"])
    assert streamed["content"] == body["content"]
    # Sent back as returned, the block is accepted (its signature verifies).
    follow_up = [*BODY["messages"], {"role": "assistant", "content": body["content"]},
                 {"role": "user", "content": "And 3 + 3?"}]
    assert messages(**{**BODY, "max_tokens": 4, "min_tokens": 0, "thinking": {"type": "disabled"}, "messages": follow_up}).status == 200
