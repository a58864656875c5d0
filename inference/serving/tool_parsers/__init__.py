"""Tool-call parsers: a registry keyed by name, one module per format, and the default chooser.

Usage: `make_tool_parser("hermes", tools, tool_choice="auto")` gives a
per-request ToolParser with `feed(text)`, `finish()`, `calls`, `rejected` and
`should_stop` (see base.py for the rules every format shares).
"""
from __future__ import annotations

from collections.abc import Callable

from .base import DEFAULT_MAX_CALLS, ToolParser, new_call_id
from .glm47 import Glm47ToolParser
from .hermes import HermesToolParser
from .llama3_json import Llama3JsonToolParser
from .mistral import MistralToolParser
from .poolside_v1 import PoolsideV1ToolParser
from .pythonic import PythonicToolParser
from .qwen3_coder import Qwen3CoderToolParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    cls.name: cls for cls in (HermesToolParser, Qwen3CoderToolParser, Llama3JsonToolParser,
                              MistralToolParser, PythonicToolParser, PoolsideV1ToolParser,
                              Glm47ToolParser)
}

# model_type -> parser, from the original server's tool_defaults.toml (formats we have).
_BY_MODEL_TYPE = {
    "qwen3_next": "hermes", "qwen3_vl_moe": "hermes",
    "qwen3_5": "qwen3_coder", "qwen3_5_moe": "qwen3_coder", "qwen3_6_moe": "qwen3_coder",
    "holo3_1_moe": "qwen3_coder", "nemotron_h": "qwen3_coder", "qwen4_exp": "qwen3_coder",
    "mistral": "mistral", "laguna": "poolside_v1", "glm5_next": "glm47",
}


def make_tool_parser(name: str, tools: list[dict] | None, *,
                     tool_choice: str | dict | None = "auto", parallel_tool_calls: bool = True,
                     max_calls: int = DEFAULT_MAX_CALLS,
                     id_factory: Callable[[], str] | None = None,
                     stream_arguments: bool = False) -> ToolParser:
    """A new per-request parser (stream_arguments: send arguments as generated where the format
    can; base.py). Raises ValueError naming the known parsers for an unknown name."""
    try:
        cls = TOOL_PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown tool parser {name!r}; known: "
                         f"{', '.join(sorted(TOOL_PARSERS))}") from None
    return cls(tools, tool_choice=tool_choice, parallel_tool_calls=parallel_tool_calls,
               max_calls=max_calls, id_factory=id_factory, stream_arguments=stream_arguments)


def choose_tool_parser(model_type: str, chat_template: str | None) -> str | None:
    """The default tool parser for a model, or None when its template shows no tool-call format.

    The chat template's own markup decides first (it is what the model was
    trained to write), most specific first: `[TOOL_CALLS]` -> mistral;
    `<arg_key>` -> glm47 for GLM models, else poolside_v1; `<function=` ->
    qwen3_coder; `<tool_call>` -> hermes; a Python-list call example ->
    pythonic; `<|python_tag|>` or Llama's `"parameters"` JSON instruction ->
    llama3_json. Then the original server's model_type table. SmolLM2-135M's
    template (ChatML, no tools) gives None: the model is served without tools
    unless a parser is configured explicitly.
    """
    t = chat_template or ""
    if "[TOOL_CALLS]" in t:
        return "mistral"
    if "<arg_key>" in t:
        return "glm47" if model_type.startswith("glm") else "poolside_v1"
    if "<function=" in t and "<parameter=" in t:
        return "qwen3_coder"
    if "<tool_call>" in t:
        return "hermes"
    if "[func_name1(" in t:
        return "pythonic"
    if "<|python_tag|>" in t or ('"parameters"' in t and "ipython" in t):
        return "llama3_json"
    return _BY_MODEL_TYPE.get(model_type)


__all__ = ["DEFAULT_MAX_CALLS", "TOOL_PARSERS", "ToolParser", "choose_tool_parser",
           "make_tool_parser", "new_call_id"]
