"""Structured outputs with reasoning on the real SmolLM2 engine in-process: the grammar waits for `</think>`.

A template that opens `<think>` and the `think` parser (test_chat_reasoning.THINKING_TEMPLATE);
the thinking budget makes the engine close the block after 5 tokens, and the JSON schema
constrains only what follows.
"""
import json

import jsonschema
import pytest

from .fake_engine import call

pytestmark = pytest.mark.slow

SCHEMA = {"type": "object", "properties": {"capital": {"type": "string", "maxLength": 20}},
          "required": ["capital"], "additionalProperties": False}


def test_the_schema_constrains_the_answer_after_the_reasoning(real_rt):
    body = call("POST", "/v1/chat/completions", {
        "model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "thinking_token_budget": 5, "max_tokens": 40, "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}}).json()
    message = body["choices"][0]["message"]
    assert message["reasoning_content"]  # free text: the grammar did not apply inside the block
    assert not message["reasoning_content"].lstrip().startswith("{")
    jsonschema.validate(json.loads(message["content"]), SCHEMA)
    assert body["choices"][0]["finish_reason"] == "stop"
