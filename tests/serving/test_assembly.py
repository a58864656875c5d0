"""Blocking assembly: content whitespace shaping with and without tool calls, and finish_reason."""
from __future__ import annotations

import pytest

from inference.serving.assembly import assemble_message, final_content, resolve_finish_reason
from inference.serving.deltas import Content, Reasoning, ToolCallArgs, ToolCallStart

from .streaming import make_pipeline


@pytest.mark.parametrize(("content", "calls", "expected"), [
    ("\n\n", True, None),
    ("  Sure.\n", True, "Sure."),
    ("\n", False, "\n"),
    ("  Sure.\n", False, "  Sure.\n"),
    ("", False, ""),       # an empty turn is "" (OpenAI's choice), not None (vLLM's)
    ("", True, None),
])
def test_final_content_nulls_whitespace_only_when_calls_were_made(content, calls, expected):
    assert final_content(content, calls) == expected


def test_it_assembles_a_message_from_deltas():
    message = assemble_message([
        Reasoning("Think"), Reasoning("ing."), Content("\n"),
        ToolCallStart(0, "call_a", "f"), ToolCallArgs(0, '{"a":'), ToolCallArgs(0, "1}"),
        ToolCallStart(1, "call_b", "g"), ToolCallArgs(1, "{}"), Content(" \n"),
    ])
    assert message.content is None
    assert message.reasoning == "Thinking."
    assert message.tool_calls == [
        {"id": "call_a", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}},
        {"id": "call_b", "type": "function", "function": {"name": "g", "arguments": "{}"}},
    ]


def test_it_assembles_a_pipeline_run():
    pipeline = make_pipeline(reasoning_parser="think", tool_parser="hermes")
    deltas = pipeline.feed("<think>Need weather.</think>\n\nChecking.\n<tool_call>"
                           '{"name": "get_time"}</tool_call>\n') + pipeline.finish()
    message = assemble_message(deltas)
    assert (message.content, message.reasoning) == ("Checking.", "Need weather.")
    assert [c["function"]["name"] for c in message.tool_calls] == ["get_time"]
    assert message.tool_calls[0]["id"] == pipeline.tool_calls[0]["id"]


@pytest.mark.parametrize(("engine", "calls", "expected"), [
    ("stop", True, "tool_calls"), ("length", True, "tool_calls"), ("cancelled", True, "tool_calls"),
    ("timeout", True, "timeout"), ("length", False, "length"), ("stop", False, "stop"),
])
def test_finish_reason_prefers_timeout_then_tool_calls(engine, calls, expected):
    assert resolve_finish_reason(engine, calls) == expected
