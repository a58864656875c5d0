"""What the engine hands out per request: TokenEvent, Finished, Failed; and its refusals (RequestRejected,
EngineOverloaded). No torch."""
from __future__ import annotations

from dataclasses import dataclass


class RequestRejected(ValueError):
    """A request the engine can never serve (too long for the context or the KV pool, or with a
    parameter no step can use)."""


class EngineOverloaded(RuntimeError):
    """The engine's waiting queue is full (EngineConfig.max_waiting_requests); retry after
    `retry_after_s` seconds."""

    def __init__(self, message: str, retry_after_s: int = 1):
        super().__init__(message)
        self.retry_after_s = retry_after_s


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
    # Reason "stop" because the output repeated a pattern (repetition.py; metrics' "repetition").
    repetition: bool = False
    # A beam search's n best beams (beam_search.Beam), best first: at its end, or the best so far when it
    # is aborted (timeout, cancel). None for every other request.
    beams: list | None = None


@dataclass(slots=True)
class Failed:
    """The engine failed while running the request (an internal error or a refused request)."""

    message: str
