"""SamplingParams: every per-request generation control the engine honours."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from .reasoning import ReasoningSpec
from .repetition import RepetitionDetection


@dataclass(slots=True)
class SamplingParams:
    """Per-request generation controls (names as in OpenAI's chat API and vLLM's SamplingParams).

    Applied by the sampler in vLLM's order: logit_bias, min_tokens (EOS and
    stop_token_ids masked until min_tokens tokens exist), repetition_penalty (over
    prompt + output; 1.0 = off), presence_penalty / frequency_penalty (over the output;
    OpenAI's definition, [-2, 2]), DRY (llama.cpp's definition; dry_multiplier 0 =
    off), temperature (0 = greedy), top_k (<= 0 = off), top_p (1.0 = off), min_p
    (0 = off), top_n_sigma (<= 0 = off), then the draw.
    max_tokens / min_tokens count generated tokens. seed: a per-request generator so
    the tokens do not depend on batch neighbours. logprobs: None, or the number of top
    logprobs to return per generated token (0 = only the sampled token's);
    prompt_logprobs likewise for prompt tokens. structured: a grammar_state.StructuredOutput; its
    mask applies to the raw logits, before every other control (grammar_mask.py).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    top_n_sigma: float = 0.0
    seed: int | None = None
    max_tokens: int = 16
    min_tokens: int = 0
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    # grammar_state.StructuredOutput: the output must match this compiled grammar (None: unconstrained).
    structured: object = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1
    # Token ids that stop a DRY match (serving maps llama.cpp's default breakers "\n", ":", "\"", "*"
    # to the ids of tokens containing them); None: no breakers.
    dry_sequence_breaker_ids: frozenset[int] | None = None
    # How the output reasons (reasoning.py): the budget's cap and the grammar's wait read it; None: no reasoning.
    reasoning: ReasoningSpec | None = None
    # repetition.RepetitionDetection: stop ("stop") once the output ends in a repeated pattern; None: off.
    repetition_detection: RepetitionDetection | None = None

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if self.repetition_penalty <= 0:
            raise ValueError("repetition_penalty must be > 0")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def for_engine(self, vocab_size: int) -> SamplingParams:
        """A copy with every number as the engine's step uses it, made when the engine admits the request.

        Real-valued controls become Python floats and counts ints (a JSON integer of 20 digits reaches
        a tensor as a float, not as an int64 that overflows); logprobs and prompt_logprobs are capped
        at vocab_size (there are no more alternatives); logit_bias keeps the token ids inside the
        vocabulary. Raises OverflowError, ValueError or TypeError for a value no step could use.
        """
        def count(n: int | None) -> int | None:
            return None if n is None else min(int(n), vocab_size)

        bias = self.logit_bias
        breakers = self.dry_sequence_breaker_ids
        return replace(
            self, temperature=float(self.temperature), top_p=float(self.top_p), top_k=int(self.top_k),
            min_p=float(self.min_p), top_n_sigma=float(self.top_n_sigma),
            seed=None if self.seed is None else int(self.seed), max_tokens=int(self.max_tokens),
            min_tokens=int(self.min_tokens), stop_token_ids=[int(t) for t in self.stop_token_ids],
            logprobs=count(self.logprobs), prompt_logprobs=count(self.prompt_logprobs),
            repetition_penalty=float(self.repetition_penalty), presence_penalty=float(self.presence_penalty),
            frequency_penalty=float(self.frequency_penalty),
            logit_bias={int(t): float(v) for t, v in bias.items() if 0 <= int(t) < vocab_size} if bias else None,
            dry_multiplier=float(self.dry_multiplier), dry_base=float(self.dry_base),
            dry_allowed_length=int(self.dry_allowed_length), dry_penalty_last_n=int(self.dry_penalty_last_n),
            dry_sequence_breaker_ids=None if breakers is None else frozenset(int(t) for t in breakers))
