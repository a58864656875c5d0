"""Reasoning parsers: a registry keyed by name, one module per format, and the default chooser.

Usage: `make_reasoning_parser("think", started_in_reasoning=True)` gives a
per-request object with `feed(text) -> list[StreamDelta]`, `finish()` and
`in_reasoning`.
"""
from __future__ import annotations

from collections.abc import Callable

from .base import TagReasoningParser
from .glm47 import Glm47ReasoningParser
from .mistral import MistralReasoningParser
from .think import ThinkReasoningParser

REASONING_PARSERS: dict[str, type[TagReasoningParser]] = {
    cls.name: cls for cls in (ThinkReasoningParser, MistralReasoningParser, Glm47ReasoningParser)
}
# The original server's names for the one `<think>` implementation.
REASONING_PARSERS |= {"qwen3": ThinkReasoningParser, "deepseek_r1": ThinkReasoningParser,
                      "minimax": ThinkReasoningParser}

# model_type -> parser, from the original server's tool_defaults.toml [reasoning].
_BY_MODEL_TYPE = {
    "qwen3": "think", "qwen3_moe": "think", "qwen3_next": "think", "qwen3_vl_moe": "think",
    "qwen3_5": "think", "qwen3_5_moe": "think", "qwen3_6_moe": "think", "holo3_1_moe": "think",
    "laguna": "think", "nemotron_h": "think", "deepseek_v4": "think", "minimax_m2": "think",
    "smollm3": "think", "glm5_next": "glm47",
}


def make_reasoning_parser(name: str, started_in_reasoning: bool = False,
                          tags_in_content: Callable[[], bool] | None = None) -> TagReasoningParser:
    """A new per-request parser (arguments: see TagReasoningParser).

    Raises ValueError naming the known parsers for an unknown name.
    """
    try:
        cls = REASONING_PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown reasoning parser {name!r}; known: "
                         f"{', '.join(sorted(REASONING_PARSERS))}") from None
    return cls(started_in_reasoning=started_in_reasoning, tags_in_content=tags_in_content)


def choose_reasoning_parser(model_type: str, chat_template: str | None) -> str | None:
    """The default reasoning parser for a model, or None when it does not reason in tags.

    The chat template's own tags decide first (it is what the model was trained
    on), then the original server's model_type table. SmolLM2's template has no
    reasoning tags, so SmolLM2 gets None.
    """
    template = chat_template or ""
    if "[THINK]" in template:
        return "mistral"
    if "<think>" in template or "</think>" in template:
        return "glm47" if model_type.startswith("glm") else "think"
    return _BY_MODEL_TYPE.get(model_type)


def prompt_opens_reasoning(prompt: str, parser_name: str | None) -> bool:
    """True when the rendered prompt ends inside an open reasoning block: started_in_reasoning.

    A prompt ending in `<think>\\n` (DeepSeek-R1, Qwen3-thinking templates) opens
    one; `<think>\\n\\n</think>\\n\\n` (thinking disabled) ends with the close tag
    and does not.
    """
    if not parser_name:
        return False
    cls = REASONING_PARSERS[parser_name]
    return prompt.rstrip().endswith(cls.start_tag)


__all__ = ["REASONING_PARSERS", "TagReasoningParser", "choose_reasoning_parser",
           "make_reasoning_parser", "prompt_opens_reasoning"]
