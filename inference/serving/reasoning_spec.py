"""The engine's ReasoningSpec for one request: its reasoning parser's tags in token ids, the prompt's state, the cap.

One spec feeds both engine rules that read reasoning (engine/reasoning.py): the thinking
budget (thinking.py's cap, forced with the close tag) and a grammar's wait for the end of
the reasoning block (structured.py). A prompt that ends in the open tag starts in reasoning;
one that ends in the close tag (thinking turned off in the template) closed the block, so the
model is not offered to open it; otherwise it may open it with its first token.
"""
from __future__ import annotations

from functools import lru_cache

from inference.engine.reasoning import ReasoningSpec

from .reasoning import REASONING_PARSERS, prompt_opens_reasoning
from .thinking import Thinking


@lru_cache(maxsize=16)
def tag_ids(tokenizer, parser_name: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(open tag ids, close tag ids) of a reasoning parser, tokenized once per tokenizer."""
    cls = REASONING_PARSERS[parser_name]
    return tuple(tokenizer.encode(cls.start_tag)), tuple(tokenizer.encode(cls.end_tag))


def reasoning_spec(tokenizer, parser_name: str | None, prompt_text: str, thinking: Thinking) -> ReasoningSpec | None:
    """The ReasoningSpec of a request rendered as `prompt_text`, or None when the model has no
    (known) reasoning parser. thinking: the request's resolved thinking controls; its engine cap
    (0 when thinking is off) is the spec's budget_tokens (None: no cap)."""
    if not parser_name or parser_name not in REASONING_PARSERS:
        return None
    start_ids, end_ids = tag_ids(tokenizer, parser_name)
    if not end_ids:
        return None
    opened = prompt_opens_reasoning(prompt_text, parser_name)
    closed = prompt_text.rstrip().endswith(REASONING_PARSERS[parser_name].end_tag)
    return ReasoningSpec(start_ids, end_ids, starts_in_reasoning=opened, budget_tokens=thinking.engine_cap(),
                         output_may_open=not opened and not closed)


__all__ = ["reasoning_spec", "tag_ids"]
