"""SamplingParams: every per-request generation control the engine honours."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class SamplingParams:
    """Per-request generation controls (names as in OpenAI's chat API and vLLM's SamplingParams).

    temperature 0 means greedy. top_k <= 0 means off; top_p 1.0 means off.
    max_tokens counts generated tokens; stop_token_ids end the request like EOS.
    seed: a per-request generator so the tokens do not depend on batch neighbours.
    logprobs: None, or the number of top logprobs to return per token (0 = only
    the sampled token's).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int = 16
    min_tokens: int = 0
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
