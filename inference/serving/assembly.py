"""Blocking-response assembly: StreamDeltas -> a message and its finish_reason.

Source: the original server's behaviour doc, section 4, "vLLM whitespace
shaping" and "Wire finish reason on streams". Rules:
- with tool calls, content is stripped and becomes None when nothing is left;
- without tool calls, content is returned as generated, whitespace included;
  a turn with no content at all gives "" (as OpenAI does when reasoning used
  up the budget; vLLM gives None there, an explicit choice of ours);
- reasoning is None when there was none;
- finish_reason: timeout wins, then tool_calls when any call was made, then
  the engine's reason (stop, length, cancelled, ...).
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .deltas import Content, Reasoning, StreamDelta, ToolCallArgs, ToolCallStart


@dataclass(slots=True)
class AssembledMessage:
    """The assistant message of a blocking chat completion, before wire encoding."""

    content: str | None
    reasoning: str | None
    # OpenAI's shape: {"id", "type": "function", "function": {"name", "arguments"}}.
    tool_calls: list[dict] = field(default_factory=list)


def final_content(content: str, made_tool_calls: bool) -> str | None:
    """Content as a blocking response carries it (see the module doc)."""
    if made_tool_calls:
        return content.strip() or None
    return content


def assemble_message(deltas: Iterable[StreamDelta]) -> AssembledMessage:
    """Concatenate a request's deltas into its message; ToolCallArgs join by call index."""
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, dict] = {}
    for delta in deltas:
        if isinstance(delta, Content):
            content.append(delta.text)
        elif isinstance(delta, Reasoning):
            reasoning.append(delta.text)
        elif isinstance(delta, ToolCallStart):
            calls[delta.index] = {"id": delta.id, "type": "function",
                                  "function": {"name": delta.name, "arguments": ""}}
        elif isinstance(delta, ToolCallArgs):
            calls[delta.index]["function"]["arguments"] += delta.fragment
    tool_calls = [calls[i] for i in sorted(calls)]
    return AssembledMessage(content=final_content("".join(content), bool(tool_calls)),
                            reasoning="".join(reasoning) or None, tool_calls=tool_calls)


def resolve_finish_reason(engine_reason: str, made_tool_calls: bool) -> str:
    """The wire finish_reason: timeout > tool_calls (any call made) > the engine's reason."""
    if engine_reason == "timeout":
        return "timeout"
    if made_tool_calls:
        return "tool_calls"
    return engine_reason
