"""The StreamDelta IR: provider-neutral deltas between generation and the wire encoders.

See ARCHITECTURE.md, "The StreamDelta IR". Encoders (chat chunks, Responses
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
    rejected_prediction_tokens: int = 0

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
                "rejected_prediction_tokens": self.rejected_prediction_tokens,
            },
        }


@dataclass(frozen=True, slots=True)
class TopLogprob:
    """One alternative at a position: the token's id, its text and exact bytes, its logprob."""

    token_id: int
    token: str
    bytes: bytes
    logprob: float


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated (or prompt) token's log probability, wire-neutral.

    token: its text (`bytes:\\xNN...` when it is only part of a UTF-8 character), bytes: exact.
    logprob: None where the engine gave none (a prompt's first token). top: the most likely
    alternatives, best first (empty when none were asked for; None where the engine gave none).
    Each encoder shapes its own wire form (logprobs.py).
    """

    token_id: int
    token: str
    bytes: bytes
    logprob: float | None
    top: tuple[TopLogprob, ...] | None = ()


@dataclass(slots=True)
class Reasoning:
    text: str
    # Ids of the tokens that produced this text (and any held before it), when known.
    token_ids: list[int] | None = None


@dataclass(slots=True)
class Content:
    text: str
    # One entry per token covering this text, when logprobs were requested.
    logprobs: list[TokenLogprob] | None = None
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

    prompt_logprobs: when prompt logprobs were asked for, one TokenLogprob per prompt token
    (logprob None where the engine gave none), else None. stop_string: the stop string that
    ended the generation, when one did (Anthropic's stop_sequence), else None. engine_reason: what
    ended the generation before the calls it made count (pipeline._finish_reason): stop, length (the
    token limit or the context), timeout...; never tool_calls; `reason` itself when not given. Ollama's
    done_reason and Responses' incomplete status read it: the token limit ended the turn, calls made or not.
    """

    reason: str
    usage: Usage = field(default_factory=Usage)
    prompt_logprobs: list[TokenLogprob] | None = None
    stop_string: str | None = None
    engine_reason: str | None = None

    def __post_init__(self):
        if self.engine_reason is None:
            self.engine_reason = self.reason


@dataclass(slots=True)
class Error:
    message: str
    type: str = "server_error"
    code: str | None = None


StreamDelta = Reasoning | Content | Refusal | ToolCallStart | ToolCallArgs | Finish | Error


def cancelled_as_error(delta: StreamDelta) -> StreamDelta:
    """How chat and legacy completions tell a client its request was cancelled (by an operator,
    AsyncEngine.cancel): Finish("cancelled") becomes Error code `cancelled`, sent as an in-band
    error frame then [DONE] on a stream, a 500 with that code for a blocking request. Every
    other delta is returned as it is. (Responses show status "cancelled"; Messages an
    `event: error`: each encoder reads the same Finish.)"""
    if isinstance(delta, Finish) and delta.reason == "cancelled":
        return Error("The request was cancelled by an operator.", type="server_error", code="cancelled")
    return delta
