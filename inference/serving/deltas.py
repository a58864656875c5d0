"""The StreamDelta IR: provider-neutral deltas between generation and the wire encoders.

See ../shared/DESIGN.md, "The StreamDelta IR". Encoders (chat chunks, Responses
events) consume these; the pipeline produces them.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Usage:
    """Token counts for one request (all in tokens)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0
    reasoning_tokens: int = 0
    accepted_prediction_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def to_openai(self) -> dict:
        """The chat/completions `usage` object (OpenAI's CompletionUsage)."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_prompt_tokens},
            "completion_tokens_details": {
                "reasoning_tokens": self.reasoning_tokens,
                "accepted_prediction_tokens": self.accepted_prediction_tokens,
            },
        }


@dataclass(slots=True)
class Reasoning:
    text: str
    # Ids of the tokens that produced this text (and any held before it), when known.
    token_ids: list[int] | None = None


@dataclass(slots=True)
class Content:
    text: str
    # Per-token logprob entries covering this text, in OpenAI's chat shape, if requested.
    logprobs: list[dict] | None = None
    token_ids: list[int] | None = None


@dataclass(slots=True)
class Refusal:
    text: str


@dataclass(slots=True)
class ToolCallStart:
    index: int
    id: str
    name: str


@dataclass(slots=True)
class ToolCallArgs:
    index: int
    fragment: str


@dataclass(slots=True)
class Finish:
    """reason: stop, length, tool_calls, content_filter, cancelled or timeout.

    prompt_logprobs: when prompt logprobs were asked for, one chat-shape logprob entry per
    prompt token (logprob None where the engine gave none), else None.
    """

    reason: str
    usage: Usage = field(default_factory=Usage)
    prompt_logprobs: list[dict] | None = None


@dataclass(slots=True)
class Error:
    message: str
    type: str = "server_error"
    code: str | None = None


StreamDelta = Reasoning | Content | Refusal | ToolCallStart | ToolCallArgs | Finish | Error
