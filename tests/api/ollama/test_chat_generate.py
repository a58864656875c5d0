"""POST /api/chat and /api/generate in-process: the scripted engine's SmolLM2 token ids through the real pipeline
and the whole ASGI stack. NDJSON lines and the blocking object, options onto the engine's controls, format,
think, tools (streamed calls whole and agreeing with the blocking answer), generate's context, raw, template,
suffix and images, loading and unloading with no prompt, logprobs, and a failure after the stream started."""
import re

import pytest

from inference.engine.outputs import Finished, TokenEvent
from inference.operations.registry import process_registry

from ..fake_engine import reply
from ..test_chat_reasoning import THINKING_TEMPLATE
from .support import MODEL, USER, chat, generate, lines, ollama_error

CREATED_AT = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?Z")
METRICS = {"total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count",
           "eval_duration"}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Forecast for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": "3"}}\n</tool_call>'


def params(rt, i=-1):
    return rt.engine.submissions[i].params


def prompt_text(rt, i=-1) -> str:
    return rt.tokenizer.decode(rt.engine.submissions[i].prompt_token_ids, skip_special_tokens=False)


def test_a_chat_streams_ndjson_and_the_blocking_answer_is_its_fold(fake_rt):
    objects = lines(chat(model=f"{MODEL}:latest"))
    *parts, final = objects
    assert [o["done"] for o in objects] == [False] * len(parts) + [True]
    assert all(o["model"] == f"{MODEL}:latest" and CREATED_AT.fullmatch(o["created_at"]) for o in objects)
    assert "".join(o["message"]["content"] for o in parts) == "Hello world"
    assert all(o["message"]["role"] == "assistant" for o in objects)
    assert final["message"] == {"role": "assistant", "content": ""} and final["done_reason"] == "stop"
    assert METRICS <= set(final) and all(isinstance(final[k], int) and final[k] > 0 for k in METRICS)
    assert final["prompt_eval_count"] == len(fake_rt.engine.submissions[0].prompt_token_ids)
    assert final["eval_count"] == 2
    blocking = chat(stream=False)
    assert blocking.status == 200 and blocking.headers["content-type"] == "application/json"
    body = blocking.json()
    assert body["message"] == {"role": "assistant", "content": "Hello world"} and body["done"] is True
    assert body["done_reason"] == "stop" and body["eval_count"] == 2 and METRICS <= set(body)
    assert fake_rt.engine.submissions[0].prompt_token_ids == fake_rt.engine.submissions[1].prompt_token_ids


def test_options_reach_the_engine_and_unknown_ones_are_ignored(fake_rt):
    options = {"num_predict": 7, "temperature": 0.3, "top_k": 5, "top_p": 0.9, "min_p": 0.05, "seed": 42,
               "repeat_penalty": 1.2, "presence_penalty": 0.5, "frequency_penalty": 0.25, "typical_p": 0.7,
               "repeat_last_n": 32, "num_gpu": 1, "num_thread": 4, "use_mmap": False, "mirostat": "anything",
               "tfs_z": [1]}
    assert chat(stream=False, options=options).status == 200
    p = params(fake_rt)
    assert (p.max_tokens, p.temperature, p.top_k, p.top_p, p.min_p, p.seed) == (7, 0.3, 5, 0.9, 0.05, 42)
    assert (p.repetition_penalty, p.presence_penalty, p.frequency_penalty) == (1.2, 0.5, 0.25)
    assert chat(stream=False, options={"seed": -1, "num_predict": -1}).status == 200
    assert params(fake_rt).seed is None
    assert params(fake_rt).max_tokens == 2048 - len(fake_rt.engine.submissions[-1].prompt_token_ids)


def test_stop_strings_end_the_answer(fake_rt):
    body = chat(stream=False, options={"stop": ["world"]}).json()
    assert body["message"]["content"] == "Hello " and body["done_reason"] == "stop"


def test_num_ctx_is_the_request_s_own_context_length(fake_rt):
    chat(stream=False)
    prompt = len(fake_rt.engine.submissions[0].prompt_token_ids)
    assert chat(stream=False, options={"num_ctx": prompt + 5}).status == 200
    assert params(fake_rt).max_tokens == 5
    assert chat(stream=False, options={"num_ctx": prompt + 5, "num_predict": 50}).status == 200
    assert params(fake_rt).max_tokens == 5  # num_predict is cut to the room the context leaves, as Ollama goes on
    assert f"context length is {prompt - 1} tokens" in ollama_error(chat(options={"num_ctx": prompt - 1}), 400)
    assert chat(stream=False, options={"num_ctx": 10**6}).status == 200  # never past the engine's, no reload
    assert params(fake_rt).max_tokens == 2048 - prompt
    older = [{"role": "user", "content": "An older question " * 20}, {"role": "assistant", "content": "An answer."}]
    fitted = chat(stream=False, messages=[*older, *USER], options={"num_ctx": prompt + 5, "num_predict": 5})
    assert fitted.status == 200 and "older question" not in prompt_text(fake_rt)  # truncate: the oldest turn goes
    assert chat(messages=[*older, *USER], options={"num_ctx": prompt + 5, "num_predict": 5},
                truncate=False).status == 400


def test_format_is_the_structured_output_grammar(fake_rt):
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    for fmt in ("json", schema):
        assert chat(stream=False, format=fmt).status == 200
        assert params(fake_rt).structured is not None
    assert chat(stream=False, format="").status == 200 and params(fake_rt).structured is None
    assert "invalid format" in ollama_error(chat(format="yaml"), 400)


def test_think_on_a_model_that_cannot_think_is_a_400_and_off_is_fine(fake_rt):
    assert ollama_error(chat(think=True), 400) == f'"{MODEL}" does not support thinking'
    assert ollama_error(generate(think="high"), 400) == f'"{MODEL}" does not support thinking'
    assert chat(think=False, stream=False).status == 200
    assert "invalid think value" in ollama_error(chat(think="extreme"), 400)


def test_thinking_comes_as_message_thinking_and_a_level_reaches_the_template(fake_rt, monkeypatch):
    monkeypatch.setattr(fake_rt.tokenizer, "chat_template", THINKING_TEMPLATE)
    fake_rt.engine.script = reply(fake_rt.tokenizer, "Two and two make four.\n</think>\n\nThe answer is 4.")
    objects = lines(chat(think="low"))
    assert "effort=low" in prompt_text(fake_rt)
    assert "".join(o["message"].get("thinking", "") for o in objects) == "Two and two make four."
    body = chat(think=True, stream=False).json()
    assert body["message"]["thinking"] == "Two and two make four."
    assert body["message"]["content"] == "The answer is 4."
    generated = generate(think=True, stream=False).json()
    assert generated["thinking"] == "Two and two make four." and generated["response"] == "The answer is 4."
    assert "</think>" not in prompt_text(fake_rt)  # think true: the template opened the block
    chat(think=False, stream=False)
    assert "<think>\n\n</think>" in prompt_text(fake_rt)


def test_tool_calls_come_whole_with_object_arguments_and_streamed_equals_blocking(fake_rt):
    fake_rt.engine.script = reply(fake_rt.tokenizer, CALL)
    objects = lines(chat(tools=[WEATHER]))
    calls = [c for o in objects for c in o["message"].get("tool_calls", [])]
    assert len(calls) == 1 and re.fullmatch(r"call_[a-z0-9]{8}", calls[0]["id"])
    assert calls[0]["function"] == {"index": 0, "name": "get_weather", "arguments": {"city": "Paris", "days": 3}}
    assert objects[-1]["done_reason"] == "stop"
    body = chat(tools=[WEATHER], stream=False).json()
    assert [c["function"] for c in body["message"]["tool_calls"]] == [c["function"] for c in calls]
    assert body["message"]["content"] == "".join(o["message"]["content"] for o in objects)
    assert body["done_reason"] == objects[-1]["done_reason"]


def test_num_predict_reached_after_a_whole_call_sends_it_and_the_reason_is_length(fake_rt):
    """The call is sent, and done_reason still says the limit ended the turn (chat completions' finish_reason
    says tool_calls there, as vLLM's does: OpenAI's clients act on the calls by it)."""
    fake_rt.engine.script = reply(fake_rt.tokenizer, CALL + "\nAnd now the weather in Rome.")
    limit = len(fake_rt.tokenizer.encode(CALL)) + 2
    for stream in (True, False):
        answer = chat(tools=[WEATHER], options={"num_predict": limit}, stream=stream)
        objects = lines(answer) if stream else [answer.json()]
        calls = [c["function"] for o in objects for c in o["message"].get("tool_calls", [])]
        assert calls == [{"index": 0, "name": "get_weather", "arguments": {"city": "Paris", "days": 3}}], stream
        assert (objects[-1]["done_reason"], objects[-1]["eval_count"]) == ("length", limit), stream


def test_a_call_cut_off_by_num_predict_is_not_sent_and_the_reason_is_length(fake_rt):
    fake_rt.engine.script = reply(fake_rt.tokenizer, CALL)
    objects = lines(chat(tools=[WEATHER], options={"num_predict": 12}))
    assert not any(o["message"].get("tool_calls") for o in objects) and objects[-1]["done_reason"] == "length"
    body = chat(tools=[WEATHER], options={"num_predict": 12}, stream=False).json()
    assert "tool_calls" not in body["message"] and body["done_reason"] == "length"


def test_tool_history_and_the_clients_comma_joined_types_are_read(fake_rt):
    typed = {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "string, integer"}}, "required": ["a"]}}}
    history = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "tool_calls": [{"function": {"name": "get_weather",
                                                                  "arguments": {"city": "Paris"}}}]},
               {"role": "tool", "tool_name": "get_weather", "content": "Sunny, 24 C"}]
    assert chat(messages=history, tools=[WEATHER, typed], stream=False).status == 200
    prompt = prompt_text(fake_rt)
    assert '"city": "Paris"' in prompt and "Sunny, 24 C" in prompt and "add" in prompt
    assert chat(tools=[], stream=False).status == 200  # an empty list is no tools


def test_generate_returns_context_that_round_trips(fake_rt):
    first = generate(stream=False).json()
    ids = fake_rt.engine.submissions[0].prompt_token_ids
    assert first["response"] == "Hello world" and first["context"][:len(ids)] == ids
    assert len(first["context"]) == len(ids) + 2
    second = generate(prompt="And again?", context=first["context"], stream=False).json()
    assert fake_rt.engine.submissions[1].prompt_token_ids[:len(first["context"])] == first["context"]
    assert second["context"][:len(first["context"])] == first["context"]
    streamed = lines(generate())
    assert "".join(o["response"] for o in streamed) == "Hello world" and "context" in streamed[-1]
    assert "out of range" in ollama_error(generate(context=[10**9]), 400)


def test_generate_system_raw_template_suffix_and_images(fake_rt):
    generate(system="Be brief.", stream=False)
    assert "<|im_start|>system\nBe brief.<|im_end|>" in prompt_text(fake_rt)
    raw = generate(prompt="abc", raw=True, stream=False).json()
    assert fake_rt.engine.submissions[-1].prompt_token_ids == fake_rt.tokenizer.encode("abc", add_special_tokens=True)
    assert "context" not in raw
    assert ollama_error(generate(raw=True, system="x"), 400) == "raw mode does not support template, system, or context"
    generate(template="{{ if .System }}S={{ .System }};{{ end }}P={{ .Prompt }};R={{ .Response }}", system="sys",
             stream=False)
    assert prompt_text(fake_rt) == "S=sys;P=hi;R="
    assert "range" in ollama_error(generate(template="{{ range .Messages }}{{ end }}"), 400)
    assert ollama_error(generate(suffix="tail"), 400).startswith(f'"{MODEL}" does not support insert')
    assert "vision" in ollama_error(generate(images=["aGk="]), 400)
    assert "vision" in ollama_error(chat(messages=[{"role": "user", "content": "x", "images": ["aGk="]}]), 400)


def test_no_messages_or_prompt_loads_the_model_and_keep_alive_0_unloads_it(fake_rt):
    loaded = chat(messages=[])
    assert loaded.headers["content-type"] == "application/json"
    assert loaded.json()["message"] == {"role": "assistant", "content": ""}
    assert loaded.json()["done"] is True and loaded.json()["done_reason"] == "load"
    assert generate(prompt="").json()["done_reason"] == "load" and "response" not in generate(prompt="").json()
    assert not fake_rt.engine.submissions
    assert generate(prompt="", keep_alive=0).json()["done_reason"] == "unload"
    assert process_registry().entries[MODEL].keep_alive_s == 0
    assert chat(messages=[], keep_alive="5m").json()["done_reason"] == "load"
    assert process_registry().entries[MODEL].keep_alive_s == 300


def test_logprobs_of_the_content_tokens(fake_rt):
    body = chat(stream=False, logprobs=True, top_logprobs=2).json()
    tokens = body["logprobs"]
    assert "".join(t["token"] for t in tokens) == "Hello world"
    assert all(t["logprob"] == -0.25 and len(t["top_logprobs"]) == 2 and bytes(t["bytes"]).decode() == t["token"]
               for t in tokens)
    assert "logprobs" not in chat(stream=False).json()
    assert "at most 20" in ollama_error(chat(logprobs=True, top_logprobs=21), 400)


def test_a_failure_after_the_stream_started_is_a_last_error_line_and_a_500_when_blocking(fake_rt):
    fake_rt.engine.script = reply(fake_rt.tokenizer, "Hello world", fail="the engine broke")
    objects = lines(chat())
    assert objects[-1] == {"error": "the engine broke"} and all(o["done"] is False for o in objects[:-1])
    assert ollama_error(chat(stream=False), 500) == "the engine broke"


def test_the_length_limit_is_done_reason_length(fake_rt):
    def script(prompt_ids, p, index):
        ids = fake_rt.tokenizer.encode("Hello world")
        return [TokenEvent(ids[0], None), Finished("length", len(prompt_ids), 1, 0.0, 0.0)]

    fake_rt.engine.script = script
    assert chat(stream=False).json()["done_reason"] == "length"
    assert lines(generate())[-1]["done_reason"] == "length"


@pytest.mark.parametrize("path", ["/api/chat", "/api/generate"])
def test_the_model_is_required_and_named_in_the_404(fake_rt, path):
    from ..fake_engine import call

    assert ollama_error(call("POST", path, {"prompt": "hi"}), 400) == "model is required"
    assert ollama_error(call("POST", path, {"model": "nope", "prompt": "hi"}), 404) == "model 'nope' not found"
