"""A sequence's grammar: the matcher its tokens advance, the reasoning gate in front of it, and its bitmask.

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

log = logging.getLogger("metrale.engine")


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    """A request's constraint (SamplingParams.structured): the compiled grammar and when it starts.

    reasoning_end_ids: the reasoning close tag's token ids; with them the grammar applies only
    after the output ends with that tag. starts_in_reasoning: the prompt opened the reasoning
    block. reasoning_start_id: a single-token open tag the model may begin with instead of the
    grammar's first token (model-opened reasoning); None: it may not.
    """

    grammar: CompiledGrammar
    reasoning_end_ids: tuple[int, ...] = ()
    starts_in_reasoning: bool = False
    reasoning_start_id: int | None = None


class GrammarState:
    """One sequence's grammar: a matcher, the reasoning gate in front of it, and how it ended.

    Gate: "reasoning" (grammar off until the close tag), "open" (the first output token may
    open reasoning instead), "on". finished: the grammar is complete and allows only EOS, so
    the engine ends the request with "stop". dead_end: a token the grammar refused was drawn
    (no allowed token survived the sampler's other controls); the engine ends it with "stop".
    """

    __slots__ = ("structured", "matcher", "gate", "finished", "dead_end", "request_id")

    def __init__(self, structured: StructuredOutput, request_id: str = ""):
        self.structured = structured
        self.matcher = structured.grammar.new_matcher()
        self.request_id = request_id
        if structured.starts_in_reasoning and structured.reasoning_end_ids:
            self.gate = "reasoning"
        elif structured.reasoning_start_id is not None and structured.reasoning_end_ids:
            self.gate = "open"
        else:
            self.gate = "on"
        self.finished = False
        self.dead_end = False

    @property
    def masks(self) -> bool:
        """Whether this draw is constrained (the gate is not holding the grammar off)."""
        return self.gate != "reasoning" and not self.finished and not self.dead_end

    def fill_mask(self, row: np.ndarray) -> None:
        """Write the allowed tokens into one bitmask row (uint32 [mask_words], bit t % 32 of word
        t // 32 set = token t allowed), C-contiguous."""
        self.matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
        if self.gate == "open":
            t = self.structured.reasoning_start_id
            if t // 32 < len(row):
                row[t // 32] |= np.uint32(1 << (t % 32))

    def accept(self, token: int, output_ids: list[int]) -> bool:
        """Advance with the drawn `token`; output_ids: the output so far, `token` not yet in it.

        Returns False for a dead end (the grammar refuses the token; it is logged and the
        request should end with "stop" without the token). Sets `finished` when the grammar
        allows nothing more than EOS.
        """
        if self.gate == "reasoning":
            end = self.structured.reasoning_end_ids
            tail = (output_ids + [token])[-len(end):]
            if tuple(tail) == end:
                self.gate = "on"
            return True
        if self.gate == "open":
            if token == self.structured.reasoning_start_id:
                self.gate = "reasoning"
                return True
            self.gate = "on"
        if not self.matcher.consume_token(token):
            self.dead_end = True
            log.warning("request %s: the grammar (%s) has no allowed token left; ending it with finish_reason "
                        "stop: %s", self.request_id, self.structured.grammar.spec.describe(),
                        first_line(self.matcher.get_error()))
            return False
        if self.matcher.is_stopped():
            self.finished = True
        return True


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
        if s.gate == "open":
            t = s.structured.reasoning_start_id
            if t // 32 < words:
                buf[r, t // 32] |= np.uint32(1 << (t % 32))
    return buf


def grammar_state_for(params, request_id: str = "") -> GrammarState | None:
    """A new GrammarState when `params` (SamplingParams) carries a StructuredOutput, else None."""
    structured = getattr(params, "structured", None)
    return GrammarState(structured, request_id) if structured is not None else None


__all__ = ["GrammarState", "StructuredOutput", "fill_masks", "grammar_state_for"]
