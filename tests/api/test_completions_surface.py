"""POST /v1/completions through the whole stack against a scripted engine: prompts, echo, legacy logprobs, n."""
from .fake_engine import call, reply


def complete(**body):
    return call("POST", "/v1/completions", {"model": "smollm2-135m-instruct", **body})


def test_a_string_prompt_gives_a_text_completion(fake_rt):
    answer = complete(prompt="Once upon a time")
    assert answer.status == 200
    body = answer.json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["choices"] == [{"index": 0, "text": "Hello world", "logprobs": None, "finish_reason": "stop"}]
    prompt_ids = fake_rt.tokenizer.encode("Once upon a time")
    assert fake_rt.engine.submissions[0].prompt_token_ids == prompt_ids
    assert body["usage"]["prompt_tokens"] == len(prompt_ids) and body["usage"]["completion_tokens"] == 2
    assert fake_rt.engine.submissions[0].params.max_tokens == 16  # OpenAI's default for completions


def test_several_prompts_and_n_index_choices_prompt_major(fake_rt):
    fake_rt.engine.script = reply(fake_rt.tokenizer, ["a", "b", "c", "d", "e", "f"])
    body = complete(prompt=["first", "second", "third"], n=2, seed=7).json()
    assert [c["index"] for c in body["choices"]] == list(range(6))
    assert [c["text"] for c in body["choices"]] == ["a", "b", "c", "d", "e", "f"]
    subs = fake_rt.engine.submissions
    assert [fake_rt.tokenizer.decode(s.prompt_token_ids) for s in subs] == ["first"] * 2 + ["second"] * 2 + ["third"] * 2
    assert [s.params.seed for s in subs] == [7, 8] * 3
    expected_prompt = sum(len(fake_rt.tokenizer.encode(p)) for p in ("first", "second", "third"))
    assert body["usage"]["prompt_tokens"] == expected_prompt and body["usage"]["completion_tokens"] == 6


def test_token_id_prompts_are_used_as_given(fake_rt):
    complete(prompt=[1, 2, 3])
    complete(prompt=[[5, 6], [7]])
    assert [s.prompt_token_ids for s in fake_rt.engine.submissions] == [[1, 2, 3], [5, 6], [7]]
    answer = complete(prompt=[1, 999999])
    assert answer.status == 400 and answer.json()["error"]["param"] == "prompt"


def test_an_empty_prompt_starts_a_new_document(fake_rt):
    assert complete(prompt="").status == 200
    assert fake_rt.engine.submissions[0].prompt_token_ids == [fake_rt.tokenizer.bos_token_id]


def test_echo_puts_the_prompt_first(fake_rt):
    assert complete(prompt="Say:", echo=True).json()["choices"][0]["text"] == "Say:Hello world"
    events = complete(prompt="Say:", echo=True, stream=True).events()
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == "Say:Hello world"


def test_logprobs_come_in_the_legacy_shape_with_text_offsets(fake_rt):
    fake_rt.engine.script = reply(fake_rt.tokenizer, "Hi 你好 there")
    body = complete(prompt="x", logprobs=2).json()
    lp = body["choices"][0]["logprobs"]
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    n = len(fake_rt.tokenizer.encode("Hi 你好 there"))
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == n
    assert lp["token_logprobs"] == [-0.25] * n
    assert all(len(t) <= 2 + 1 for t in lp["top_logprobs"])
    text = body["choices"][0]["text"]
    assert lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][0] == 0
    assert text[lp["text_offset"][-1]:] == " there"
    assert fake_rt.engine.submissions[0].params.logprobs == 2


def test_echo_with_logprobs_covers_the_prompt(fake_rt):
    prompt = "The cat sat"
    prompt_ids = fake_rt.tokenizer.encode(prompt)
    body = complete(prompt=prompt, echo=True, logprobs=1, max_tokens=2).json()
    lp = body["choices"][0]["logprobs"]
    assert fake_rt.engine.submissions[0].params.prompt_logprobs == 1
    assert lp["tokens"] == ["The", " cat", " sat", "Hello", " world"]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["token_logprobs"][1:len(prompt_ids)] == [-2.0] * (len(prompt_ids) - 1)
    assert lp["text_offset"] == [0, 3, 7, 11, 16]
    events = complete(prompt=prompt, echo=True, logprobs=1, max_tokens=2, stream=True).events()
    chunks = [e for e in events if isinstance(e, dict)]
    assert chunks[0]["choices"][0]["text"] == prompt
    streamed = [t for c in chunks if c["choices"][0]["logprobs"] for t in c["choices"][0]["logprobs"]["tokens"]]
    assert streamed == lp["tokens"]


def test_suffix_is_refused_on_a_model_without_infill_tokens(fake_rt):
    answer = complete(prompt="def f(", suffix="return x")
    assert answer.status == 400
    assert answer.json()["error"]["param"] == "suffix" and "infill" in answer.json()["error"]["message"]


def test_suffix_makes_an_infill_prompt_where_the_model_has_the_tokens(fake_rt, monkeypatch):
    tok = fake_rt.tokenizer
    fim = {"<fim_prefix>": 11, "<fim_suffix>": 12, "<fim_middle>": 13}
    real = tok.token_to_id
    monkeypatch.setattr(tok, "token_to_id", lambda t: fim.get(t, real(t)))
    assert complete(prompt="def f(", suffix="return x").status == 200
    ids = fake_rt.engine.submissions[0].prompt_token_ids
    assert ids == [11, *tok.encode("def f("), 12, *tok.encode("return x"), 13]


def test_n_goes_up_to_128(fake_rt):
    body = complete(prompt="x", n=128, max_tokens=1).json()
    assert len(body["choices"]) == 128 and len(fake_rt.engine.submissions) == 128
    answer = complete(prompt="x", n=129)
    assert answer.status == 400 and answer.json()["error"]["param"] == "n"


def test_streaming_n_with_usage(fake_rt):
    events = complete(prompt=["a", "b"], n=2, stream=True, stream_options={"include_usage": True}).events()
    assert events[-1] == "[DONE]" and events[-2]["choices"] == []
    assert events[-2]["usage"]["completion_tokens"] == 8
    for j in range(4):
        chunks = [e for e in events[:-2] if e["choices"][0]["index"] == j]
        assert "".join(c["choices"][0]["text"] for c in chunks) == "Hello world"
        finishes = [c["choices"][0]["finish_reason"] for c in chunks]
        assert all(f is None for f in finishes[:-1]) and finishes[-1] == "stop"
    assert not any("usage" in e for e in events[:-2])


def test_a_prompt_over_the_context_is_a_400_naming_it(fake_rt):
    fake_rt.engine.max_model_len = 50
    answer = complete(prompt=["short", "word " * 60])
    assert answer.status == 400
    assert answer.json()["error"]["param"] == "prompt[1]" and "50" in answer.json()["error"]["message"]


def test_stop_strings_and_in_band_errors_work_as_in_chat(fake_rt):
    fake_rt.engine.script = reply(fake_rt.tokenizer, "Hello world again")
    assert complete(prompt="x", stop="world").json()["choices"][0]["text"] == "Hello "
    choice = complete(prompt="x", stop=" again", logprobs=1).json()["choices"][0]
    assert choice["text"] == "Hello world" and "".join(choice["logprobs"]["tokens"]) == "Hello world"
    assert choice["logprobs"]["text_offset"][-1] < len(choice["text"])
    fake_rt.engine.script = reply(fake_rt.tokenizer, "Hello", fail="engine error: boom")
    events = complete(prompt="x", stream=True).events()
    assert events[-2]["error"]["message"] == "engine error: boom" and events[-1] == "[DONE]"


def test_best_of_equal_to_n_is_accepted_and_more_is_refused(fake_rt):
    assert complete(prompt="x", n=2, best_of=2).status == 200
    answer = complete(prompt="x", n=1, best_of=3)
    assert answer.status == 400 and answer.json()["error"]["param"] == "best_of"
