"""The `mistral` reasoning parser: `[THINK]...[/THINK]` (Magistral, Mistral-Small 3.2+ reasoning).

Source: the original server's `mistral` reasoning parser; vLLM's `mistral`.
"""
from __future__ import annotations

from .base import TagReasoningParser


class MistralReasoningParser(TagReasoningParser):
    """`[THINK]` opens reasoning, `[/THINK]` closes it; TagReasoningParser has the shaping rules."""

    name = "mistral"
    start_tag = "[THINK]"
    end_tag = "[/THINK]"
