"""Thinking controls: the request fields that turn reasoning on or off and cap it, resolved by priority.

Source: the original server's behaviour doc, section 3, "Thinking"; issue 5.
Highest first:
1. `thinking`: `{"type": "disabled"}` turns thinking off; `{"budget_tokens": N}`
   (Anthropic's shape, `type` "enabled" or absent) turns it on, capped at N;
2. `thinking_token_budget` (aliases `max_thinking_tokens`, `thinking_budget`):
   0 turns thinking off, N > 0 turns it on, capped at N;
3. `reasoning_effort` (Responses: `reasoning.effort`): "none" turns it off,
   minimal / low / medium / high turn it on (no cap; the template sees the effort);
4. `chat_template_kwargs.enable_thinking`;
5. the model's default (the template's own).
A cap is enforced by the engine (engine/reasoning.py): after N reasoning
tokens it forces the reasoning parser's close tag. "Off" is told to the template
(`enable_thinking: false`) and, for a model with a reasoning parser, enforced as a
cap of 0, so a model that opens a block anyway closes it at once.
"""
from __future__ import annotations

from dataclasses import dataclass

from rest_framework import serializers

from .errors import bad_request
from .fields import StrictField, check_number

REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high")
BUDGET_FIELDS = ("thinking_token_budget", "max_thinking_tokens", "thinking_budget")


@dataclass(frozen=True, slots=True)
class Thinking:
    """A request's resolved thinking choice. enabled: None = the model's default. budget_tokens: the
    reasoning cap in tokens, None = no cap. effort: the reasoning_effort to show the template."""

    enabled: bool | None = None
    budget_tokens: int | None = None
    effort: str | None = None

    def template_kwargs(self) -> dict:
        """Variables for the chat template: enable_thinking when decided, reasoning_effort when given."""
        out: dict = {}
        if self.enabled is not None:
            out["enable_thinking"] = self.enabled
        if self.effort is not None:
            out["reasoning_effort"] = self.effort
        return out

    def engine_cap(self) -> int | None:
        """The reasoning tokens the engine allows (0 when thinking is off), None for no cap."""
        if self.enabled is False:
            return 0
        return self.budget_tokens


def validate_thinking(data) -> dict:
    """`thinking`: {"type": "disabled"} or {"type": "enabled"?, "budget_tokens": N >= 0}.
    Returns {"enabled": bool, "budget_tokens": int | None}. Raises ApiError 400 naming the field."""
    if not isinstance(data, dict):
        raise bad_request("'thinking' must be an object: {\"type\": \"disabled\"} or "
                          "{\"type\": \"enabled\", \"budget_tokens\": N}.", "thinking")
    kind = data.get("type", "enabled")
    if kind not in ("enabled", "disabled"):
        raise bad_request(f"'thinking.type' must be 'enabled' or 'disabled'; got {kind!r}.", "thinking.type")
    if kind == "disabled":
        return {"enabled": False, "budget_tokens": None}
    budget = data.get("budget_tokens")
    if budget is not None:
        try:
            budget = check_number(budget, integer=True, low=0)
        except serializers.ValidationError as exc:
            raise bad_request(f"'thinking.budget_tokens' must be a whole number of at least 0; got {budget!r}.",
                              "thinking.budget_tokens") from exc
    return {"enabled": True, "budget_tokens": budget}


class ThinkingField(StrictField):
    """`thinking`: see validate_thinking."""

    def to_internal_value(self, data):
        return validate_thinking(data)


def budget_field_value(req: dict) -> tuple[str, int] | None:
    """(field name, value) of the first thinking-budget field the request sets, in BUDGET_FIELDS order."""
    for name in BUDGET_FIELDS:
        if req.get(name) is not None:
            return name, req[name]
    return None


def resolve_thinking(req: dict, effort: str | None = None) -> Thinking:
    """The thinking choice of a validated request (priority in the module doc).

    effort: the reasoning effort when it comes from elsewhere (Responses' `reasoning.effort`);
    else the request's `reasoning_effort`.
    """
    effort = effort if effort is not None else req.get("reasoning_effort")
    thinking = req.get("thinking")
    if thinking is not None:
        return Thinking(thinking["enabled"], thinking["budget_tokens"], effort)
    budget = budget_field_value(req)
    if budget is not None:
        n = budget[1]
        return Thinking(n > 0, n if n > 0 else None, effort)
    if effort is not None:
        return Thinking(effort != "none", None, effort)
    kwargs = req.get("chat_template_kwargs") or {}
    if isinstance(kwargs.get("enable_thinking"), bool):
        return Thinking(kwargs["enable_thinking"])
    return Thinking()
