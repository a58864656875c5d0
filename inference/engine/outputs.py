"""What the engine hands out per request: TokenEvent, Finished, Failed, and RequestRejected. No torch."""
from __future__ import annotations

from dataclasses import dataclass


class RequestRejected(ValueError):
    """A request the engine can never serve (too long for the context or the KV pool)."""


@dataclass(slots=True)
class TokenEvent:
    """One generated token. logprobs: None or (sampled logprob, [(token id, logprob)] top-k, sorted desc)."""

    token_id: int
    logprobs: tuple | None = None


@dataclass(slots=True)
class Finished:
    """The request ended. reason: stop, length, cancelled or timeout. Token counts; times in seconds."""

    reason: str
    prompt_tokens: int
    completion_tokens: int
    ttft_s: float | None = None
    total_s: float = 0.0
    cached_tokens: int = 0
    # One entry per prompt token when prompt_logprobs was asked (None for the first token).
    prompt_logprobs: list | None = None


@dataclass(slots=True)
class Failed:
    """The engine failed while running the request (an internal error or a refused request)."""

    message: str
