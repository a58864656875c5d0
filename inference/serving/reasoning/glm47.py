"""The `glm47` reasoning parser: `<think>...</think>`, where a `<tool_call>` also ends reasoning.

Source: the original server's behaviour doc, section 4, "Reasoning parsers"
(`glm47`, for glm5_next): the prompt opens `<think>`, and a model that starts a
call without closing its reasoning has ended it. The `<tool_call>` stays in the
text so the tool parser sees the call.
"""
from __future__ import annotations

from .base import TagReasoningParser


class Glm47ReasoningParser(TagReasoningParser):
    """`<think>` ... `</think>` or ... `<tool_call>`; TagReasoningParser has the shaping rules."""

    name = "glm47"
    start_tag = "<think>"
    end_tag = "</think>"
    closing_openers = ("<tool_call>",)
