"""The real Gemma 3 270M (pull_model's folder: its GGUF blocks, Gemma's turn format) served by a live daphne,
through the official openai and anthropic SDKs: chat blocking and streamed agree, the prompt is the chat
template's tokens, legacy completions start with <bos>, and Messages create / stream agree. Skips with the
reason when the model is not pulled (`manage.py pull_model gemma-3-270m`)."""
from __future__ import annotations

import pytest

from inference.bench.live_server import LiveServer

pytestmark = pytest.mark.e2e

MODEL = "gemma-3-270m"
ASK = [{"role": "system", "content": "Answer in one short sentence."},
       {"role": "user", "content": "What colour is the sky on a clear day?"}]


@pytest.fixture(scope="module")
def gemma_server(gemma3_dir, tmp_path_factory):
    server = LiveServer({"METRALE_MODEL": str(gemma3_dir), "METRALE_KV_CACHE_BYTES": str(64 << 20)},
                        tmp_path_factory.mktemp("live-gemma"))
    try:
        server.wait_ready()
    except BaseException:
        server.stop()
        raise
    yield server
    server.stop()


@pytest.fixture(scope="module")
def tokenizer(gemma3_dir):
    from inference.engine.tokenizer import Tokenizer

    return Tokenizer.from_folder(gemma3_dir)


@pytest.fixture(scope="module")
def openai_gemma(gemma_server):
    from openai import OpenAI

    return OpenAI(base_url=gemma_server.url + "/v1", api_key="test-key", max_retries=0, timeout=120)


def test_openai_chat_blocking_and_streamed_agree(openai_gemma, tokenizer):
    kw = dict(model=MODEL, messages=ASK, max_tokens=24, temperature=0)
    blocking = openai_gemma.chat.completions.create(**kw)
    choice = blocking.choices[0]
    assert choice.finish_reason in ("stop", "length") and choice.message.content
    assert "<end_of_turn>" not in choice.message.content and "<start_of_turn>" not in choice.message.content
    assert blocking.usage.prompt_tokens == len(tokenizer.encode_chat(ASK))
    chunks = list(openai_gemma.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == choice.message.content
    assert chunks[-1].usage.completion_tokens == blocking.usage.completion_tokens
    models = [m.id for m in openai_gemma.models.list().data]
    assert MODEL in models


def test_openai_completions_put_bos_first(openai_gemma, tokenizer):
    prompt = "The three primary colours are"
    resp = openai_gemma.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
    assert resp.usage.prompt_tokens == len(tokenizer.encode(prompt)) + 1  # <bos> (add_bos_token)
    assert resp.choices[0].text and resp.usage.completion_tokens <= 8


def test_anthropic_messages_create_and_stream_agree(gemma_server):
    anthropic = pytest.importorskip("anthropic")
    client = anthropic.Anthropic(base_url=gemma_server.url, api_key="any-key", max_retries=0, timeout=120)
    kwargs = {"model": MODEL, "max_tokens": 24, "system": ASK[0]["content"], "messages": ASK[1:],
              "extra_body": {"temperature": 0}}
    created = client.messages.create(**kwargs)
    with client.messages.stream(**kwargs) as stream:
        final = stream.get_final_message()
    text = "".join(b.text for b in created.content if b.type == "text")
    assert text and text == "".join(b.text for b in final.content if b.type == "text")
    assert created.stop_reason in ("end_turn", "max_tokens") and created.stop_reason == final.stop_reason
    assert created.usage.output_tokens == final.usage.output_tokens
    count = client.messages.count_tokens(model=MODEL, system=ASK[0]["content"], messages=ASK[1:])
    usage = created.usage  # Anthropic's split: the prefix cache's tokens apart
    assert count.input_tokens == (usage.input_tokens + (usage.cache_read_input_tokens or 0)
                                  + (usage.cache_creation_input_tokens or 0))
