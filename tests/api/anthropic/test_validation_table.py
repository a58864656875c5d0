"""Every /v1/messages field with good, edge and bad values: bad ones are a 400 invalid_request_error in Anthropic's
shape whose message names the field, good ones are served, none is a 500. The whole stack, a scripted engine."""
import pytest

from anthropic_api import signatures

from ..fake_engine import call
from .support import USER

OK = "ok"
TOOL = {"name": "f", "input_schema": {"type": "object", "properties": {"x": {"type": "integer"}}}}


def user(*blocks):
    return [{"role": "user", "content": list(blocks)}]


def assistant(*blocks):
    return [*USER, {"role": "assistant", "content": list(blocks)}, *USER]


def answering(*blocks):
    """A user message of `blocks` after an assistant message that called tool_use "t"."""
    return [*USER, {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
            *user(*blocks)]


# (fields merged into a minimal body, expected: OK, or a text the 400's message must contain)
CASES = [
    ({"model": "smollm2-135m-instruct"}, OK), ({"model": 5}, "model"), ({"model": None}, "model"),
    ({"max_tokens": 1}, OK), ({"max_tokens": 0}, OK), ({"max_tokens": 64.0}, OK),
    ({"max_tokens": -1}, "max_tokens"), ({"max_tokens": "8"}, "max_tokens"), ({"max_tokens": 1.5}, "max_tokens"),
    ({"max_tokens": None}, "max_tokens"), ({"max_tokens": 10**6}, "context length"),
    ({"messages": []}, "messages"), ({"messages": "hi"}, "messages"), ({"messages": [5]}, "messages[0]"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": ""}]}, OK),
    ({"messages": [{"role": "system", "content": "be brief"}, *USER]}, OK),
    ({"messages": [{"role": "ctx", "content": "x"}, {"role": "msg", "content": "y"}]}, OK),
    ({"messages": [*USER, *USER]}, OK),
    ({"messages": [*USER, {"role": "assistant", "content": "The answer is"}]}, OK),
    ({"messages": [*USER, {"role": "assistant", "content": "ends in space "}]}, "trailing whitespace"),
    ({"messages": user({"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}})}, OK),
    ({"messages": user({"type": "text"})}, "messages[0].content[0].text"),
    ({"messages": user({"text": "x"})}, "messages[0].content[0]"),
    ({"messages": user({"type": "image", "source": {"type": "url", "url": "http://x/y.png"}})}, "'image'"),
    ({"messages": user({"type": "document", "source": {}})}, "'document'"),
    ({"messages": user({"type": "server_tool_use", "id": "x", "name": "web_search", "input": {}})},
     "'server_tool_use'"),
    ({"messages": user({"type": "tool_use", "id": "t", "name": "f", "input": {}})}, "user message cannot"),
    ({"messages": answering({"type": "tool_result", "tool_use_id": "t", "content": "1"})}, OK),
    ({"messages": answering({"type": "tool_result", "tool_use_id": "t"})}, OK),
    ({"messages": answering({"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "1"}],
                             "is_error": True})}, OK),
    # A tool_result answers a tool_use of the message just before (Anthropic's 400 and its words).
    ({"messages": user({"type": "tool_result", "tool_use_id": "t", "content": "1"})},
     "messages[0].content[0]: unexpected `tool_use_id` found in `tool_result` blocks: t."),
    ({"messages": answering({"type": "text", "text": "x"}, {"type": "tool_result", "tool_use_id": "u"})},
     "messages[2].content[1]: unexpected `tool_use_id` found in `tool_result` blocks: u."),
    ({"messages": [*answering({"type": "tool_result", "tool_use_id": "t"}), {"role": "assistant", "content": "ok"},
                   *user({"type": "tool_result", "tool_use_id": "t"})]}, "messages[4].content[0]: unexpected"),
    # Consecutive messages of one role are one turn (Anthropic combines them): calls and results may be split.
    ({"messages": [*USER, {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]},
                   {"role": "assistant", "content": [{"type": "tool_use", "id": "b", "name": "f", "input": {}}]},
                   *user({"type": "tool_result", "tool_use_id": "b"}),
                   *user({"type": "tool_result", "tool_use_id": "a"})]}, OK),
    ({"messages": [*answering({"type": "text", "text": "x"}), *user({"type": "tool_result", "tool_use_id": "t"})]},
     OK),
    ({"messages": [*USER, {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
                   {"role": "assistant", "content": "x"}, *user({"type": "tool_result", "tool_use_id": "t"})]}, OK),
    ({"messages": user({"type": "tool_result", "content": "1"})}, "messages[0].content[0].tool_use_id"),
    ({"messages": user({"type": "tool_result", "tool_use_id": "t", "content": 5})}, "messages[0].content[0].content"),
    ({"messages": user({"type": "tool_result", "tool_use_id": "t", "content": [
        {"type": "image", "source": {}}]})}, "'image'"),
    ({"messages": user({"type": "tool_result", "tool_use_id": "t", "content": [
        {"type": "tool_use", "id": "x", "name": "f", "input": {}}]})}, "a tool_result's content cannot"),
    ({"messages": user({"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text"}]})},
     "messages[0].content[0].content[0].text"),
    ({"messages": user({"type": "tool_result", "tool_use_id": "t", "content": "1", "is_error": "yes"})},
     "is_error"),
    ({"messages": assistant({"type": "tool_use", "id": "t", "name": "f", "input": {"x": 1}})}, OK),
    ({"messages": assistant({"type": "tool_use", "id": "t", "name": "f", "input": "x"})}, "messages[1].content[0].input"),
    ({"messages": assistant({"type": "tool_use", "id": "t", "name": "bad name", "input": {}})},
     "messages[1].content[0].name"),
    ({"messages": assistant({"type": "tool_use", "id": "", "name": "f", "input": {}})}, "messages[1].content[0].id"),
    ({"messages": assistant({"type": "tool_result", "tool_use_id": "t"})}, "an assistant message cannot"),
    ({"messages": assistant({"type": "thinking", "thinking": "hm", "signature": signatures.sign("hm")},
                            {"type": "text", "text": "4"})}, OK),
    ({"messages": assistant({"type": "thinking", "thinking": "hm", "signature": "forged"})}, "signature"),
    ({"messages": assistant({"type": "thinking", "thinking": 5, "signature": "x"})}, "messages[1].content[0].thinking"),
    ({"messages": assistant({"type": "redacted_thinking", "data": "opaque"})}, OK),
    ({"messages": assistant({"type": "redacted_thinking"})}, "messages[1].content[0].data"),
    ({"system": "be brief"}, OK), ({"system": [{"type": "text", "text": "be brief"}]}, OK), ({"system": None}, OK),
    ({"system": 5}, "system"), ({"system": [{"type": "image", "source": {}}]}, "system[0]"),
    ({"system": [{"type": "text"}]}, "system[0].text"),
    ({"stop_sequences": ["\n\n", "END"]}, OK), ({"stop_sequences": []}, OK), ({"stop_sequences": [""]}, OK),
    ({"stop_sequences": "END"}, "stop_sequences"), ({"stop_sequences": [5]}, "stop_sequences"),
    ({"stop_sequences": ["x"] * 65}, "stop_sequences"),
    ({"temperature": 0}, OK), ({"temperature": 1}, OK), ({"temperature": 0.5}, OK), ({"temperature": 1.01}, "temperature"),
    ({"temperature": -0.1}, "temperature"), ({"temperature": "hot"}, "temperature"), ({"temperature": True}, "temperature"),
    ({"top_p": 1}, OK), ({"top_p": 0.01}, OK), ({"top_p": 0}, "top_p"), ({"top_p": 1.5}, "top_p"),
    ({"top_k": 0}, OK), ({"top_k": 40}, OK), ({"top_k": -1}, OK), ({"top_k": -2}, "top_k"), ({"top_k": 2.5}, "top_k"),
    ({"min_p": 0.1}, OK), ({"min_p": 2}, "min_p"), ({"repetition_penalty": 1.1}, OK),
    ({"repetition_penalty": 0}, "repetition_penalty"), ({"seed": 7}, OK), ({"seed": 2**64}, "seed"),
    ({"min_tokens": 2}, OK), ({"min_tokens": 100}, "min_tokens"), ({"logit_bias": {"5": 1}}, OK),
    ({"logit_bias": {"x": 1}}, "logit_bias"), ({"stop_token_ids": [2]}, OK), ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"stream": True}, OK), ({"stream": "yes"}, "stream"),
    ({"metadata": {"user_id": "u-1"}}, OK), ({"metadata": {"user_id": None}}, OK), ({"metadata": {}}, OK),
    ({"metadata": {"user_id": 5}}, "metadata.user_id"), ({"metadata": {"user_id": "x" * 257}}, "metadata.user_id"),
    ({"metadata": "u"}, "metadata"),
    ({"service_tier": "auto"}, OK), ({"service_tier": "standard_only"}, OK), ({"service_tier": 5}, "service_tier"),
    ({"output_config": {"effort": "high"}}, OK), ({"output_config": {"effort": 5}}, "output_config.effort"),
    ({"output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}}, OK),
    ({"output_config": {"format": {"type": "json_schema"}}}, "output_config.format"),
    ({"output_config": {"format": {"type": "json_schema", "schema": 5}}}, "output_config.format.schema"),
    ({"output_config": "high"}, "output_config"),
    ({"tools": [TOOL]}, OK), ({"tools": []}, OK),
    ({"tools": [{**TOOL, "description": "does f", "cache_control": {"type": "ephemeral"}, "type": "custom"}]}, OK),
    ({"tools": [{"name": "mcp__server__a_rather_long_tool_name_" + "x" * 60, "input_schema": {"type": "object"}}]}, OK),
    ({"tools": "f"}, "tools"), ({"tools": [5]}, "tools[0]"), ({"tools": [{"input_schema": {}}]}, "tools[0].name"),
    ({"tools": [{"name": "f"}]}, "tools[0].input_schema"), ({"tools": [{"name": "f", "input_schema": 5}]},
                                                           "tools[0].input_schema"),
    ({"tools": [TOOL, TOOL]}, "used twice"), ({"tools": [{**TOOL, "description": 5}]}, "tools[0].description"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "server tool"),
    ({"tools": [TOOL], "tool_choice": {"type": "auto"}}, OK), ({"tools": [TOOL], "tool_choice": {"type": "any"}}, OK),
    ({"tools": [TOOL], "tool_choice": {"type": "tool", "name": "f"}}, OK),
    ({"tools": [TOOL], "tool_choice": {"type": "none"}}, OK),
    ({"tools": [TOOL], "tool_choice": {"type": "auto", "disable_parallel_tool_use": True}}, OK),
    ({"tool_choice": {"type": "any"}}, "needs at least one tool"),
    ({"tools": [TOOL], "tool_choice": {"type": "tool"}}, "tool_choice.name"),
    ({"tools": [TOOL], "tool_choice": {"type": "tool", "name": "g"}}, "'g'"),
    ({"tools": [TOOL], "tool_choice": "auto"}, "tool_choice"), ({"tools": [TOOL], "tool_choice": {"type": "x"}},
                                                               "tool_choice"),
    ({"tools": [TOOL], "tool_choice": {"type": "any", "disable_parallel_tool_use": 1}},
     "tool_choice.disable_parallel_tool_use"),
    ({"tools": [{"name": "f", "input_schema": {"type": "object", "properties": {"x": {"type": "nonsense"}}}}],
      "tool_choice": {"type": "any"}}, "schema"),
    ({"thinking": {"type": "enabled", "budget_tokens": 8}}, OK), ({"thinking": {"type": "disabled"}}, OK),
    ({"thinking": {"type": "adaptive"}}, OK), ({"thinking": {"type": "adaptive", "display": "omitted"}}, OK),
    ({"thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
    ({"thinking": {"type": "enabled", "budget_tokens": 0}}, "thinking.budget_tokens"),
    ({"thinking": {"type": "enabled", "budget_tokens": 64}}, "less than 'max_tokens'"),
    ({"thinking": {"type": "enabled", "budget_tokens": "8"}}, "thinking.budget_tokens"),
    ({"thinking": {"type": "on"}}, "thinking"), ({"thinking": True}, "thinking"),
    ({"thinking": {"type": "adaptive", "display": "loud"}}, "thinking.display"),
    ({"container": "c", "mcp_servers": [], "unknown_field": 1}, OK),
]


# The generation controls count_tokens does not take (its cases are the others).
GENERATION = {"max_tokens", "stop_sequences", "temperature", "top_p", "top_k", "min_p", "seed", "repetition_penalty",
              "min_tokens", "logit_bias", "stop_token_ids", "stream", "metadata", "service_tier"}
ROUTES = [("/v1/messages", fields, expected) for fields, expected in CASES] + [
    ("/v1/messages/count_tokens", fields, expected) for fields, expected in CASES
    if not set(fields) & GENERATION and "max_tokens" not in expected]


@pytest.mark.parametrize("path, fields, expected", ROUTES, ids=[f"{p[4:]}-{str(f)[:80]}" for p, f, _ in ROUTES])
def test_each_field(fake_rt, path, fields, expected):
    body = {"model": "smollm2-135m-instruct", "messages": USER, **({} if path.endswith("count_tokens") else {"max_tokens": 32}), **fields}
    answer = call("POST", path, body)
    assert answer.status < 500, answer.body
    if expected == OK:
        assert answer.status == 200, answer.body
        return
    assert answer.status == 400, answer.body
    error = answer.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert expected in error["error"]["message"], error


def test_a_missing_required_field_is_named(fake_rt):
    for missing in ("model", "max_tokens", "messages"):
        body = {k: v for k, v in {"model": "smollm2-135m-instruct", "max_tokens": 8, "messages": USER}.items() if k != missing}
        answer = call("POST", "/v1/messages", body)
        assert answer.status == 400 and missing in answer.json()["error"]["message"]


@pytest.mark.parametrize("raw", [b"", b"{", b"[]", b'"x"', b'{"model": "smollm2-135m-instruct", "max_tokens": 1e999}'])
def test_a_body_that_is_not_a_json_object_is_a_400(fake_rt, raw):
    answer = call("POST", "/v1/messages", raw=raw)
    assert answer.status == 400 and answer.json()["error"]["type"] == "invalid_request_error"
