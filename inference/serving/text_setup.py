"""Which parsers read a request's output.

Parsers (settings, then the model): METRALE["TOOL_CALL_PARSER"] and
METRALE["REASONING_PARSER"] name a parser ("none" turns that stage off); unset,
they are chosen from the model's chat template and its config.json model_type
(tool_parsers.choose_tool_parser, reasoning.choose_reasoning_parser). A request
with tools on a model that has no tool parser gets `hermes`: a template that
ignores tools is given a Hermes-format tools section (tool_prompt.py), and
Hermes is what most tool-capable templates without a known marker write too.
Without tools, the model's own parser (if any) still runs, so its markup never
leaks into content.

The engine's side of reasoning (tags in token ids, the thinking cap) is
reasoning_spec.py's, from `TextSetup.reasoning_parser` and `TextSetup.thinking`.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from django.conf import settings

from .reasoning import REASONING_PARSERS, choose_reasoning_parser, prompt_opens_reasoning
from .text_pipeline import TextSpec
from .thinking import Thinking
from .tool_parsers import TOOL_PARSERS, choose_tool_parser

log = logging.getLogger("metrale.api")

FALLBACK_TOOL_PARSER = "hermes"
OFF = "none"


def _setting(key: str) -> str | None:
    return settings.METRALE.get(key) or None


def model_tool_parser(model_type: str, chat_template: str | None) -> str | None:
    """The tool parser for this model without regard to a request: the setting, else the chooser
    (model_type: config.json's, ModelFolder.model_type)."""
    name = _setting("TOOL_CALL_PARSER")
    if name is not None:
        return None if name == OFF else name
    return choose_tool_parser(model_type, chat_template)


def tools_parser(model_type: str, chat_template: str | None) -> str | None:
    """The tool parser a request with tools gets on this model: the model's own (model_tool_parser), else
    FALLBACK_TOOL_PARSER unless METRALE_TOOL_CALL_PARSER is "none" (None: this model takes no tools)."""
    parser = model_tool_parser(model_type, chat_template)
    if parser is None and _setting("TOOL_CALL_PARSER") != OFF:
        return FALLBACK_TOOL_PARSER
    return parser


def model_reasoning_parser(model_type: str, chat_template: str | None) -> str | None:
    """The reasoning parser for this model: the setting, else the chooser (None: no reasoning)."""
    name = _setting("REASONING_PARSER")
    if name is not None:
        return None if name == OFF else name
    return choose_reasoning_parser(model_type, chat_template)


def check_parser_names(names: dict[str, str] | None = None) -> list[str]:
    """Problems with parser names (empty when fine): `names` maps TOOL_CALL_PARSER /
    REASONING_PARSER to a name; unset, the configured settings are checked (the system check)."""
    problems = []
    for key, known in (("TOOL_CALL_PARSER", TOOL_PARSERS), ("REASONING_PARSER", REASONING_PARSERS)):
        name = names.get(key) if names is not None else _setting(key)
        if name is not None and name != OFF and name not in known:
            problems.append(f"METRALE_{key}={name!r} is not a known parser; known: "
                            f"{', '.join(sorted(known))}, or {OFF!r}.")
    return problems


@dataclass(slots=True)
class TextSetup:
    """One request's parsing choices, before its prompt is rendered."""

    reasoning_parser: str | None
    tool_parser: str | None
    tools: list[dict] | None
    tool_choice: str | dict
    parallel_tool_calls: bool
    thinking: Thinking
    max_calls: int

    def spec(self, prompt_text: str) -> TextSpec:
        """The TextPipeline arguments, once the rendered prompt shows whether reasoning is open.

        Tool-call arguments are delivered as they are generated whether the answer is streamed or not
        (tool_parsers/base.py): a blocking answer is then the join of the very deltas its stream would
        carry, so both say the same calls, the same arguments (a call cut off included) and the same
        finish reason."""
        return TextSpec(self.reasoning_parser, self.tool_parser, self.tools, self.tool_choice,
                        self.parallel_tool_calls, self.max_calls,
                        prompt_opens_reasoning(prompt_text, self.reasoning_parser),
                        stream_arguments=True)


def text_setup(rt, tools: list[dict] | None, tool_choice, parallel_tool_calls: bool | None,
               thinking: Thinking, max_calls: int | None = None) -> TextSetup:
    """The parsers for one request on the runtime's model (rules in the module doc).

    max_calls: the request's own cap on tool calls (Responses' max_tool_calls); the lower of it
    and METRALE["MAX_TOOL_CALLS_PER_RESPONSE"] applies.
    """
    limit = settings.METRALE["MAX_TOOL_CALLS_PER_RESPONSE"]
    if max_calls is not None:
        limit = min(limit, max_calls)
    template = rt.tokenizer.chat_template
    model_type = rt.folder.model_type
    tool_parser = tools_parser(model_type, template) if tools else model_tool_parser(model_type, template)
    return TextSetup(model_reasoning_parser(model_type, template), tool_parser, tools,
                     tool_choice or "auto", parallel_tool_calls is not False, thinking, limit)
