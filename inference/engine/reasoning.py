"""Reasoning in token ids: a request's ReasoningSpec, and one tracker per sequence for the budget and the grammar.

Budget source: the original server's behaviour doc, section 3, "Thinking"
(`thinking_token_budget` N > 0 caps thinking at N, "the scheduler forces
`</think>`"), and vLLM's thinking-budget logits processor, which tracks the
same state from token ids: reasoning opens when the output ends with the start
tag's ids (or the prompt opened it), closes when it ends with the close tag's
ids, and once the budget is spent every row of the close tag is forced.

The budget counts generated tokens inside reasoning, over every block of the
response (a block reopened after the budget is spent is closed at once); the
start tag's own tokens do not count. Forcing happens in the sampler: the row's
processed logits become -inf except the forced token (logprob 0), so greedy and
seeded draws, and the reported logprobs, all agree on it.

The grammar (grammar_state.py) applies only to the answer: it waits while the
first reasoning block is open (the prompt opened it, or the output's first token
is a single-token open tag where the prompt leaves that to the model), and once
a token of the answer was generated it applies to the rest of the output.

Serving builds the spec from its reasoning parser's tags (serving/reasoning_spec.py);
the engine knows nothing about text. No torch import at runtime.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, slots=True)
class ReasoningSpec:
    """How a request's output reasons (SamplingParams.reasoning; None there: it does not).

    start_ids: the open tag's token ids (empty: only the prompt opens reasoning). end_ids: the
    close tag's ids (non-empty). starts_in_reasoning: the prompt opened the block.
    budget_tokens: reasoning tokens allowed before the close tag is forced (0: close at once),
    None: no cap. output_may_open: the prompt leaves opening the block to the model, so with a
    grammar the first output token may be a single-token open tag instead of the grammar's first
    token (False when the prompt opened or already closed the block).
    """

    start_ids: tuple[int, ...] = ()
    end_ids: tuple[int, ...] = ()
    starts_in_reasoning: bool = False
    budget_tokens: int | None = None
    output_may_open: bool = False

    def __post_init__(self):
        if not self.end_ids:
            raise ValueError("a reasoning spec needs the close tag's token ids")
        if self.budget_tokens is not None and self.budget_tokens < 0:
            raise ValueError("reasoning budget_tokens must be >= 0")


class ReasoningTracker:
    """One sequence's reasoning state, folded in from its output ids one token at a time.

    in_reasoning: the next token is inside a reasoning block. used: reasoning tokens generated.
    answer_started: a token of the answer was generated (from then on a grammar always applies).
    forcing: index into end_ids of the next forced token, -1 when not forcing.
    """

    __slots__ = ("spec", "in_reasoning", "used", "seen", "forcing", "answer_started", "tail")

    def __init__(self, spec: ReasoningSpec):
        self.spec = spec
        self.in_reasoning = spec.starts_in_reasoning
        self.used = 0
        self.seen = 0          # output tokens folded in
        self.forcing = -1
        self.answer_started = False
        self.tail: deque[int] = deque(maxlen=max(len(spec.start_ids), len(spec.end_ids)))

    @property
    def grammar_waits(self) -> bool:
        """Whether a grammar is held off for the next token (inside the first reasoning block)."""
        return self.in_reasoning and not self.answer_started

    @property
    def may_open(self) -> bool:
        """Whether the next token may be the single-token open tag in place of a grammar's token."""
        s = self.spec
        return (s.output_may_open and len(s.start_ids) == 1 and self.seen == 0 and not self.in_reasoning)

    def advance(self, token: int) -> None:
        """Fold in the next output token."""
        s = self.spec
        was_reasoning, could_open = self.in_reasoning, self.may_open
        self.tail.append(token)
        if self.forcing >= 0:
            self.forcing += 1
            if self.forcing == len(s.end_ids):
                self.forcing = -1
                self.in_reasoning = False
        elif self.in_reasoning:
            self.used += 1
            if self._tail_is(s.end_ids):
                self.in_reasoning = False
        elif s.start_ids and self._tail_is(s.start_ids):
            self.in_reasoning = True
        if not was_reasoning and not (could_open and self.in_reasoning):
            self.answer_started = True
        self.seen += 1

    def catch_up(self, token_ids: list[int], start: int = 0) -> None:
        """Fold in the output tokens not seen yet; the output is token_ids[start:]."""
        for pos in range(start + self.seen, len(token_ids)):
            self.advance(token_ids[pos])

    def forced_token(self) -> int | None:
        """The token the next draw must produce, or None. Starts forcing once the budget is spent,
        continuing a close tag the model had already begun."""
        s = self.spec
        if s.budget_tokens is None:
            return None
        if self.forcing < 0 and self.in_reasoning and self.used >= s.budget_tokens:
            self.forcing = self._open_prefix()
        return s.end_ids[self.forcing] if self.forcing >= 0 else None

    def _tail_is(self, tag: tuple[int, ...], n: int | None = None) -> bool:
        """Whether the output ends with tag[:n] (the whole tag when n is None)."""
        n = len(tag) if n is None else n
        tail = self.tail
        if n > len(tail):
            return False
        return all(tail[len(tail) - n + k] == tag[k] for k in range(n))

    def _open_prefix(self) -> int:
        """The longest proper prefix of the close tag that the output ends with (0 when none)."""
        end = self.spec.end_ids
        for k in range(len(end) - 1, 0, -1):
            if self._tail_is(end, k):
                return k
        return 0


def tracker_of(seq) -> ReasoningTracker | None:
    """The sequence's tracker (made on first use when its params carry a ReasoningSpec), caught up."""
    spec = seq.params.reasoning
    if spec is None:
        return None
    if seq.reasoning is None:
        seq.reasoning = ReasoningTracker(spec)
    seq.reasoning.catch_up(seq.token_ids, seq.num_prompt_tokens)
    return seq.reasoning


def force_reasoning_end(logits: torch.Tensor, seqs) -> None:
    """In place on logits [B, V] before temperature and truncation (which then keep that one token):
    rows whose sequence must close its reasoning now keep only the forced token (logit 0, every
    other -inf). Rows without a budget are untouched."""
    for i, seq in enumerate(seqs):
        spec = seq.params.reasoning
        if spec is None or spec.budget_tokens is None:
            continue
        token = tracker_of(seq).forced_token()
        if token is not None and 0 <= token < logits.shape[1]:
            logits[i].fill_(float("-inf"))
            logits[i, token] = 0.0
