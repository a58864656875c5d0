"""Reasoning budget: after N reasoning tokens the engine forces the reasoning close tag, one token per step.

Source: the original server's behaviour doc, section 3, "Thinking"
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

The serving layer tokenizes its reasoning parser's tags into these ids; the
engine knows nothing about text.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # no torch import at runtime: serving builds ReasoningBudget without torch
    import torch


@dataclass(frozen=True, slots=True)
class ReasoningBudget:
    """A request's reasoning cap (a SamplingParams field; None there means no cap).

    max_tokens: reasoning tokens allowed before the close tag is forced (0: close at once).
    end_ids: the close tag's token ids (non-empty). start_ids: the open tag's ids (empty: only
    `starts_in_reasoning` opens reasoning). starts_in_reasoning: the prompt opened the block.
    """

    max_tokens: int
    end_ids: tuple[int, ...]
    start_ids: tuple[int, ...] = ()
    starts_in_reasoning: bool = False

    def __post_init__(self):
        if self.max_tokens < 0:
            raise ValueError("reasoning budget max_tokens must be >= 0")
        if not self.end_ids:
            raise ValueError("reasoning budget needs the close tag's token ids")


class ReasoningTracker:
    """One sequence's reasoning state, brought up to date from its output ids before each draw."""

    __slots__ = ("budget", "in_reasoning", "used", "seen", "forcing")

    def __init__(self, budget: ReasoningBudget):
        self.budget = budget
        self.in_reasoning = budget.starts_in_reasoning
        self.used = 0          # reasoning tokens generated so far
        self.seen = 0          # output tokens already folded into the state
        self.forcing = -1      # index into end_ids of the next forced token; -1: not forcing

    def catch_up(self, output_ids: list[int]) -> None:
        """Fold in the output tokens generated since the last call."""
        b = self.budget
        for pos in range(self.seen, len(output_ids)):
            if self.forcing >= 0:
                self.forcing += 1
                if self.forcing == len(b.end_ids):
                    self.forcing = -1
                    self.in_reasoning = False
            elif self.in_reasoning:
                self.used += 1
                if _ends_with(output_ids, pos + 1, b.end_ids):
                    self.in_reasoning = False
            elif b.start_ids and _ends_with(output_ids, pos + 1, b.start_ids):
                self.in_reasoning = True
        self.seen = len(output_ids)

    def forced_token(self, output_ids: list[int]) -> int | None:
        """The token this step must produce, or None. Starts forcing once the budget is spent,
        continuing a close tag the model had already begun."""
        b = self.budget
        if self.forcing < 0 and self.in_reasoning and self.used >= b.max_tokens:
            self.forcing = _open_prefix(output_ids, b.end_ids)
        return b.end_ids[self.forcing] if self.forcing >= 0 else None


def _ends_with(ids: list[int], end: int, tag: tuple[int, ...]) -> bool:
    n = len(tag)
    return end >= n and tuple(ids[end - n:end]) == tag


def _open_prefix(ids: list[int], tag: tuple[int, ...]) -> int:
    """The longest proper prefix of tag that the output ends with (0 when none)."""
    for k in range(len(tag) - 1, 0, -1):
        if _ends_with(ids, len(ids), tag[:k]):
            return k
    return 0


def force_reasoning_end(logits: torch.Tensor, seqs) -> None:
    """In place on processed logits [B, V]: rows whose sequence must close its reasoning now
    keep only the forced token (logit 0, every other -inf). Rows without a budget are untouched."""
    for i, seq in enumerate(seqs):
        budget = seq.params.reasoning_budget
        if budget is None:
            continue
        if seq.reasoning_tracker is None:
            seq.reasoning_tracker = ReasoningTracker(budget)
        output = seq.output_token_ids
        seq.reasoning_tracker.catch_up(output)
        token = seq.reasoning_tracker.forced_token(output)
        if token is not None and 0 <= token < logits.shape[1]:
            logits[i].fill_(float("-inf"))
            logits[i, token] = 0.0
