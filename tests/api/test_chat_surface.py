"""POST /v1/chat/completions through the whole stack against a scripted engine: the rules on the wire."""
import pytest

from inference.engine.outputs import Finished, TokenEvent

from .asgi_client import serve
from .fake_engine import call, reply

USER = [{"role": "user", "content": "hi"}]


def chat(**body):
    return call("POST", "/v1/chat/completions", {"model": "smollm2-135m-instruct", "messages": USER, **body})


def choice_chunks(events, index=0):
    return [e for e in events if isinstance(e, dict) and e.get("choices") and e["choices"][0]["index"] == index]


def text_of(events, index=0):
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in choice_chunks(events, index))


def test_it_never_streams_a_stop_string_in_part_even_across_tokens(fake_rt):
    tok = fake_rt.tokenizer
    fake_rt.engine.script = reply(tok, "Hello world, again and again")
    ids = tok.encode("Hello world, again and again")
    assert len(ids) > 4  # the stop string below spans several tokens
    for stop, expected in ((["lo world, ag"], "Hel"), (["again and"], "Hello world, "), ("z", None)):
        events = chat(stream=True, stop=stop).events()
        pieces = [c["choices"][0]["delta"].get("content") or "" for c in choice_chunks(events)]
        text = "".join(pieces)
        if expected is None:
            assert text == "Hello world, again and again"
            continue
        assert text == expected
        assert choice_chunks(events)[-1]["choices"][0]["finish_reason"] == "stop"
        # No piece ever held a beginning of the stop string that was later taken back.
        assert all(stop[0][:2] not in p for p in pieces)
        assert fake_rt.engine.submissions[-1].handle.aborted == "stop"


def test_it_keeps_the_stop_string_with_include_stop_str_in_output(fake_rt):
    fake_rt.engine.script = reply(fake_rt.tokenizer, "Hello world, again")
    body = chat(stop=["world"], include_stop_str_in_output=True).json()
    assert body["choices"][0]["message"]["content"] == "Hello world"


@pytest.mark.parametrize("stream", [False, True])
def test_logprobs_describe_the_content_sent_not_a_stop_string_s_tokens(fake_rt, stream):
    tok = fake_rt.tokenizer
    fake_rt.engine.script = reply(tok, "Hello world, again and again")
    for stop, include, content in ((["again and"], False, "Hello world, "), (["again and"], True, "Hello world, again and"),
                                   (["lo world"], False, "Hel"), (["zzz"], False, "Hello world, again and again")):
        answer = chat(stop=stop, include_stop_str_in_output=include, logprobs=True, stream=stream)
        if stream:
            chunks = choice_chunks(answer.events())
            text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
            entries = [e for c in chunks if c["choices"][0].get("logprobs") for e in c["choices"][0]["logprobs"]["content"]]
        else:
            body = answer.json()
            text, entries = body["choices"][0]["message"]["content"], body["choices"][0]["logprobs"]["content"]
        assert text == content
        # Every token whose text the output holds, and no token wholly past the cut ("Hel" keeps "Hello", which the
        # cut splits).
        joined = "".join(e["token"] for e in entries)
        assert joined.startswith(content) and len(joined) - len(content) < max(len(e["token"]) for e in entries)


def test_it_sends_no_replacement_character_for_characters_split_across_tokens(fake_rt):
    text = "你好世界 😀 héllo"
    fake_rt.engine.script = reply(fake_rt.tokenizer, text)
    events = chat(stream=True).events()
    pieces = [c["choices"][0]["delta"].get("content") or "" for c in choice_chunks(events)]
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)
    assert len(fake_rt.tokenizer.encode(text)) > len([p for p in pieces if p])  # some tokens were held


def test_each_choice_has_its_own_index_role_and_last_chunk_finish_reason(fake_rt):
    fake_rt.engine.script = reply(fake_rt.tokenizer, ["One two three", "Four five", "Six"])
    events = chat(stream=True, n=3, max_tokens=5).events()
    assert events[-1] == "[DONE]"
    for i, expected in enumerate(["One two three", "Four five", "Six"]):
        chunks = choice_chunks(events, i)
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert sum("role" in c["choices"][0]["delta"] for c in chunks) == 1
        finishes = [c["choices"][0]["finish_reason"] for c in chunks]
        assert all(f is None for f in finishes[:-1]) and finishes[-1] == "stop"
        assert text_of(events, i) == expected
    assert not any("usage" in e for e in events if isinstance(e, dict))


def test_blocking_n_gives_each_choice_its_index_and_finish_reason(fake_rt):
    fake_rt.engine.script = reply(fake_rt.tokenizer, ["One two three four", "Five"])
    body = chat(n=2, max_tokens=3).json()
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert [c["finish_reason"] for c in body["choices"]] == ["length", "stop"]
    assert body["usage"]["completion_tokens"] == 3 + 1
    assert body["usage"]["prompt_tokens"] == len(fake_rt.engine.submissions[0].prompt_token_ids)


def test_a_seed_gives_choice_i_the_seed_plus_i(fake_rt):
    chat(n=3, seed=41)
    assert [s.params.seed for s in fake_rt.engine.submissions] == [41, 42, 43]


def test_include_usage_sends_exactly_one_usage_chunk_last(fake_rt):
    events = chat(stream=True, n=2, stream_options={"include_usage": True}).events()
    assert events[-1] == "[DONE]"
    with_usage = [e for e in events[:-1] if "usage" in e]
    assert len(with_usage) == 1 and with_usage[0] is events[-2]
    assert events[-2]["choices"] == []
    assert events[-2]["usage"]["completion_tokens"] == 4
    assert events[-2]["usage"]["total_tokens"] == events[-2]["usage"]["prompt_tokens"] + 4


def test_continuous_usage_stats_puts_the_running_usage_on_every_chunk(fake_rt):
    events = chat(stream=True, stream_options={"continuous_usage_stats": True}).events()
    chunks = [e for e in events if isinstance(e, dict)]
    assert all("usage" in c for c in chunks[1:])
    completion = [c["usage"]["completion_tokens"] for c in chunks[1:]]
    assert completion == sorted(completion) and completion[-1] == 2


def test_an_engine_failure_after_the_200_is_sent_in_band_then_done(fake_rt):
    fake_rt.engine.script = reply(fake_rt.tokenizer, "Hello world", fail="engine error: out of memory")
    answer = chat(stream=True)
    assert answer.status == 200
    events = answer.events()
    assert events[-1] == "[DONE]"
    assert events[-2] == {"error": {"message": "engine error: out of memory", "type": "server_error",
                                    "param": None, "code": None}}
    assert text_of(events) == "Hello world"


def test_a_blocking_engine_failure_is_a_500_in_openai_shape(fake_rt):
    fake_rt.engine.script = reply(fake_rt.tokenizer, "Hello", fail="engine error: boom")
    answer = chat()
    assert answer.status == 500
    assert answer.json()["error"]["type"] == "server_error"


def test_timeout_reaches_the_engine_and_its_finish_reason_is_timeout(fake_rt):
    fake_rt.engine.script = reply(fake_rt.tokenizer, "Hello", reason="timeout")
    events = chat(stream=True, timeout=2.5).events()
    assert fake_rt.engine.submissions[0].timeout_s == 2.5
    assert choice_chunks(events)[-1]["choices"][0]["finish_reason"] == "timeout"
    chat(timeout=10**9)
    assert fake_rt.engine.submissions[1].timeout_s == 600.0  # capped by METRALE["REQUEST_TIMEOUT_S"]


def test_prompt_plus_max_tokens_over_the_context_is_a_400_with_the_numbers(fake_rt):
    fake_rt.engine.max_model_len = 100
    prompt_len = len(fake_rt.tokenizer.encode_chat(USER))
    for stream in (False, True):
        answer = chat(max_tokens=90, stream=stream)
        assert answer.status == 400
        err = answer.json()["error"]
        assert err["code"] == "context_length_exceeded" and err["param"] == "messages"
        assert "100" in err["message"] and str(prompt_len) in err["message"] and "90" in err["message"]
    assert not fake_rt.engine.submissions


def test_a_missing_max_tokens_means_up_to_the_context(fake_rt):
    fake_rt.engine.max_model_len = 100
    chat()
    sub = fake_rt.engine.submissions[0]
    assert sub.params.max_tokens == 100 - len(sub.prompt_token_ids)


def test_logprobs_come_in_openai_chat_shape(fake_rt):
    body = chat(logprobs=True, top_logprobs=3).json()
    content = body["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in content] == ["Hello", " world"]
    for e in content:
        assert set(e) == {"token", "logprob", "bytes", "top_logprobs"}
        assert bytes(e["bytes"]).decode() == e["token"]
        assert len(e["top_logprobs"]) == 3 and e["top_logprobs"][0]["token"] == e["token"]
    assert fake_rt.engine.submissions[0].params.logprobs == 3
    streamed = chat(logprobs=True, stream=True).events()
    entries = [e for c in choice_chunks(streamed) if c["choices"][0]["logprobs"]
               for e in c["choices"][0]["logprobs"]["content"]]
    assert [e["token"] for e in entries] == ["Hello", " world"] and all(e["top_logprobs"] == [] for e in entries)


def test_logprobs_of_a_split_character_are_spelled_in_bytes(fake_rt):
    fake_rt.engine.script = reply(fake_rt.tokenizer, "你")
    content = chat(logprobs=True).json()["choices"][0]["logprobs"]["content"]
    assert len(content) == 2
    assert all(e["token"].startswith("bytes:\\x") for e in content)
    assert bytes(content[0]["bytes"] + content[1]["bytes"]).decode() == "你"


def test_return_token_ids_adds_prompt_and_completion_ids(fake_rt):
    body = chat(return_token_ids=True).json()
    assert body["prompt_token_ids"] == fake_rt.engine.submissions[0].prompt_token_ids
    assert body["choices"][0]["token_ids"] == fake_rt.tokenizer.encode("Hello world")
    events = chat(return_token_ids=True, stream=True).events()
    assert events[0]["prompt_token_ids"] == body["prompt_token_ids"]
    ids = [t for c in choice_chunks(events)[1:] for t in c["choices"][0].get("token_ids", [])]
    assert ids == body["choices"][0]["token_ids"]


def test_service_tier_is_echoed(fake_rt):
    assert chat(service_tier="flex").json()["service_tier"] == "flex"
    events = chat(service_tier="flex", stream=True).events()
    assert all(e["service_tier"] == "flex" for e in events if isinstance(e, dict))


def test_developer_messages_are_system_messages_and_parts_are_joined(fake_rt):
    chat(messages=[{"role": "developer", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "terse."}]},
                   {"role": "user", "content": "hi"}])
    prompt = fake_rt.tokenizer.decode(fake_rt.engine.submissions[0].prompt_token_ids, skip_special_tokens=False)
    assert "<|im_start|>system\nBe terse.<|im_end|>" in prompt


def test_tool_calls_and_tool_messages_reach_the_template(fake_rt):
    messages = [{"role": "user", "content": "weather?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get", "arguments": "{\"a\": 1}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    assert chat(messages=messages).status == 200
    prompt = fake_rt.tokenizer.decode(fake_rt.engine.submissions[0].prompt_token_ids, skip_special_tokens=False)
    assert "<|im_start|>tool\nsunny<|im_end|>" in prompt


@pytest.mark.parametrize("flags", [{"continue_final_message": True, "add_generation_prompt": False},
                                   {"continue_final_message": True}, {"add_generation_prompt": False}])
def test_a_final_assistant_message_is_continued(fake_rt, flags):
    messages = [{"role": "user", "content": "Count"}, {"role": "assistant", "content": "One, two,"}]
    assert chat(messages=messages, **flags).status == 200
    prompt = fake_rt.tokenizer.decode(fake_rt.engine.submissions[0].prompt_token_ids, skip_special_tokens=False)
    assert prompt.endswith("<|im_start|>assistant\nOne, two,")


def test_echo_prefixes_the_last_assistant_message(fake_rt):
    messages = [{"role": "user", "content": "Count"}, {"role": "assistant", "content": "One, two,"}]
    body = chat(messages=messages, echo=True, continue_final_message=True).json()
    assert body["choices"][0]["message"]["content"] == "One, two,Hello world"
    events = chat(messages=messages, echo=True, continue_final_message=True, stream=True).events()
    assert text_of(events) == "One, two,Hello world"
    assert chat(echo=True).json()["choices"][0]["message"]["content"] == "Hello world"  # last is the user's


def test_chat_template_kwargs_reach_the_template_and_reserved_names_are_refused(fake_rt):
    assert chat(chat_template_kwargs={"enable_thinking": False}).status == 200
    answer = chat(chat_template_kwargs={"messages": []})
    assert answer.status == 400 and answer.json()["error"]["param"] == "chat_template_kwargs"


def test_sampling_fields_reach_the_engine(fake_rt):
    tok = fake_rt.tokenizer
    chat(temperature=0.5, top_p=0.9, top_k=40, min_p=0.05, top_n_sigma=1.5, repetition_penalty=1.1,
         presence_penalty=0.5, frequency_penalty=-0.5, dry_multiplier=0.8, dry_base=2, dry_allowed_length=3,
         dry_penalty_last_n=64, logit_bias={"42": -100, "7": 5.5}, min_tokens=2, max_completion_tokens=9,
         max_tokens=100, seed=5, ignore_eos=True, stop_token_ids=[3, 4])
    p = fake_rt.engine.submissions[0].params
    assert (p.temperature, p.top_p, p.top_k, p.min_p, p.top_n_sigma) == (0.5, 0.9, 40, 0.05, 1.5)
    assert (p.repetition_penalty, p.presence_penalty, p.frequency_penalty) == (1.1, 0.5, -0.5)
    assert (p.dry_multiplier, p.dry_base, p.dry_allowed_length, p.dry_penalty_last_n) == (0.8, 2, 3, 64)
    assert p.logit_bias == {42: -100.0, 7: 5.5}
    assert (p.min_tokens, p.max_tokens, p.seed, p.ignore_eos, p.stop_token_ids) == (2, 9, 5, True, [3, 4])
    newline = tok.encode("\n")[0]
    assert newline in p.dry_sequence_breaker_ids and tok.encode("Hello")[0] not in p.dry_sequence_breaker_ids
    chat(dry_multiplier=0.8, dry_sequence_breakers=["Hello"])
    assert tok.encode("Hello")[0] in fake_rt.engine.submissions[1].params.dry_sequence_breaker_ids


def test_token_ids_outside_the_vocabulary_are_a_400(fake_rt):
    for field, value in (("logit_bias", {"999999": 1}), ("stop_token_ids", [999999])):
        answer = chat(**{field: value})
        assert answer.status == 400 and answer.json()["error"]["param"] == field


def test_model_names_the_served_id_and_aliases_and_any_name_when_allowed(fake_rt, settings):
    assert chat(model="anything").status == 404  # off by default
    settings.METRALE = {**settings.METRALE, "ACCEPT_ANY_MODEL_NAME": True}
    assert chat(model="anything").status == 200
    assert chat(model="anything").json()["model"] == "smollm2-135m-instruct"
    settings.METRALE = {**settings.METRALE, "ACCEPT_ANY_MODEL_NAME": False, "MODEL_ALIASES": ["org/smol"]}
    assert chat(model="smollm2-135m-instruct").status == 200
    assert chat(model="org/smol").status == 200
    answer = chat(model="gpt-4o")
    assert answer.status == 404
    assert answer.json()["error"]["code"] == "model_not_found" and answer.json()["error"]["param"] == "model"


def test_store_keeps_the_completion_for_get_and_delete(fake_rt):
    body = chat(store=True, metadata={"team": "a"}).json()
    got = call("GET", f"/v1/chat/completions/{body['id']}")
    assert got.status == 200
    assert got.json() == {**body, "metadata": {"team": "a"}}
    streamed = [e for e in chat(store=True, stream=True).events() if isinstance(e, dict)]
    stored = call("GET", f"/v1/chat/completions/{streamed[0]['id']}").json()
    assert stored["choices"][0]["message"]["content"] == "Hello world"
    assert stored["usage"]["completion_tokens"] == 2
    not_stored = chat().json()
    missing = call("GET", f"/v1/chat/completions/{not_stored['id']}")
    assert missing.status == 404
    assert set(missing.json()["error"]) == {"message", "type", "param", "code"}
    assert call("DELETE", f"/v1/chat/completions/{body['id']}").json()["deleted"] is True
    assert call("GET", f"/v1/chat/completions/{body['id']}").status == 404


def test_an_unknown_field_is_ignored(fake_rt):
    assert chat(frobnicate=True, reasoning_effort="low").status == 200


def test_a_client_that_leaves_mid_stream_aborts_every_choice(fake_rt):
    import asyncio

    from .asgi_client import AsgiRequest

    fake_rt.engine.script = reply(fake_rt.tokenizer, "one two three four five six seven eight nine ten")
    fake_rt.engine.delay_s = 0.01
    body = b'{"messages": [{"role": "user", "content": "hi"}], "stream": true, "n": 2}'

    async def run():
        req = await AsgiRequest("POST", "/v1/chat/completions", {"content-type": "application/json"}, body).start()
        await req.chunk()
        await req.chunk()
        await req.disconnect()
    serve(run)
    assert [s.handle.aborted for s in fake_rt.engine.submissions] == ["cancelled", "cancelled"]


def test_special_tokens_held_back_still_count(fake_rt):
    tok = fake_rt.tokenizer
    end = tok.token_to_id("<|im_end|>")

    def script(prompt_ids, params, index):
        return [TokenEvent(tok.encode("Hi")[0], None), TokenEvent(end, None), Finished("stop", len(prompt_ids), 2)]
    fake_rt.engine.script = script
    body = chat(return_token_ids=True).json()
    assert body["choices"][0]["message"]["content"] == "Hi"
    assert body["choices"][0]["token_ids"] == [tok.encode("Hi")[0], end]
    assert body["usage"]["completion_tokens"] == 2
    events = chat(stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True}).events()
    finish = [c for c in choice_chunks(events) if c["choices"][0]["finish_reason"]][0]
    assert finish["usage"]["completion_tokens"] == events[-2]["usage"]["completion_tokens"] == 2
