"""Prompt work of one request never blocks the others: templating and tokenizing of a body over
prepare.INLINE_BYTES run on the prepare pool (a smaller one's on the event loop, where they cost less than
the hop), and a prompt longer in characters than the context could ever hold is refused before any
tokenizing."""
import asyncio
import json
import threading
import time

import pytest

from inference.serving.prepare import INLINE_BYTES, chars_per_token_bound

from .asgi_client import AsgiRequest, serve
from .fake_engine import call, reply


def body(content: str, **extra) -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": content}], **extra}).encode()


MARK = "marked prompt"
# JSON whitespace that makes a body larger than INLINE_BYTES (its work then goes to the prepare pool).
PADDING = b" " * (INLINE_BYTES + 1)


def test_a_prompt_longer_than_the_context_can_hold_is_refused_before_tokenizing(fake_rt, monkeypatch):
    fake_rt.engine.max_model_len = 64
    bound = chars_per_token_bound(fake_rt.tokenizer)
    encoded: list[int] = []
    real_encode = type(fake_rt.tokenizer).encode
    monkeypatch.setattr(type(fake_rt.tokenizer), "encode",
                        lambda self, text, **kw: encoded.append(len(text)) or real_encode(self, text, **kw))
    too_long = "a" * (64 * bound + 1)
    for path, payload, param in (
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": too_long}]}, "messages"),
            ("/v1/completions", {"prompt": too_long}, "prompt"),
            ("/v1/completions", {"prompt": ["hi", too_long]}, "prompt[1]"),
            ("/v1/responses", {"input": too_long, "store": False}, "input"),
            ("/tokenize", {"prompt": too_long}, "prompt")):
        answer = call("POST", path, payload)
        assert answer.status == 400, (path, answer.body)
        error = answer.json()["error"]
        assert (error["code"], error["param"]) == ("context_length_exceeded", param)
        assert str(64 * bound) in error["message"]
    assert not any(n > 64 * bound for n in encoded)  # nothing that long was ever tokenized


def test_a_slow_prompt_does_not_stall_another_clients_stream(fake_rt, monkeypatch):
    """One request's tokenizing takes 1.5 s; meanwhile a stream already running keeps sending."""
    tok = fake_rt.tokenizer
    fake_rt.engine.script = reply(tok, "one two three four five six seven eight nine ten")
    fake_rt.engine.delay_s = 0.05
    real_encode = type(tok).encode
    loop_threads: set[str] = set()

    def slow_encode(self, text, **kw):
        if "SLOW" in text:
            loop_threads.add(threading.current_thread().name)
            time.sleep(1.5)
        return real_encode(self, text, **kw)

    monkeypatch.setattr(type(tok), "encode", slow_encode)

    async def scenario():
        stream = await AsgiRequest("POST", "/v1/chat/completions",
                                   {"content-type": "application/json"}, body("hi", stream=True)).start()
        slow = asyncio.ensure_future(AsgiRequest("POST", "/v1/chat/completions",
                                                 {"content-type": "application/json"},
                                                 body("SLOW " * 10, max_tokens=3) + PADDING).start(timeout_s=20))
        arrivals = []
        while not stream.finished:
            await stream.chunk()
            arrivals.append(time.perf_counter())
        slow_answer = await slow
        await slow_answer.read_all()
        return arrivals, slow_answer.status

    arrivals, slow_status = serve(scenario)
    assert slow_status == 200
    assert loop_threads and all(name.startswith("metrale-prepare") for name in loop_threads)
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    assert len(arrivals) > 5 and max(gaps) < 1.0  # the stream never waited for the slow tokenize


@pytest.mark.parametrize("path, payload", [
    ("/tokenize", {"prompt": "Hello world"}),
    ("/detokenize", {"tokens": [19556, 905]}),
])
def test_tokenize_routes_run_on_the_pool_and_answer_as_before(fake_rt, monkeypatch, path, payload):
    seen: set[str] = set()
    real_decode, real_encode = type(fake_rt.tokenizer).decode, type(fake_rt.tokenizer).encode
    monkeypatch.setattr(type(fake_rt.tokenizer), "encode", lambda self, *a, **kw: seen.add(
        threading.current_thread().name) or real_encode(self, *a, **kw))
    monkeypatch.setattr(type(fake_rt.tokenizer), "decode", lambda self, *a, **kw: seen.add(
        threading.current_thread().name) or real_decode(self, *a, **kw))
    answer = call("POST", path, payload)
    assert answer.status == 200, answer.body
    assert seen and all(name.startswith("metrale-prepare") for name in seen)
    if path == "/tokenize":
        assert answer.json()["tokens"] == real_encode(fake_rt.tokenizer, "Hello world", add_special_tokens=True)
    else:
        assert answer.json()["prompt"] == real_decode(fake_rt.tokenizer, [19556, 905], skip_special_tokens=False)


def threads_of_work(fake_rt, monkeypatch, path, payload, padding: bytes = b"") -> tuple[set[str], set[str]]:
    """(the threads that parsed the body's JSON, the threads that tokenized its prompt: a text with MARK) for
    one request whose body is `payload` followed by `padding`."""
    from inference.serving import json_body

    parsed: set[str] = set()
    tokenized: set[str] = set()
    real_decoder = json_body.json.JSONDecoder
    real_encode = type(fake_rt.tokenizer).encode

    class Decoder(real_decoder):
        def decode(self, *args, **kw):
            parsed.add(threading.current_thread().name)
            return super().decode(*args, **kw)

    monkeypatch.setattr(json_body.json, "JSONDecoder", Decoder)
    def encode(self, text, *args, **kwargs):
        if MARK in text:
            tokenized.add(threading.current_thread().name)
        return real_encode(self, text, *args, **kwargs)

    monkeypatch.setattr(type(fake_rt.tokenizer), "encode", encode)
    answer = call("POST", path, raw=json.dumps(payload).encode() + padding)
    assert answer.status == 200, answer.body
    return parsed, tokenized


@pytest.mark.parametrize("path, payload", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": MARK}], "max_tokens": 2}),
    ("/v1/completions", {"prompt": MARK, "max_tokens": 2}),
    ("/v1/messages", {"messages": [{"role": "user", "content": MARK}], "max_tokens": 2}),
    ("/v1/responses", {"input": MARK, "max_output_tokens": 2, "store": False}),
])
def test_request_bodies_are_parsed_on_the_pool(fake_rt, monkeypatch, path, payload):
    payload = {"model": fake_rt.model_id, **payload} if path == "/v1/messages" else payload
    parsed, tokenized = threads_of_work(fake_rt, monkeypatch, path, payload, PADDING)
    assert parsed and all(name.startswith("metrale-prepare") for name in parsed)
    assert tokenized and all(name.startswith("metrale-prepare") for name in tokenized)


@pytest.mark.parametrize("path, payload", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": MARK}], "max_tokens": 2}),
    ("/v1/completions", {"prompt": MARK, "max_tokens": 2}),
    ("/v1/messages", {"messages": [{"role": "user", "content": MARK}], "max_tokens": 2}),
])
def test_small_bodies_are_parsed_and_tokenized_on_the_event_loop(fake_rt, monkeypatch, path, payload):
    payload = {"model": fake_rt.model_id, **payload} if path == "/v1/messages" else payload
    parsed, tokenized = threads_of_work(fake_rt, monkeypatch, path, payload)
    assert parsed and tokenized and not any(name.startswith("metrale-prepare") for name in parsed | tokenized)
