"""The `anthropic` SDK's stream accumulator on a thinking reply from a live daphne: SmolLM2 served from a folder
whose chat_template.jinja opens `<think>` (tests/api/test_chat_reasoning.THINKING_TEMPLATE), so the reasoning
parser reads a thinking block, capped by `thinking.budget_tokens`, signed, then the text; the message sent back
as the SDK returned it is accepted, and one whose thinking was changed is refused."""
from __future__ import annotations

import pytest

from inference.bench.live_server import LiveServer
from tests.api.test_chat_reasoning import THINKING_TEMPLATE

anthropic = pytest.importorskip("anthropic")

ASK = [{"role": "user", "content": "What is 2 + 2?"}]
# SmolLM2 was not trained to think: min_tokens keeps it writing the answer after the capped block.
SAMPLING = {"temperature": 0, "min_tokens": 12}


@pytest.fixture(scope="module")
def thinking_server(smollm2_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("thinking-model") / "smollm2-thinking"
    folder.mkdir()
    for item in smollm2_dir.iterdir():
        (folder / item.name).symlink_to(item)
    (folder / "chat_template.jinja").write_text(THINKING_TEMPLATE)
    server = LiveServer({"METRALE_MODEL": str(folder), "METRALE_KV_CACHE_BYTES": str(64 << 20)},
                        tmp_path_factory.mktemp("live-thinking"))
    try:
        server.wait_ready()
    except BaseException:
        server.stop()
        raise
    yield server
    server.stop()


def test_a_thinking_reply_through_the_stream_accumulator(thinking_server):
    client = anthropic.Anthropic(base_url=thinking_server.url, api_key="k", max_retries=0, timeout=120)
    kwargs = {"model": "smollm2-thinking", "max_tokens": 24, "messages": ASK,
              "thinking": {"type": "enabled", "budget_tokens": 3},
              "extra_body": SAMPLING}
    with client.messages.stream(**kwargs) as stream:
        message = stream.get_final_message()
    assert [b.type for b in message.content] == ["thinking", "text"]
    thinking, text = message.content
    assert thinking.thinking and thinking.signature and text.text
    created = client.messages.create(**kwargs)  # greedy: the blocking answer is the same message
    assert [b.model_dump(include={"type", "text", "thinking", "signature"}) for b in created.content] == \
        [b.model_dump(include={"type", "text", "thinking", "signature"}) for b in message.content]
    history = [*ASK, {"role": "assistant", "content": [b.model_dump(include={"type", "text", "thinking", "signature"})
                                                      for b in message.content]},
               {"role": "user", "content": "And 3 + 3?"}]
    follow_up = client.messages.create(model="smollm2-thinking", max_tokens=4, messages=history,
                                       thinking={"type": "disabled"})
    assert follow_up.stop_reason in ("end_turn", "max_tokens")
    history[1]["content"][0]["thinking"] += " (edited)"
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model="smollm2-thinking", max_tokens=4, messages=history)
    assert "signature" in str(refused.value)
