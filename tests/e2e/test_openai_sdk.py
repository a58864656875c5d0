"""The official openai SDK against a live daphne serving SmolLM2: chat (n, logprobs, the stream helper),
legacy completions with echo and logprobs, stored completions, the error classes, and seeded batching."""
import math
import re
import threading

import httpx
import openai
import pytest

pytestmark = pytest.mark.e2e

MODEL = "smollm2-135m-instruct"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_chat_n2_with_logprobs_blocking_and_streaming_agree(openai_client):
    kw = dict(model=MODEL, messages=QUESTION, n=2, max_tokens=8, temperature=0.9, seed=11, logprobs=True,
              top_logprobs=2)
    blocking = openai_client.chat.completions.create(**kw)
    assert [c.index for c in blocking.choices] == [0, 1]
    tokens = 0
    for choice in blocking.choices:
        content = choice.logprobs.content
        assert choice.finish_reason in ("stop", "length") and content
        assert all(len(e.top_logprobs) == 2 and e.logprob <= 0 for e in content)
        joined = "".join(e.token for e in content)
        if "bytes:" not in joined:  # the end-of-turn token has an entry but no text
            assert joined.replace("<|im_end|>", "") == choice.message.content
        tokens += len(content)
    assert blocking.usage.completion_tokens == tokens

    chunks = list(openai_client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    for choice in blocking.choices:
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == choice.index]
        assert "".join(c.delta.content or "" for c in mine) == choice.message.content  # seed + i per choice
        assert [c.finish_reason for c in mine][-1] == choice.finish_reason
        assert all(c.finish_reason is None for c in mine[:-1])
        streamed = [e for c in mine if c.logprobs for e in c.logprobs.content]
        assert [e.token for e in streamed] == [e.token for e in choice.logprobs.content]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == tokens


def test_a_tokens_logprobs_are_the_models_whatever_the_temperature_and_truncation(openai_client):
    # The first token's alternatives, from the same prompt, greedy and sampled hot with a narrow nucleus and a bias:
    # the model's own distribution each time (vLLM's raw_logprobs; OpenAI's logprobs do not move with temperature).
    firsts = []
    for extra in ({"temperature": 0}, {"temperature": 1.7, "top_p": 0.3, "seed": 5, "logit_bias": {"504": 5}}):
        r = openai_client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=1, logprobs=True,
                                                  top_logprobs=5, **extra)
        first = r.choices[0].logprobs.content[0]
        firsts.append([(t.token, t.logprob) for t in first.top_logprobs])
        assert first.logprob > -9999.0
    assert [t for t, _ in firsts[0]] == [t for t, _ in firsts[1]]
    assert all(a == pytest.approx(b, abs=1e-4) for (_, a), (_, b) in zip(*firsts))


def test_raw_logprobs_are_the_models_within_what_a_structured_output_allows(openai_client):
    r = openai_client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=3, logprobs=True, top_logprobs=20, temperature=1.3, seed=2,
        extra_body={"structured_outputs": {"choice": ["Paris", "London"]}})
    first = r.choices[0].logprobs.content[0]
    allowed = [t for t in first.top_logprobs if t.logprob > -9999.0]
    # The grammar's mask applies (the rest reads -9999.0); within it, the model's own distribution, whole.
    assert allowed and all("Paris".startswith(t.token) or "London".startswith(t.token) for t in allowed)
    assert first.top_logprobs[-1].logprob == -9999.0
    assert sum(math.exp(t.logprob) for t in allowed) == pytest.approx(1.0, abs=1e-4)


def test_the_stream_helper_accumulates_the_final_message(openai_client):
    with openai_client.chat.completions.stream(model=MODEL, messages=QUESTION, max_tokens=12, temperature=0) as s:
        deltas = [e.delta for e in s if e.type == "content.delta"]
        final = s.get_final_completion()
    assert final.choices[0].message.content == "".join(deltas)
    assert final.choices[0].message.role == "assistant"
    blocking = openai_client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=12, temperature=0)
    assert blocking.choices[0].message.content == final.choices[0].message.content


def test_completions_with_echo_and_logprobs(openai_client):
    prompt = "The capital of France is"
    resp = openai_client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, echo=True, logprobs=2,
                                            temperature=0)
    choice = resp.choices[0]
    assert choice.text.startswith(prompt) and len(choice.text) > len(prompt)
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    n_prompt = resp.usage.prompt_tokens
    assert "".join(lp.tokens[:n_prompt]) == prompt
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(x is not None and x <= 0 for x in lp.token_logprobs[1:])  # prompt logprobs from the engine
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[n_prompt] == len(prompt)
    assert all(len(t) <= 3 for t in lp.top_logprobs[1:])
    assert resp.usage.completion_tokens == len(lp.tokens) - n_prompt

    stream = openai_client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, echo=True, logprobs=2,
                                              temperature=0, stream=True)
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks) == choice.text
    assert [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens] == lp.tokens


def test_store_then_retrieve(openai_client):
    made = openai_client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=4, temperature=0,
                                                 store=True, metadata={"suite": "e2e"})
    got = openai_client.chat.completions.retrieve(made.id)
    assert got.id == made.id and got.choices[0].message.content == made.choices[0].message.content


def test_models_retrieve(openai_client):
    assert openai_client.models.retrieve(MODEL).id == MODEL


def test_error_classes(openai_client):
    with pytest.raises(openai.BadRequestError) as bad:
        openai_client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=3)
    assert bad.value.param == "temperature" and bad.value.status_code == 400
    with pytest.raises(openai.BadRequestError):
        openai_client.chat.completions.create(model=MODEL, messages=QUESTION, stream=True,
                                              max_tokens=10**6)
    with pytest.raises(openai.NotFoundError):
        openai_client.chat.completions.retrieve("chatcmpl-does-not-exist")
    with pytest.raises(openai.NotFoundError):
        openai_client.models.retrieve("org/not-served")
    with pytest.raises(openai.APIStatusError) as big:
        openai_client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x" * (33 << 20)}])
    assert big.value.status_code == 413
    with pytest.raises(openai.BadRequestError) as chat_model:  # the embedding model is served beside it
        openai_client.embeddings.create(model=MODEL, input="hello")
    assert chat_model.value.param == "model" and "generation model" in chat_model.value.message
    with pytest.raises(openai.InternalServerError) as missing:
        openai_client.moderations.create(model=MODEL, input="hello")
    assert missing.value.status_code == 501 and "does not implement" in missing.value.message


def test_headers_and_tokenize(openai_client, metrale_server):
    raw = openai_client.chat.completions.with_raw_response.create(
        model=MODEL, messages=QUESTION, max_tokens=1, extra_headers={"X-Request-Id": "e2e-req-1"})
    assert raw.headers["x-request-id"] == "e2e-req-1" and int(raw.headers["openai-processing-ms"]) >= 0
    tokens = httpx.post(metrale_server.url + "/tokenize", json={"messages": QUESTION}).json()
    assert tokens["count"] == raw.parse().usage.prompt_tokens
    text = httpx.post(metrale_server.url + "/detokenize", json={"tokens": tokens["tokens"]}).json()["prompt"]
    assert "What is the capital of France?" in text


def test_a_seed_gives_the_same_tokens_whatever_else_is_batched(openai_client, metrale_server):
    seeded = dict(model=MODEL, messages=[{"role": "user", "content": "Write a word."}], max_tokens=8,
                  temperature=1.0, seed=1234)
    alone = openai_client.chat.completions.create(**seeded).choices[0].message.content

    def noise(i):
        openai_client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"Count to {i}"}],
                                              max_tokens=12, temperature=1.0)
    threads = [threading.Thread(target=noise, args=(i,)) for i in range(2)]
    steps_before = len(re.findall(r"step \d+: seqs=(\d+)", metrale_server.log()))
    for t in threads:
        t.start()
    batched = openai_client.chat.completions.create(**seeded).choices[0].message.content
    for t in threads:
        t.join()
    assert batched == alone
    sizes = [int(n) for n in re.findall(r"step \d+: seqs=(\d+)", metrale_server.log())[steps_before:]]
    assert max(sizes) > 1  # it really shared steps with the others


def test_a_request_timeout_ends_the_stream_with_finish_reason_timeout(openai_client):
    stream = openai_client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Tell me a long story."}], max_tokens=2000,
        temperature=0, stream=True, extra_body={"timeout": 1.0, "ignore_eos": True})
    chunks = [c for c in stream if c.choices]
    assert chunks[-1].choices[0].finish_reason == "timeout"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    assert 1 < len(chunks) < 2000
