"""A sequence's grammar: the matcher its tokens advance, the reasoning tracker in front of it, and its bitmask.

The engine makes a GrammarState when a request with `SamplingParams.structured` is added
(`grammar_state_for`), fills its bitmask row before each draw (`fill_masks`, called by
grammar_mask.py), feeds it each drawn token (`GrammarState.accept`), and drops it when the
sequence ends. No torch here.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import llguidance
import numpy as np

from .grammar import CompiledGrammar, first_line
from .reasoning import ReasoningTracker

log = logging.getLogger("metrale.engine")


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    """A request's constraint (SamplingParams.structured): the compiled grammar its output must match.

    When the request reasons (SamplingParams.reasoning), the grammar applies to the answer only;
    the sequence's ReasoningTracker (reasoning.py) says when that is.
    """

    grammar: CompiledGrammar


class GrammarState:
    """One sequence's grammar: a matcher, the reasoning tracker in front of it, and how it ended.

    reasoning: the sequence's ReasoningTracker (None: the grammar applies from the first token);
    while it says the first reasoning block is open the grammar waits, and where the model may
    open that block itself the first token may be the open tag instead. finished: the grammar
    is complete and allows only EOS, so the engine ends the request with "stop". dead_end: a
    token the grammar refused was drawn (no allowed token survived the sampler's other
    controls); the engine ends it with "stop".
    """

    __slots__ = ("structured", "matcher", "reasoning", "finished", "dead_end", "request_id")

    def __init__(self, structured: StructuredOutput, request_id: str = "", reasoning: ReasoningTracker | None = None):
        self.structured = structured
        self.matcher = structured.grammar.new_matcher()
        self.request_id = request_id
        self.reasoning = reasoning
        self.finished = False
        self.dead_end = False

    @property
    def gate(self) -> str:
        """"reasoning" (the grammar waits for the close tag), "open" (the next token may open
        reasoning instead) or "on"."""
        r = self.reasoning
        if r is not None and r.grammar_waits:
            return "reasoning"
        if r is not None and r.may_open:
            return "open"
        return "on"

    @property
    def masks(self) -> bool:
        """Whether this draw is constrained (the reasoning block is not holding the grammar off)."""
        return not (self.reasoning is not None and self.reasoning.grammar_waits) and not self.finished \
            and not self.dead_end

    @property
    def open_tag(self) -> int | None:
        """The single-token open tag the next draw may take besides the grammar's tokens, or None."""
        r = self.reasoning
        return r.spec.start_ids[0] if r is not None and r.may_open else None

    def fill_mask(self, row: np.ndarray) -> None:
        """Write the allowed tokens into one bitmask row (uint32 [mask_words], bit t % 32 of word
        t // 32 set = token t allowed), C-contiguous."""
        self.matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
        _allow(row, self.open_tag)

    def accept(self, token: int, output_ids: list[int]) -> bool:
        """Advance with the drawn `token`; output_ids: the output so far, `token` not yet in it.

        Returns False for a dead end (the grammar refuses the token; it is logged and the
        request should end with "stop" without the token). Sets `finished` when the grammar
        allows nothing more than EOS. Folds the token into the reasoning tracker too.
        """
        r = self.reasoning
        if r is not None:
            r.catch_up(output_ids)
            if r.grammar_waits or (r.may_open and token == r.spec.start_ids[0]):
                r.advance(token)
                return True
        if not self.matcher.consume_token(token):
            self.dead_end = True
            log.warning("request %s: the grammar (%s) has no allowed token left; ending it with finish_reason "
                        "stop: %s", self.request_id, self.structured.grammar.spec.describe(),
                        first_line(self.matcher.get_error()))
            return False
        if r is not None:
            r.advance(token)
        if self.matcher.is_stopped():
            self.finished = True
        return True


def _allow(row: np.ndarray, token: int | None) -> None:
    """Set token's bit in a bitmask row (no-op for None or a token past the row)."""
    if token is not None and token // 32 < len(row):
        row[token // 32] |= np.uint32(1 << (token % 32))


_executor: llguidance.LLExecutor | None = None


def fill_masks(states: list[GrammarState], words: int) -> np.ndarray:
    """The bitmasks of several sequences at once: uint32 [len(states), words], row r for states[r].

    Rows are computed in parallel by llguidance's thread pool when there are several.
    """
    global _executor
    buf = np.zeros((len(states), words), dtype=np.uint32)
    if len(states) == 1:
        states[0].fill_mask(buf[0])
        return buf
    if _executor is None:
        _executor = llguidance.LLExecutor()
    _executor.unsafe_compute_mask_ptr([(s.matcher, r) for r, s in enumerate(states)], buf.ctypes.data,
                                      words * 4, len(states))
    for r, s in enumerate(states):
        _allow(buf[r], s.open_tag)
    return buf


def grammar_state_for(params, request_id: str = "", reasoning: ReasoningTracker | None = None) -> GrammarState | None:
    """A new GrammarState when `params` (SamplingParams) carries a StructuredOutput, else None.

    reasoning: the sequence's ReasoningTracker, when its params carry a ReasoningSpec.
    """
    structured = getattr(params, "structured", None)
    return GrammarState(structured, request_id, reasoning) if structured is not None else None


__all__ = ["GrammarState", "StructuredOutput", "fill_masks", "grammar_state_for"]
