"""Tool calls on POST /v1/chat/completions: the scripted engine emits the real SmolLM2 token ids of a
scripted generation, which go through the real pipeline (detokenizer, stop strings, tool parser) and the
ASGI stack. SmolLM2's template ignores tools, so the hermes parser and the tools system section apply."""
import json

import pytest

from inference.engine.outputs import Finished, TokenEvent

from .fake_engine import call, reply

USER = [{"role": "user", "content": "Weather in Paris for 3 days?"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Forecast for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": "3"}}\n</tool_call>'
ARGS = {"city": "Paris", "days": 3}


def chat(**body):
    return call("POST", "/v1/chat/completions", {"model": "smollm2-135m-instruct", "messages": USER, "tools": [WEATHER], **body})


def chunks(events):
    return [e for e in events if isinstance(e, dict) and e.get("choices")]


def prompt_of(fake_rt, i=0) -> str:
    return fake_rt.tokenizer.decode(fake_rt.engine.submissions[i].prompt_token_ids, skip_special_tokens=False)


def accumulate(events) -> tuple[str | None, list[dict]]:
    """Content and tool calls as the SDK's accumulator builds them (strings concatenated by index)."""
    content, calls = None, {}
    for c in chunks(events):
        delta = c["choices"][0]["delta"]
        if delta.get("content"):
            content = (content or "") + delta["content"]
        for tc in delta.get("tool_calls") or []:
            entry = calls.setdefault(tc["index"], {"id": "", "type": "", "function": {"name": "", "arguments": ""}})
            entry["id"] += tc.get("id") or ""
            entry["type"] = tc.get("type") or entry["type"]
            fn = tc.get("function") or {}
            entry["function"]["name"] += fn.get("name") or ""
            entry["function"]["arguments"] += fn.get("arguments") or ""
    return content, [calls[i] for i in sorted(calls)]


def test_a_blocking_call_gives_tool_calls_null_content_and_finish_reason_tool_calls(fake_rt):
    fake_rt.engine.script = reply(fake_rt.tokenizer, CALL)
    body = chat().json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    [tc] = choice["message"]["tool_calls"]
    assert tc["type"] == "function" and tc["id"].startswith("call_")
    assert tc["function"]["name"] == "get_weather"
    assert json.loads(tc["function"]["arguments"]) == ARGS  # "3" coerced to the schema's integer
    assert body["usage"]["completion_tokens"] == len(fake_rt.tokenizer.encode(CALL))


def test_a_streamed_call_follows_the_chunk_rules_and_accumulates_to_the_blocking_call(fake_rt):
    fake_rt.engine.script = reply(fake_rt.tokenizer, "Let me check.\n" + CALL)
    events = chat(stream=True).events()
    tool_chunks = [c for c in chunks(events) if c["choices"][0]["delta"].get("tool_calls")]
    first, *rest = [c["choices"][0]["delta"]["tool_calls"][0] for c in tool_chunks]
    assert set(first) == {"index", "id", "type", "function"} and first["index"] == 0
    assert first["function"]["name"] == "get_weather" and first["type"] == "function"
    assert rest and all(set(f) == {"index", "function"} and set(f["function"]) == {"arguments"} for f in rest)
    assert chunks(events)[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks(events)[:-1])
    content, calls = accumulate(events)
    blocking = chat().json()["choices"][0]["message"]
    assert content == blocking["content"] == "Let me check."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == \
        [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in blocking["tool_calls"]]


def test_tools_are_described_in_a_system_section_when_the_template_ignores_them(fake_rt):
    chat()
    prompt = prompt_of(fake_rt)
    assert prompt.startswith("<|im_start|>system\n# Tools\n")
    assert '"name": "get_weather"' in prompt and "<tool_call>" in prompt
    chat(messages=[{"role": "system", "content": "Be brief."}, *USER], tool_choice="required")
    prompt = prompt_of(fake_rt, 1)
    assert prompt.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert "You must call at least one function." in prompt


def test_tool_choice_none_makes_no_calls_keeps_markup_out_of_content_and_leaves_tools_out(fake_rt):
    fake_rt.engine.script = reply(fake_rt.tokenizer, "Sure. " + CALL)
    body = chat(tool_choice="none").json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert "tool_calls" not in choice["message"] and choice["message"]["content"] == "Sure."
    assert "# Tools" not in prompt_of(fake_rt)


def test_without_parallel_tool_calls_the_second_call_ends_the_response(fake_rt):
    fake_rt.engine.script = reply(fake_rt.tokenizer, CALL + "\n" + CALL.replace("Paris", "Lyon"))
    body = chat(parallel_tool_calls=False).json()
    assert [json.loads(c["function"]["arguments"])["city"] for c in body["choices"][0]["message"]["tool_calls"]] \
        == ["Paris"]
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    assert fake_rt.engine.submissions[0].handle.aborted == "stop"
    assert "at most one function" in prompt_of(fake_rt)


def test_max_tool_calls_per_response_caps_the_calls(fake_rt, settings):
    settings.METRALE = {**settings.METRALE, "MAX_TOOL_CALLS_PER_RESPONSE": 2}
    fake_rt.engine.script = reply(fake_rt.tokenizer, "\n".join([CALL] * 3))
    events = chat(stream=True).events()
    _, calls = accumulate(events)
    assert [c["function"]["name"] for c in calls] == ["get_weather"] * 2
    assert len({c["id"] for c in calls}) == 2
    assert chunks(events)[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_a_named_tool_choice_takes_only_calls_to_that_function(fake_rt):
    fake_rt.engine.script = reply(fake_rt.tokenizer, CALL)
    body = chat(tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_time"}}).json()
    assert "tool_calls" not in body["choices"][0]["message"]
    assert "You must call the function get_time." in prompt_of(fake_rt)


def test_timeout_wins_over_tool_calls_and_tool_calls_over_a_stop_string(fake_rt):
    tok = fake_rt.tokenizer

    def timed_out(prompt_ids, params, index):
        ids = tok.encode(CALL)
        return [TokenEvent(i, None) for i in ids] + [Finished("timeout", len(prompt_ids), len(ids), 0.0, 0.0)]
    fake_rt.engine.script = timed_out
    assert chat().json()["choices"][0]["finish_reason"] == "timeout"
    fake_rt.engine.script = reply(tok, CALL + " Done. The end")
    body = chat(stop=["The end"]).json()
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    assert body["choices"][0]["message"]["content"] == "Done."


def test_whitespace_content_is_null_with_calls_and_kept_without(fake_rt):
    fake_rt.engine.script = reply(fake_rt.tokenizer, "\n\n" + CALL + "\n")
    assert chat().json()["choices"][0]["message"]["content"] is None
    fake_rt.engine.script = reply(fake_rt.tokenizer, "\n \n")
    assert chat().json()["choices"][0]["message"]["content"] == "\n \n"


def test_an_empty_turn_is_an_empty_string_when_blocking(fake_rt):
    fake_rt.engine.script = lambda prompt_ids, params, index: [Finished("stop", len(prompt_ids), 0, 0.0, 0.0)]
    message = chat().json()["choices"][0]["message"]
    assert message["content"] == "" and "tool_calls" not in message


def test_a_tool_round_trip_renders_the_call_and_its_result_and_gives_the_answer(fake_rt):
    fake_rt.engine.script = reply(fake_rt.tokenizer, "It will be sunny in Paris.")
    messages = [*USER,
                {"role": "assistant", "content": None, "tool_calls": [{
                    "id": "call_abc", "type": "function",
                    "function": {"name": "get_weather", "arguments": json.dumps(ARGS)}}]},
                {"role": "tool", "tool_call_id": "call_abc", "content": "sunny, 24C"}]
    body = chat(messages=messages).json()
    assert body["choices"][0]["message"]["content"] == "It will be sunny in Paris."
    assert body["choices"][0]["finish_reason"] == "stop"
    prompt = prompt_of(fake_rt)
    call_text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>'
    assert f"<|im_start|>assistant\n{call_text}<|im_end|>\n<|im_start|>tool\nsunny, 24C<|im_end|>\n" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


def test_each_choice_numbers_its_calls_from_zero(fake_rt):
    fake_rt.engine.script = reply(fake_rt.tokenizer, CALL + "\n" + CALL)
    body = chat(n=2).json()
    for choice in body["choices"]:
        assert len(choice["message"]["tool_calls"]) == 2
    events = chat(n=2, stream=True).events()
    for index in (0, 1):
        mine = [c for c in chunks(events) if c["choices"][0]["index"] == index]
        starts = [tc["index"] for c in mine for tc in c["choices"][0]["delta"].get("tool_calls") or [] if "id" in tc]
        assert starts == [0, 1]


@pytest.mark.parametrize("tool_parser", ["none", "hermes"])
def test_the_tool_call_parser_setting_is_honoured(fake_rt, settings, tool_parser):
    settings.METRALE = {**settings.METRALE, "TOOL_CALL_PARSER": tool_parser}
    fake_rt.engine.script = reply(fake_rt.tokenizer, CALL)
    message = chat().json()["choices"][0]["message"]
    assert ("tool_calls" in message) == (tool_parser == "hermes")
    if tool_parser == "none":
        assert message["content"] == CALL


def test_without_tools_smollm2_output_is_content_as_generated(fake_rt):
    fake_rt.engine.script = reply(fake_rt.tokenizer, CALL)
    body = call("POST", "/v1/chat/completions", {"model": "smollm2-135m-instruct", "messages": USER}).json()
    assert body["choices"][0]["message"]["content"] == CALL
