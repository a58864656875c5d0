"""Every request field with in-range, edge and bad values: bad ones are a 400 whose `param` names the field,
good ones are served, and none is a 500. Runs the whole stack against a scripted engine."""
import json

import pytest

from .fake_engine import call

USER = [{"role": "user", "content": "hi"}]
ASKED = {"role": "assistant", "content": None, "tool_calls": [
    {"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in (1, 2)]}
OK = "ok"

# (field values merged into a chat body, expected: OK or the 400's param)
CHAT = [
    ({"model": "smollm2-135m-instruct"}, OK), ({"model": ""}, OK), ({"model": 5}, "model"), ({"model": None}, "model"),
    ({"messages": []}, "messages"), ({"messages": "hi"}, "messages"), ({"messages": None}, "messages"),
    ({"messages": [5]}, "messages[0]"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "function", "content": "x", "name": "f"}]}, "messages[0].role"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
    ({"messages": [{"role": "tool", "content": "x", "tool_call_id": ""}]}, "messages[0].tool_call_id"),
    # A tool message answers a call of the assistant message before its run of tool messages, by id (OpenAI's 400s).
    ({"messages": [{"role": "tool", "content": "x", "tool_call_id": "nope"}]}, "messages[0].role"),
    ({"messages": [*USER, {"role": "tool", "content": "x", "tool_call_id": "c1"}]}, "messages[1].role"),
    ({"messages": [*USER, ASKED, {"role": "tool", "content": "x", "tool_call_id": "c3"}]}, "messages[2].tool_call_id"),
    ({"messages": [*USER, ASKED, {"role": "tool", "content": "x", "tool_call_id": "c1"}, *USER,
                   {"role": "tool", "content": "y", "tool_call_id": "c2"}]}, "messages[4].role"),
    ({"messages": [*USER, ASKED, {"role": "tool", "content": "x", "tool_call_id": "c2"},
                   {"role": "tool", "content": "y", "tool_call_id": "c1"}]}, OK),
    ({"messages": [*USER, {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f"}}]},
                   {"role": "tool", "content": "x", "tool_call_id": "any"}]}, OK),  # a call without an id
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}]},
     "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]},
     "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text"),
    ({"messages": [{"role": "user", "content": [{"text": "x"}]}]}, "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": "x", "name": 5}]}, "messages[0].name"),
    ({"messages": [{"role": "assistant", "tool_calls": "x"}]}, "messages[0].tool_calls"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "c"}]}]}, "messages[0].tool_calls[0].function"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant"}]}, OK),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"}]}, OK),
    ({"messages": [{"role": "developer", "content": [{"type": "text", "text": "be brief"}]},
                   {"role": "user", "content": [{"type": "text", "text": "hi"}]}]}, OK),
    ({"stream": True}, OK), ({"stream": False}, OK), ({"stream": "yes"}, "stream"), ({"stream": 1}, "stream"),
    ({"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}, OK),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"stream": True, "stream_options": {"include_usage": "x"}}, "stream_options.include_usage"),
    ({"stream": True, "stream_options": 5}, "stream_options"),
    ({"n": 1}, OK), ({"n": 128, "max_tokens": 1}, OK), ({"n": 0}, "n"), ({"n": 129}, "n"), ({"n": 1.5}, "n"),
    ({"n": "2"}, "n"),
    ({"max_tokens": 1}, OK), ({"max_tokens": 100}, OK), ({"max_tokens": 5.0}, OK), ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": -1}, "max_tokens"), ({"max_tokens": "10"}, "max_tokens"), ({"max_tokens": 1.5}, "max_tokens"),
    ({"max_tokens": 10**6}, "messages"),
    ({"max_completion_tokens": 1}, OK), ({"max_completion_tokens": 0}, "max_completion_tokens"),
    ({"max_completion_tokens": -3}, "max_completion_tokens"),
    ({"temperature": 0}, OK), ({"temperature": 2}, OK), ({"temperature": 0.7}, OK), ({"temperature": None}, OK),
    ({"temperature": -0.1}, "temperature"), ({"temperature": 2.01}, "temperature"),
    ({"temperature": "hot"}, "temperature"), ({"temperature": True}, "temperature"),
    ({"top_p": 1}, OK), ({"top_p": 0.01}, OK), ({"top_p": 0}, "top_p"), ({"top_p": 1.1}, "top_p"),
    ({"top_p": -1}, "top_p"),
    ({"top_k": -1}, OK), ({"top_k": 0}, OK), ({"top_k": 50}, OK), ({"top_k": -2}, "top_k"), ({"top_k": 1.5}, "top_k"),
    ({"min_p": 0}, OK), ({"min_p": 1}, OK), ({"min_p": -0.1}, "min_p"), ({"min_p": 1.1}, "min_p"),
    ({"top_n_sigma": -1}, OK), ({"top_n_sigma": 0}, OK), ({"top_n_sigma": 2}, OK),
    ({"top_n_sigma": -2}, "top_n_sigma"), ({"top_n_sigma": "x"}, "top_n_sigma"),
    ({"repetition_penalty": 1}, OK), ({"repetition_penalty": 2}, OK), ({"repetition_penalty": 0.5}, OK),
    ({"repetition_penalty": 0}, "repetition_penalty"), ({"repetition_penalty": 2.1}, "repetition_penalty"),
    ({"repetition_penalty": -1}, "repetition_penalty"),
    ({"presence_penalty": -2}, OK), ({"presence_penalty": 2}, OK), ({"presence_penalty": 0}, OK),
    ({"presence_penalty": -2.1}, "presence_penalty"), ({"presence_penalty": 2.1}, "presence_penalty"),
    ({"frequency_penalty": -2}, OK), ({"frequency_penalty": 2}, OK),
    ({"frequency_penalty": -2.1}, "frequency_penalty"), ({"frequency_penalty": 2.1}, "frequency_penalty"),
    ({"dry_multiplier": 0}, OK), ({"dry_multiplier": 0.8}, OK), ({"dry_multiplier": -0.1}, "dry_multiplier"),
    ({"dry_base": 1}, OK), ({"dry_base": 1.75}, OK), ({"dry_base": 0.5}, "dry_base"),
    ({"dry_allowed_length": 0}, OK), ({"dry_allowed_length": 2}, OK),
    ({"dry_allowed_length": -1}, "dry_allowed_length"), ({"dry_allowed_length": 1.5}, "dry_allowed_length"),
    ({"dry_penalty_last_n": -1}, OK), ({"dry_penalty_last_n": 0}, OK), ({"dry_penalty_last_n": 64}, OK),
    ({"dry_penalty_last_n": -2}, "dry_penalty_last_n"),
    ({"dry_sequence_breakers": ["\n"], "dry_multiplier": 0.5}, OK), ({"dry_sequence_breakers": []}, OK),
    ({"dry_sequence_breakers": "x"}, "dry_sequence_breakers"), ({"dry_sequence_breakers": [1]}, "dry_sequence_breakers"),
    ({"logit_bias": {"1": 100}}, OK), ({"logit_bias": {"1": -100}}, OK), ({"logit_bias": {}}, OK),
    ({"logit_bias": {"a": 1}}, "logit_bias"), ({"logit_bias": {"1.5": 1}}, "logit_bias"),
    ({"logit_bias": {"-1": 1}}, "logit_bias"), ({"logit_bias": {"1": 100.5}}, "logit_bias"),
    ({"logit_bias": {"1": -101}}, "logit_bias"), ({"logit_bias": {"1": "x"}}, "logit_bias"),
    ({"logit_bias": [1]}, "logit_bias"), ({"logit_bias": {"999999": 1}}, "logit_bias"),
    ({"min_tokens": 0}, OK), ({"min_tokens": 5, "max_tokens": 10}, OK), ({"min_tokens": -1}, "min_tokens"),
    ({"min_tokens": 20, "max_tokens": 10}, "min_tokens"),
    ({"seed": 0}, OK), ({"seed": -5}, OK), ({"seed": 2**63 - 1}, OK), ({"seed": 2**63}, "seed"),
    ({"seed": "1"}, "seed"), ({"seed": 1.5}, "seed"),
    ({"ignore_eos": True}, OK), ({"ignore_eos": "true"}, "ignore_eos"),
    ({"stop": "x"}, OK), ({"stop": ["a", "b", "c", "d"]}, OK), ({"stop": None}, OK), ({"stop": []}, OK),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"), ({"stop": 5}, "stop"), ({"stop": [1]}, "stop"),
    ({"stop_token_ids": [1, 2]}, OK), ({"stop_token_ids": []}, OK), ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"stop_token_ids": "1"}, "stop_token_ids"), ({"stop_token_ids": [999999]}, "stop_token_ids"),
    ({"include_stop_str_in_output": True}, OK), ({"include_stop_str_in_output": 1}, "include_stop_str_in_output"),
    ({"logprobs": True}, OK), ({"logprobs": False}, OK), ({"logprobs": "yes"}, "logprobs"),
    ({"logprobs": True, "top_logprobs": 0}, OK), ({"logprobs": True, "top_logprobs": 20}, OK),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"), ({"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ({"top_logprobs": 5}, "top_logprobs"), ({"logprobs": False, "top_logprobs": 5}, "top_logprobs"),
    ({"return_token_ids": True}, OK), ({"return_token_ids": "x"}, "return_token_ids"),
    ({"timeout": 0.5}, OK), ({"timeout": 30}, OK), ({"timeout": 0}, "timeout"), ({"timeout": -1}, "timeout"),
    ({"timeout": "5"}, "timeout"),
    ({"user": "u-1"}, OK), ({"user": 5}, "user"),
    ({"metadata": {"a": "b"}}, OK), ({"metadata": {"a": 1}}, "metadata"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"), ({"metadata": "x"}, "metadata"),
    ({"service_tier": "auto"}, OK), ({"service_tier": "flex"}, OK), ({"service_tier": "gold"}, "service_tier"),
    ({"store": True}, OK), ({"store": "yes"}, "store"),
    ({"echo": True}, OK), ({"echo": 1}, "echo"),
    ({"add_generation_prompt": False}, OK), ({"add_generation_prompt": "no"}, "add_generation_prompt"),
    ({"continue_final_message": True, "add_generation_prompt": False}, OK),
    ({"continue_final_message": True, "add_generation_prompt": True}, "continue_final_message"),
    ({"continue_final_message": "x"}, "continue_final_message"),
    ({"chat_template_kwargs": {"enable_thinking": False}}, OK), ({"chat_template_kwargs": "x"}, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"tools": []}}, "chat_template_kwargs"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, OK), ({"tools": "x"}, "tools"),
    ({"tools": [1]}, "tools[0]"), ({"tool_choice": "auto"}, OK),
    ({"parallel_tool_calls": True}, OK), ({"parallel_tool_calls": "x"}, "parallel_tool_calls"),
    ({"response_format": {"type": "text"}}, OK), ({"response_format": {"type": "json_object"}}, OK),
    ({"response_format": "x"}, "response_format"), ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}, "response_format.json_schema.name"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "s"}}}, "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object"}}}}, OK),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "strin"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"uniqueItems": True}}}},
     "response_format.json_schema.schema"),
    ({"structured_outputs": {"regex": "[0-9]+"}}, OK), ({"structured_outputs": {"regex": "(("}}, "structured_outputs.regex"),
    ({"structured_outputs": {"choice": ["a", "b"]}}, OK), ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
    ({"structured_outputs": {"grammar": 'root ::= "yes" | "no"'}}, OK),
    ({"structured_outputs": {"grammar": "start: nothing"}}, "structured_outputs.grammar"),
    ({"structured_outputs": {"json": {"type": "object"}}}, OK), ({"structured_outputs": {"json": "{"}}, "structured_outputs.json"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
    ({"structured_outputs": {"whitespace_pattern": " "}}, "structured_outputs.whitespace_pattern"),
    ({"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}}, "structured_outputs"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
      "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
    ({"prediction": None}, OK), ({"prediction": {"type": "content", "content": "x"}}, OK),
    ({"prediction": {"type": "content", "content": [{"type": "text", "text": "x"}]}}, OK),
    ({"prediction": "x"}, "prediction"), ({"prediction": {"type": "audio", "content": "x"}}, "prediction.type"),
    ({"prediction": {"type": "content"}}, "prediction.content"),
    ({"prediction": {"type": "content", "content": []}}, "prediction.content"),
    ({"prediction": {"type": "content", "content": [{"type": "image_url"}]}}, "prediction.content[0].type"),
    ({"prediction": {"type": "content", "content": [{"type": "text", "text": 3}]}}, "prediction.content[0].text"),
    ({"prediction": {"type": "content", "content": "x"}, "n": 2}, "n"),
    ({"prediction": {"type": "content", "content": "x"}, "logprobs": True}, "logprobs"),
    ({"prediction": {"type": "content", "content": "x"}, "presence_penalty": 0.5}, "presence_penalty"),
    ({"prediction": {"type": "content", "content": "x"}, "frequency_penalty": 0.1}, "frequency_penalty"),
    ({"prediction": {"type": "content", "content": "x"}, "presence_penalty": -0.5}, OK),
    ({"prediction": {"type": "content", "content": "x"},
      "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
    ({"prediction": {"type": "content", "content": "x"},
      "functions": [{"name": "f", "parameters": {}}]}, "functions"),
    # The deprecated forms of tools / tool_choice: refused by name, not ignored (a forced call went unmade).
    ({"functions": [{"name": "f", "parameters": {}}]}, "functions"), ({"functions": []}, "functions"),
    ({"function_call": "auto"}, "function_call"), ({"function_call": {"name": "f"}}, "function_call"),
    ({"audio": {"voice": "alloy", "format": "mp3"}}, "audio"),
    ({"modalities": ["text"]}, OK), ({"modalities": ["text", "audio"]}, "modalities"),
    ({"web_search_options": {}}, "web_search_options"),
    ({"frobnicate": 1}, OK),
]

COMPLETIONS = [
    ({"prompt": "x"}, OK), ({"prompt": ["a", "b"]}, OK), ({"prompt": [1, 2]}, OK), ({"prompt": [[1], [2, 3]]}, OK),
    ({"prompt": ""}, OK), ({"prompt": []}, "prompt"), ({"prompt": 5}, "prompt"), ({"prompt": None}, "prompt"),
    ({"prompt": [1, "a"]}, "prompt"), ({"prompt": [[]]}, "prompt"), ({"prompt": [[1], ["a"]]}, "prompt"),
    ({"prompt": [-1]}, "prompt"), ({"prompt": [10**9]}, "prompt"), ({}, "prompt"),
    ({"prompt": "x", "suffix": "y"}, "suffix"), ({"prompt": "x", "suffix": 5}, "suffix"),
    ({"prompt": "x", "suffix": None}, OK),
    ({"prompt": "x", "echo": True}, OK), ({"prompt": "x", "echo": 1}, "echo"),
    ({"prompt": "x", "logprobs": 0}, OK), ({"prompt": "x", "logprobs": 20}, OK), ({"prompt": "x", "logprobs": 21}, "logprobs"),
    ({"prompt": "x", "logprobs": -1}, "logprobs"), ({"prompt": "x", "logprobs": True}, "logprobs"),
    ({"prompt": "x", "echo": True, "logprobs": 3}, OK),
    ({"prompt": "x", "best_of": 1}, OK), ({"prompt": "x", "best_of": 0}, "best_of"), ({"prompt": "x", "best_of": 3}, "best_of"),
    ({"prompt": "x", "n": 3, "best_of": 2}, "best_of"),
    ({"prompt": "x", "temperature": 3}, "temperature"), ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop"), ({"prompt": "x", "n": 129}, "n"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
    ({"prompt": "x", "logit_bias": {"x": 1}}, "logit_bias"), ({"prompt": "x", "seed": 3, "n": 2}, OK),
    ({"prompt": "x", "max_tokens": 10**6}, "prompt"),
    ({"prompt": "x", "response_format": {"type": "json_object"}}, OK),
    ({"prompt": "x", "structured_outputs": {"choice": ["yes", "no"]}}, OK),
    ({"prompt": "x", "structured_outputs": {"json": {"type": "array", "contains": {}}}}, "structured_outputs.json"),
]


def check(path: str, body: dict, expected: str):
    answer = call("POST", path, body)
    assert answer.status != 500, answer.body
    if expected == OK:
        assert answer.status == 200, answer.body
        return
    assert answer.status == 400, answer.body
    err = answer.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["message"]
    assert err["param"] == expected, err


@pytest.mark.parametrize("fields, expected", CHAT, ids=[json.dumps(f)[:60] for f, _ in CHAT])
def test_chat_field(fake_rt, fields, expected):
    check("/v1/chat/completions", {"model": "smollm2-135m-instruct", "messages": USER, **fields}, expected)


@pytest.mark.parametrize("fields, expected", COMPLETIONS, ids=[json.dumps(f)[:60] for f, _ in COMPLETIONS])
def test_completions_field(fake_rt, fields, expected):
    check("/v1/completions", {"model": "smollm2-135m-instruct", **fields}, expected)


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b"", b"null", "{\"messages\": \"\u00e9\"}".encode("latin-1"),
                                 b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}'])
def test_bodies_that_are_not_a_json_object_or_not_finite_are_400(fake_rt, raw):
    answer = call("POST", "/v1/chat/completions", raw=raw)
    assert answer.status == 400
    assert set(answer.json()["error"]) == {"message", "type", "param", "code"}
