"""Reasoning on POST /v1/chat/completions: a thinking chat template on the SmolLM2 tokenizer, scripted SmolLM2
token ids through the real pipeline, and the thinking controls reaching the template and the engine."""
import json

import pytest

from inference.engine.reasoning import ReasoningSpec

from .fake_engine import call, reply

USER = [{"role": "user", "content": "What is 2 + 2?"}]
# A Qwen3-style template: the generation prompt opens <think> unless enable_thinking is false.
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if reasoning_effort is defined %}effort={{ reasoning_effort }}\n{% endif %}"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}{% endif %}")


@pytest.fixture
def thinking_rt(fake_rt, monkeypatch):
    monkeypatch.setattr(fake_rt.tokenizer, "chat_template", THINKING_TEMPLATE)
    return fake_rt


def chat(**body):
    return call("POST", "/v1/chat/completions", {"model": "smollm2-135m-instruct", "messages": USER, **body})


def prompt_of(rt, i=-1) -> str:
    return rt.tokenizer.decode(rt.engine.submissions[i].prompt_token_ids, skip_special_tokens=False)


def spec_of(rt, i=-1) -> ReasoningSpec | None:
    return rt.engine.submissions[i].params.reasoning


def budget_of(rt, i=-1) -> int | None:
    """The reasoning cap the engine got (None: no cap, or no reasoning at all)."""
    spec = spec_of(rt, i)
    return spec.budget_tokens if spec is not None else None


def test_a_prompt_opened_block_is_reasoning_content_and_counts_reasoning_tokens(thinking_rt):
    tok = thinking_rt.tokenizer
    thinking_rt.engine.script = reply(tok, "Two and two make four.\n</think>\n\nThe answer is 4.")
    body = chat().json()
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] == message["reasoning"] == "Two and two make four."
    assert message["content"] == "The answer is 4."
    reasoning_ids = tok.encode("Two and two make four.\n</think>")
    details = body["usage"]["completion_tokens_details"]
    assert details["reasoning_tokens"] == len(reasoning_ids)  # the close tag counts as reasoning
    assert spec_of(thinking_rt) is not None and budget_of(thinking_rt) is None  # no cap asked for


def test_streamed_reasoning_comes_under_both_keys_before_the_content(thinking_rt):
    thinking_rt.engine.script = reply(thinking_rt.tokenizer, "Two and two make four.</think>The answer is 4.")
    events = chat(stream=True, stream_options={"include_usage": True}).events()
    deltas = [e["choices"][0]["delta"] for e in events if isinstance(e, dict) and e.get("choices")]
    reasoning = [d for d in deltas if "reasoning_content" in d]
    assert all(d["reasoning_content"] == d["reasoning"] for d in reasoning)
    assert "".join(d["reasoning_content"] for d in reasoning) == "Two and two make four."
    assert "".join(d.get("content") or "" for d in deltas) == "The answer is 4."
    last_reasoning = max(i for i, d in enumerate(deltas) if "reasoning_content" in d)
    first_content = min(i for i, d in enumerate(deltas) if d.get("content"))
    assert last_reasoning < first_content
    usage = events[-2]["usage"]
    assert usage["completion_tokens_details"]["reasoning_tokens"] > 0


def test_a_budget_reaches_the_engine_with_the_close_tag_ids(thinking_rt):
    tok = thinking_rt.tokenizer
    chat(thinking_token_budget=16)
    assert spec_of(thinking_rt) == ReasoningSpec(tuple(tok.encode("<think>")), tuple(tok.encode("</think>")),
                                                 starts_in_reasoning=True, budget_tokens=16)


@pytest.mark.parametrize("fields, enabled, cap", [
    ({"thinking": {"type": "disabled"}, "thinking_token_budget": 50}, False, 0),
    ({"thinking": {"type": "enabled", "budget_tokens": 30}, "reasoning_effort": "none"}, True, 30),
    ({"thinking_token_budget": 0, "reasoning_effort": "high"}, False, 0),
    ({"max_thinking_tokens": 12}, True, 12),
    ({"thinking_budget": 7}, True, 7),
    ({"reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": True}}, False, 0),
    ({"reasoning_effort": "low"}, True, None),
    ({"chat_template_kwargs": {"enable_thinking": False}}, False, 0),
    ({}, True, None),
])
def test_thinking_controls_by_priority(thinking_rt, fields, enabled, cap):
    assert chat(**fields).status == 200
    prompt = prompt_of(thinking_rt)
    assert prompt.endswith("<think>\n") == enabled
    assert prompt.endswith("<think>\n\n</think>\n\n") != enabled
    assert budget_of(thinking_rt) == cap
    assert spec_of(thinking_rt).starts_in_reasoning == enabled


def test_reasoning_effort_reaches_the_template(thinking_rt):
    chat(reasoning_effort="medium")
    assert prompt_of(thinking_rt).endswith("<|im_start|>assistant\neffort=medium\n<think>\n")


def test_text_before_the_end_of_reasoning_is_never_a_call(thinking_rt):
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    call_text = '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    thinking_rt.engine.script = reply(thinking_rt.tokenizer, f"Maybe {call_text}?</think>{call_text}")
    body = chat(tools=tools).json()
    choice = body["choices"][0]
    assert [c["function"]["name"] for c in choice["message"]["tool_calls"]] == ["get_time"]
    assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == {}
    assert choice["message"]["reasoning_content"].startswith("Maybe")
    assert choice["finish_reason"] == "tool_calls"


def test_a_model_without_reasoning_gets_no_parser_and_no_cap(fake_rt):
    fake_rt.engine.script = reply(fake_rt.tokenizer, "<think>hm</think>4")
    body = chat(thinking_token_budget=8).json()
    assert body["choices"][0]["message"]["content"] == "<think>hm</think>4"
    assert spec_of(fake_rt) is None


def test_the_reasoning_parser_setting_is_honoured(fake_rt, settings):
    settings.METRALE = {**settings.METRALE, "REASONING_PARSER": "think"}
    fake_rt.engine.script = reply(fake_rt.tokenizer, "<think>hm</think>4")
    message = chat(thinking_token_budget=8).json()["choices"][0]["message"]
    assert message["reasoning_content"] == "hm" and message["content"] == "4"
    assert budget_of(fake_rt) == 8 and not spec_of(fake_rt).starts_in_reasoning


def test_token_ids_cover_every_token_and_logprobs_only_content_tokens(thinking_rt):
    tok = thinking_rt.tokenizer
    text = "Two and two make four.\n</think>\n\nThe answer is 4."
    thinking_rt.engine.script = reply(tok, text)
    events = chat(stream=True, return_token_ids=True, logprobs=True).events()
    choices = [e["choices"][0] for e in events if isinstance(e, dict) and e.get("choices")]
    assert [i for c in choices for i in c.get("token_ids") or []] == tok.encode(text)
    entries = [e for c in choices if c["logprobs"] for e in c["logprobs"]["content"]]
    assert "".join(e["token"] for e in entries) == "\n\nThe answer is 4."
    body = chat(logprobs=True).json()
    assert "".join(e["token"] for e in body["choices"][0]["logprobs"]["content"]) == "\n\nThe answer is 4."
