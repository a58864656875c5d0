"""Structured outputs: the request's response_format / structured_outputs / forced tool_choice -> one grammar.

Sources: OpenAI's structured outputs guide and API reference (`response_format`
`{"type": "json_object"}` and `{"type": "json_schema", "json_schema": {"name", "schema",
"strict", "description"}}`; Responses `text.format` with the same fields flat); vLLM's
`structured_outputs` extension field (`json`, `regex`, `choice`, `grammar`, `json_object`);
OpenAI's function calling guide for tool_choice "required" and a named function.

Two steps, both before anything runs:
1. `check_request(attrs)`, from the serializers: shapes, and at most one of response_format
   and structured_outputs (both -> 400). A forced tool call takes precedence over
   response_format (that one describes the final answer, which a forced-call turn is not);
   with structured_outputs it is a 400.
2. In the preparation pipeline (prepare.py), after templating: `grammar_spec` picks the
   GrammarSpec (a forced call uses the request's tool parser format, from its TextSpec) and
   `compile_spec` compiles it in the grammar worker thread (cached by spec and tokenizer;
   neither the event loop nor the engine thread waits on a compile); each choice's
   SamplingParams is then built with it (the engine holds the grammar off while the choice's
   SamplingParams.reasoning says the model reasons; reasoning_spec.py).
   A schema or grammar the compiler refuses is a 400 naming the field and the problem; the
   engine only receives compiled grammars.
"""
from __future__ import annotations

import asyncio
import json
import logging

from inference.engine.grammar import GrammarError, GrammarSpec, compiler_for

from .errors import bad_request
from .schema_size import check_schema_size
from .tool_grammar import ToolGrammarError, forced_tool_names, tool_call_grammar

log = logging.getLogger("metrale.api")

STRUCTURED_OUTPUT_KEYS = ("json", "regex", "choice", "grammar", "json_object")
# The most strings a `choice` may list: llguidance's parser holds at most 2,000 items a row, and a list past
# about that many compiles (seconds on the one grammar thread) into a grammar that then allows no token.
MAX_CHOICES = 1000


def _schema_of(value, param: str) -> dict | bool:
    """A JSON schema given as an object, a boolean, or a JSON string holding one (vLLM accepts strings)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise bad_request(f"'{param}' is not valid JSON: {exc}", param) from exc
    if not isinstance(value, (dict, bool)):
        raise bad_request(f"'{param}' must be a JSON schema (an object).", param)
    check_schema_size(value, param)
    return value


def _response_format_spec(fmt: dict, param: str, flat: bool) -> tuple[GrammarSpec, str] | None:
    """(spec, param of the schema) of a response_format (chat, completions) or a text.format
    (Responses, `flat`: the json_schema fields beside type); None for text."""
    kind = fmt.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return GrammarSpec.json_schema({"type": "object"}), param
    if kind != "json_schema":
        raise bad_request(f"'{param}.type' must be text, json_object or json_schema; got {kind!r}.",
                          f"{param}.type")
    body = fmt if flat else fmt.get("json_schema")
    where = param if flat else f"{param}.json_schema"
    if not isinstance(body, dict):
        raise bad_request(f"'{where}' is required when '{param}.type' is json_schema.", where)
    name = body.get("name")
    if not isinstance(name, str) or not name:
        raise bad_request(f"'{where}.name' must be a non-empty string.", f"{where}.name")
    if "schema" not in body:
        raise bad_request(f"'{where}.schema' is required.", f"{where}.schema")
    return GrammarSpec.json_schema(_schema_of(body["schema"], f"{where}.schema")), f"{where}.schema"


def _structured_outputs_spec(so: dict) -> tuple[GrammarSpec, str]:
    """vLLM's structured_outputs: exactly one of json, regex, choice, grammar, json_object."""
    unknown = sorted(set(so) - set(STRUCTURED_OUTPUT_KEYS))
    if unknown:
        raise bad_request(f"'structured_outputs.{unknown[0]}' is not supported; use one of "
                          f"{', '.join(STRUCTURED_OUTPUT_KEYS)}.", f"structured_outputs.{unknown[0]}",
                          code="unsupported_parameter")
    given = [k for k in STRUCTURED_OUTPUT_KEYS if so.get(k) not in (None, False)]
    if len(given) != 1:
        raise bad_request("'structured_outputs' must set exactly one of " + ", ".join(STRUCTURED_OUTPUT_KEYS)
                          + (f"; it sets {' and '.join(given)}." if given else "."), "structured_outputs")
    key = given[0]
    value, param = so[key], f"structured_outputs.{key}"
    if key == "json":
        return GrammarSpec.json_schema(_schema_of(value, param)), param
    if key == "json_object":
        if value is not True:
            raise bad_request(f"'{param}' must be true.", param)
        return GrammarSpec.json_schema({"type": "object"}), param
    if key == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
            raise bad_request(f"'{param}' must be a non-empty array of strings.", param)
        if len(value) > MAX_CHOICES:
            raise bad_request(f"'{param}' has {len(value)} strings; at most {MAX_CHOICES} are served.", param)
        check_schema_size(value, param, "a choice list")
        return GrammarSpec.choice(value), param
    if not isinstance(value, str) or not value.strip():
        raise bad_request(f"'{param}' must be a non-empty string.", param)
    check_schema_size(value, param, "a regex or grammar")
    return GrammarSpec("regex" if key == "regex" else "ebnf", value), param


def check_request(attrs: dict, *, format_field: str = "response_format") -> None:
    """Validate the structured-output fields of a request (shapes, one mode). Raises ApiError 400.

    format_field: "response_format" (chat, completions) or "text" (Responses' text.format).
    """
    requested_grammar(attrs, format_field)


def _forced(tools, tool_choice) -> tuple[str, ...] | None:
    """The tool names a forced tool_choice allows; None when it forces nothing or is invalid (the
    tools validation answers that one with its own 400)."""
    try:
        return forced_tool_names(tools, tool_choice)
    except ToolGrammarError:
        return None


def requested_grammar(attrs: dict, format_field: str = "response_format") -> tuple[GrammarSpec, str] | None:
    """(spec, param naming its field) of a request's response_format / text.format / structured_outputs,
    or None. Raises ApiError 400 for a malformed or doubled mode."""
    specs = []
    if format_field == "text":
        fmt = (attrs.get("text") or {}).get("format") or {}
        found = _response_format_spec(fmt, "text.format", flat=True)
        if found is not None:
            specs.append(found)
    elif attrs.get(format_field) is not None:
        found = _response_format_spec(attrs[format_field], format_field, flat=False)
        if found is not None:
            specs.append(found)
    if attrs.get("structured_outputs") is not None:
        specs.append(_structured_outputs_spec(attrs["structured_outputs"]))
    if len(specs) > 1:
        raise bad_request(f"Only one structured-output mode may be used per request; this one sets both "
                          f"'{specs[0][1].split('.')[0]}' and 'structured_outputs'.", "structured_outputs")
    forced = _forced(attrs.get("tools"), attrs.get("tool_choice"))
    if forced and specs and specs[0][1].startswith("structured_outputs"):
        raise bad_request("'structured_outputs' cannot be combined with a tool_choice that forces a tool call: "
                          "only one grammar can constrain the output.", "structured_outputs")
    return specs[0] if specs else None


def grammar_spec(requested: tuple[GrammarSpec, str] | None, text=None) -> tuple[GrammarSpec, str] | None:
    """(spec, param naming the field it came from) that constrains a request, or None.

    requested: requested_grammar's answer. text: the request's TextSpec (text_pipeline.py; None
    for completions): with a forced tool call, its tool parser's format gives the call grammar
    (tool_grammar.py) over its tools, in place of `requested`; a format without a grammar
    builder stays unconstrained (its parser still reads the calls).
    """
    if text is not None and text.tool_parser:
        names = _forced(text.tools, text.tool_choice)
        lark = tool_call_grammar(text.tool_parser, text.tools, names, text.parallel_tool_calls) if names else None
        if lark is not None:
            return GrammarSpec("lark", lark), "tools"
        if names:
            log.debug("tool_choice %r: the %s format has no grammar; the call is not constrained",
                      text.tool_choice, text.tool_parser)
    return requested


async def compile_spec(tokenizer, spec: GrammarSpec, param: str):
    """The CompiledGrammar for `spec`, compiled off the event loop (cached). Raises ApiError 400
    naming `param` when the schema or grammar is invalid or uses what the compiler cannot enforce."""
    try:
        # Shielded: a client that leaves must not cancel a compile other requests share.
        return await asyncio.shield(asyncio.wrap_future(compiler_for(tokenizer).submit(spec)))
    except GrammarError as exc:
        what = {"json_schema": "JSON schema", "regex": "regular expression", "choice": "choice list"}.get(
            spec.kind, "grammar")
        if param == "tools":
            what = "tool parameters schema"
        raise bad_request(f"Invalid {what} in '{param}': {exc}", param) from exc
