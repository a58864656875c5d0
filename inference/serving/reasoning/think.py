"""The `think` reasoning parser: `<think>...</think>` (Qwen3, DeepSeek-R1, SmolLM3, Laguna).

Source: the original server's `qwen` / `deepseek_r1` / `minimax` parsers (one
implementation, prompt-opened or not) and vLLM's `qwen3` and `deepseek_r1`.
"""
from __future__ import annotations

from .base import TagReasoningParser


class ThinkReasoningParser(TagReasoningParser):
    """`<think>` opens reasoning, `</think>` closes it; TagReasoningParser has the shaping rules."""

    name = "think"
    start_tag = "<think>"
    end_tag = "</think>"
