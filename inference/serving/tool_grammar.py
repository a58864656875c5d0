"""Grammars that force a tool call in a tool parser's own format (tool_choice "required" or a named function).

Each builder returns Lark text for llguidance: the parser's envelope around a JSON call
object, `%json`-embedded, whose schema is `{"name": <const tool name>, <arguments key>:
<that tool's parameters schema>}` for each tool the request may call. The model then
cannot write anything but calls that the same format's parser reads as valid calls.

Formats: `hermes` (`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, calls
one per line, as Qwen2.5 / Qwen3 / Hermes templates show them) and `llama3_json` (bare
`{"name": ..., "parameters": {...}}`, several joined by "; ", as vLLM's llama3_json parser
splits them). Source for the rule: OpenAI's function calling guide ("required" means at
least one call; a named function means exactly that one); vLLM builds the same kind of
grammar from the tools' parameter schemas for these two tool_choice values.
"""
from __future__ import annotations

import json

from inference.engine.grammar import JSON_OPTIONS, GrammarError, check_json_schema

from .errors import bad_request
from .tool_parsers.schema import ToolSchemas


class ToolGrammarError(ValueError):
    """tool_choice cannot be honoured with these tools (the message says why)."""


def _call_schema(schemas: ToolSchemas, names: tuple[str, ...], arguments_key: str) -> dict:
    """The JSON schema of one call object to any of `names`, with llguidance's JSON layout options."""
    variants = []
    for name in names:
        params = schemas.parameters(name) or {"type": "object"}
        variants.append({"type": "object", "properties": {"name": {"const": name}, arguments_key: params},
                         "required": ["name", arguments_key], "additionalProperties": False})
    schema = variants[0] if len(variants) == 1 else {"anyOf": variants}
    return {**schema, "x-guidance": dict(JSON_OPTIONS)}


def _lark(open_: str, close: str, separator: str, call_schema: dict, parallel: bool) -> str:
    call = f"{json.dumps(open_)} call_json {json.dumps(close)}" if open_ or close else "call_json"
    repeat = f" ({json.dumps(separator)} call)*" if parallel else ""
    return "\n".join([f"start: call{repeat}", f"call: {call}",
                      f"call_json: %json {json.dumps(call_schema, ensure_ascii=False)}"])


def hermes_grammar(schemas: ToolSchemas, names: tuple[str, ...], parallel: bool) -> str:
    """Lark for `<tool_call>\\n{"name", "arguments"}\\n</tool_call>` calls, one per line when parallel."""
    return _lark("<tool_call>\n", "\n</tool_call>", "\n", _call_schema(schemas, names, "arguments"), parallel)


def llama3_json_grammar(schemas: ToolSchemas, names: tuple[str, ...], parallel: bool) -> str:
    """Lark for bare `{"name", "parameters"}` calls, joined by "; " when parallel."""
    return _lark("", "", "; ", _call_schema(schemas, names, "parameters"), parallel)


TOOL_GRAMMARS = {"hermes": hermes_grammar, "llama3_json": llama3_json_grammar}


def forced_tool_names(tools: list[dict] | None, tool_choice) -> tuple[str, ...] | None:
    """The tools a call must be to: all of them for "required", one for a named function
    (`{"type": "function", "function": {"name"}}`, or the Responses form `{"type": "function",
    "name"}`); None when tool_choice forces nothing ("auto", "none", unset).

    Raises ToolGrammarError when a call is forced but there are no function tools, or the named
    function is not among them.
    """
    if tool_choice in (None, "auto", "none"):
        return None
    schemas = ToolSchemas(tools, tool_choice)
    if not schemas.names:
        raise ToolGrammarError("tool_choice forces a tool call, but 'tools' offers no function.")
    if isinstance(tool_choice, dict):
        fn = tool_choice.get("function", tool_choice)
        name = fn.get("name") if isinstance(fn, dict) else None
        if not schemas.allowed:
            raise ToolGrammarError(f"tool_choice names the function {name!r}, which is not in 'tools'.")
        return schemas.allowed
    if tool_choice == "required":
        return schemas.names
    raise ToolGrammarError("tool_choice must be none, auto, required, or a named function.")


def check_forced_tools(tools: list[dict] | None, tool_choice, sent: list | None = None) -> None:
    """When tool_choice forces a call ("required" or a named function), check that the call schema of
    each tool it may call compiles (validated tools, chat's or Responses' shape; `sent`: the tools as
    the client wrote them, when the shape changed). Raises ApiError 400 naming that tool's parameters
    as sent (`tools[i].function.parameters`, or `tools[i].parameters` for a flat Responses tool) with
    llguidance's reason. The grammar of all of them together is compiled later,
    with the tokenizer (structured.constrain; a failure there names `tools`)."""
    try:
        names = forced_tool_names(tools, tool_choice)
    except ToolGrammarError:
        return  # tool_fields.check_tool_choice answers these
    if not names:
        return
    schemas = ToolSchemas(tools)
    for i, tool in enumerate(tools or []):
        name = tool["function"]["name"] if "function" in tool else tool["name"]
        if name not in names:
            continue
        try:
            check_json_schema(_call_schema(schemas, (name,), "arguments"))
        except GrammarError as exc:
            as_sent = sent[i] if sent is not None and i < len(sent) else tool
            param = f"tools[{i}].function.parameters" if "function" in as_sent else f"tools[{i}].parameters"
            raise bad_request(f"The parameters schema of tool {name!r} cannot be enforced for a forced tool call: "
                              f"{exc}", param, code="invalid_tool_schema") from None


def tool_call_grammar(tool_format: str, tools: list[dict] | None, names: tuple[str, ...],
                      parallel: bool = True) -> str | None:
    """Lark text forcing calls to `names` in `tool_format`, or None when that format has no builder."""
    build = TOOL_GRAMMARS.get(tool_format)
    if build is None:
        return None
    return build(ToolSchemas(tools), names, parallel)
