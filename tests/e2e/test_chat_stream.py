"""End to end: the official openai SDK against a live daphne serving SmolLM2."""
import json
import re
import threading

import httpx
import pytest

from inference.engine.tokenizer import Tokenizer

pytestmark = pytest.mark.e2e

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_it_streams_paris_and_blocking_gives_the_same_text(openai_client, smollm2_dir):
    stream = openai_client.chat.completions.create(
        model="smollm2-135m-instruct", messages=QUESTION, temperature=0, max_tokens=40, stream=True,
        stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert all(f is None for f in finishes[:-1]) and finishes[-1] in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert sum(1 for c in chunks if c.usage is not None) == 1
    assert "Paris" in text

    blocking = openai_client.chat.completions.create(
        model="smollm2-135m-instruct", messages=QUESTION, temperature=0, max_tokens=40)
    assert blocking.choices[0].message.content == text
    assert blocking.choices[0].finish_reason == finishes[-1]

    tok = Tokenizer.from_folder(smollm2_dir)
    prompt_ids = tok.encode(tok.apply_chat_template(QUESTION, add_generation_prompt=True))
    assert blocking.usage.prompt_tokens == len(prompt_ids) == chunks[-1].usage.prompt_tokens
    assert blocking.usage.completion_tokens == chunks[-1].usage.completion_tokens
    assert blocking.usage.total_tokens == blocking.usage.prompt_tokens + blocking.usage.completion_tokens


def test_it_lists_the_model_and_reports_health(openai_client, metrale_server):
    models = openai_client.models.list()
    assert [m.id for m in models.data] == ["smollm2-135m-instruct", "all-minilm-l6-v2"]  # the embedding model beside it
    r = httpx.get(metrale_server.url + "/health")
    health = r.json()
    assert r.status_code == 200 and health["status"] == "ready" and health["model"] == "smollm2-135m-instruct"
    assert health["system_fingerprint"] and health["adapters"] == [], health


PROMPTS = [
    "Name three colors.", "What is 2 + 2?", "Write a haiku about the sea.", "Who wrote Hamlet?",
    "What is the largest planet?", "Say hello in Spanish.", "What is water made of?", "Count to five.",
]


def test_it_batches_eight_concurrent_streams_with_the_same_output_as_alone(openai_client, metrale_server):
    def ask(prompt):
        stream = openai_client.chat.completions.create(
            model="smollm2-135m-instruct", messages=[{"role": "user", "content": prompt}], temperature=0, max_tokens=24, stream=True)
        return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    alone = [ask(p) for p in PROMPTS]
    before = len(re.findall(r"step \d+: seqs=(\d+)", metrale_server.log()))
    results: dict[int, str] = {}
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, ask(PROMPTS[i]))) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [results[i] for i in range(8)] == alone
    sizes = [int(n) for n in re.findall(r"step \d+: seqs=(\d+)", metrale_server.log())[before:]]
    assert max(sizes) > 1


@pytest.mark.parametrize("body, param", [
    (b"{not json", None),
    (b"[1, 2]", None),
    (json.dumps({"model": "smollm2-135m-instruct"}).encode(), "messages"),
    (json.dumps({"messages": "hi"}).encode(), "messages"),
    (json.dumps({"messages": []}).encode(), "messages"),
    (json.dumps({"messages": [{"role": "wizard", "content": "x"}]}).encode(), "messages[0].role"),
    (json.dumps({"messages": [{"role": "user", "content": 5}]}).encode(), "messages[0].content"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": "many"}).encode(), "max_tokens"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}).encode(), "max_tokens"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "temperature": 3}).encode(), "temperature"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}).encode(), "stream"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": True}}).encode(),
     "stream_options"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": 100000}).encode(), "messages"),
])
def test_it_answers_bad_input_with_400_in_openai_shape(metrale_server, body, param):
    r = httpx.post(metrale_server.url + "/v1/chat/completions", content=body,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["message"]
    assert err["param"] == param


def test_it_drops_a_stream_from_the_batch_when_the_client_disconnects(metrale_server):
    body = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "Tell me a long story."}], "max_tokens": 3000,
            "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", metrale_server.url + "/v1/chat/completions", json=body, timeout=60) as r:
        seen = 0
        for line in r.iter_lines():
            if line.startswith("data: "):
                seen += 1
            if seen >= 5:
                break
    import time

    time.sleep(1.0)  # the engine notices at its next step
    steps_then = len(re.findall(r"step \d+:", metrale_server.log()))
    time.sleep(1.0)
    assert len(re.findall(r"step \d+:", metrale_server.log())) == steps_then
