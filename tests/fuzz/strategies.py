"""Hypothesis strategies for request bodies, built from each route's own serializer (routes.py): a value of
the right kind and range for every declared field (a field of a new kind gets any JSON), and the hostile
kinds for any of them (wrong JSON types, NaN and infinities, huge integer literals, lone surrogates, deep
nesting, huge strings, odd tool schemas), plus whole bodies that are not JSON objects at all.

A generated body is a `Body`: its bytes, the field it mutated (None for a body-level mutation), and the
content type to send it with.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from hypothesis import strategies as st
from rest_framework import serializers

from inference.serving import fields as strict
from inference.serving import protocol, thinking, tool_fields
from inference.serving.fields import INT64_MAX, INT64_MIN
from inference.serving.json_body import MAX_JSON_DEPTH
from anthropic_api import protocol as anthropic
from ollama_api import protocol as ollama
from responses_api import protocol as responses

from .routes import ROUTES, Route, declared_fields

VOCAB = 49152  # SmolLM2's; ids past it are a 400 of their own


class Raw(str):
    """A literal spliced into the body's JSON text as is (what json.dumps cannot write: 5,000-digit integers,
    nesting past the limit)."""


@dataclass(frozen=True)
class Body:
    raw: bytes
    mutated: str | None  # the top-level field a single-field mutation changed
    content_type: str = "application/json"


def dumps(value, ascii: bool = True) -> bytes:
    """JSON bytes of `value`, Raw literals spliced in (json.dumps writes NaN and Infinity for non-finite floats,
    which is what a careless client sends too). ascii=False writes text as UTF-8, and a lone surrogate as the
    bytes UTF-8 forbids for it."""
    raws: list[str] = []

    def mark(v):
        if isinstance(v, Raw):
            raws.append(str(v))
            return f"@@RAW{len(raws) - 1}@@"
        if isinstance(v, dict):
            return {k: mark(x) for k, x in v.items()}
        if isinstance(v, list):
            return [mark(x) for x in v]
        return v

    text = json.dumps(mark(value), ensure_ascii=ascii)
    for i, literal in enumerate(raws):
        text = text.replace(f'"@@RAW{i}@@"', literal)
    return text.encode("utf-8", "surrogatepass")


# --- leaves -----------------------------------------------------------------------------------------

# Text as clients send it, and as attackers do: any code point (NUL, controls, RTL marks, astral planes) ...
text = st.text(max_size=24)
# ... and with a lone surrogate somewhere (json.dumps writes it as a \ud8xx escape).
surrogate_text = st.builds(lambda a, s, b: a + s + b, st.text(max_size=6),
                           st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff"]), st.text(max_size=6))
huge_text = st.integers(10_000, 300_000).map(lambda n: "x" * n)
huge_int = st.integers(4301, 6000).map(lambda n: Raw("9" * n))
deep = st.integers(MAX_JSON_DEPTH, 3000).flatmap(
    lambda n: st.sampled_from([Raw("[" * n + "]" * n), Raw('{"a":' * n + "1" + "}" * n)]))
numbers = st.one_of(st.integers(INT64_MIN - 10, INT64_MAX + 10), st.integers(), st.floats(),
                    st.sampled_from([0, -1, 1, 2**63, 2**64, 10**300, 1e308, -1e308, 0.5, 1e-300]))
json_leaf = st.one_of(st.none(), st.booleans(), numbers, text)
any_json = st.recursive(json_leaf, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                          st.dictionaries(text, kids, max_size=4)), max_leaves=10)
# What no field accepts as valid, whatever its kind: the hostile values.
hostile = st.one_of(any_json, surrogate_text, huge_int, deep, huge_text,
                    st.sampled_from([float("nan"), float("inf"), float("-inf")]))

# --- JSON schemas, as tool parameters and response formats (odd ones included) -------------------------------

_KEYWORDS = ["type", "properties", "items", "required", "enum", "const", "anyOf", "oneOf", "allOf", "not", "$ref",
             "$defs", "minimum", "maximum", "minLength", "maxLength", "pattern", "format", "additionalProperties",
             "minItems", "maxItems", "uniqueItems", "prefixItems", "multipleOf", "exclusiveMinimum", "if", "then",
             "patternProperties", "propertyNames", "contains", "default", "description", "title"]
_TYPES = st.sampled_from(["object", "string", "integer", "number", "boolean", "array", "null", "strin",
                          ["string", "null"], 5])
schema = st.recursive(
    st.one_of(st.fixed_dictionaries({"type": _TYPES}), st.booleans(), st.just({}),
              st.fixed_dictionaries({"type": st.just("string"), "pattern": st.sampled_from(
                  ["[a-z]+", "(?=a)b", "a{1000}", "((", "\\d{2,3}"])})),
    lambda kids: st.one_of(
        st.dictionaries(st.sampled_from(_KEYWORDS), st.one_of(kids, json_leaf, st.lists(kids, max_size=3),
                                                              st.dictionaries(text, kids, max_size=3)), max_size=4),
        st.fixed_dictionaries({"type": st.just("object"), "properties": st.dictionaries(
            st.text(max_size=6), kids, max_size=4)}, optional={"required": st.lists(st.text(max_size=6), max_size=3)}),
    ), max_leaves=10)

# --- values per field kind ------------------------------------------------------------------------------

_ROLES = st.sampled_from(["system", "developer", "user", "assistant", "tool", "function", "wizard"])
_PART = st.one_of(st.fixed_dictionaries({"type": st.sampled_from(["text", "input_text", "output_text"]),
                                         "text": text}),
                  st.fixed_dictionaries({"type": st.sampled_from(["image_url", "input_audio", "file", "refusal",
                                                                  "nope"])}),
                  any_json)
_TOOL_CALL = st.fixed_dictionaries({"id": text, "type": st.just("function"), "function": st.fixed_dictionaries(
    {"name": st.sampled_from(["f0", "f1", "x"]), "arguments": st.one_of(text, st.just('{"a": 1}'), any_json)})})
message = st.one_of(
    st.fixed_dictionaries({"role": _ROLES, "content": st.one_of(text, st.lists(_PART, max_size=3), st.none())},
                          optional={"name": text, "tool_call_id": text,
                                    "tool_calls": st.lists(_TOOL_CALL, max_size=2)}),
    any_json)
messages = st.lists(message, min_size=1, max_size=4)


def _tool(i: int, params, flat: bool) -> dict:
    fn = {"name": f"f{i}", "parameters": params}
    return {"type": "function", **fn} if flat else {"type": "function", "function": fn}


tools = st.one_of(
    st.builds(lambda ps, flat: [_tool(i, p, flat) for i, p in enumerate(ps)], st.lists(schema, min_size=1, max_size=5),
              st.booleans()),
    st.lists(st.one_of(any_json, st.fixed_dictionaries({"type": st.sampled_from(["function", "web_search"]),
                                                        "function": any_json})), max_size=3))
tool_choice = st.one_of(st.sampled_from(["none", "auto", "required", "always"]),
                        st.fixed_dictionaries({"type": st.just("function"),
                                               "function": st.fixed_dictionaries({"name": st.sampled_from(["f0", "f1",
                                                                                                          "g"])})}),
                        st.fixed_dictionaries({"type": st.just("function"), "name": st.sampled_from(["f0", "g"])}))
_ITEM = st.one_of(
    message,
    st.fixed_dictionaries({"type": st.just("function_call"), "call_id": text, "name": text, "arguments": text}),
    st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": text,
                           "output": st.one_of(text, st.lists(_PART, max_size=2))}),
    st.fixed_dictionaries({"type": st.just("reasoning"), "summary": st.lists(any_json, max_size=2)},
                          optional={"content": any_json, "encrypted_content": any_json}),
    st.fixed_dictionaries({"type": st.one_of(text, any_json), "id": st.one_of(text, any_json)}))
items = st.lists(_ITEM, max_size=22)
response_format = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object", "xml"])}),
    st.fixed_dictionaries({"type": st.just("json_schema"), "json_schema": st.fixed_dictionaries(
        {"name": st.one_of(text, st.just("s")), "schema": schema})}))
text_config = st.one_of(
    st.fixed_dictionaries({"format": st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object", "yaml"])})}),
    st.fixed_dictionaries({"format": st.fixed_dictionaries({"type": st.just("json_schema"), "name": st.just("s"),
                                                            "schema": schema})},
                          optional={"verbosity": st.sampled_from(["low", "high", "loud"])}))
structured_outputs = st.dictionaries(st.sampled_from(["json", "regex", "choice", "grammar", "json_object", "other"]),
                                     st.one_of(schema, text, st.lists(text, max_size=3), st.booleans()), max_size=2)
token_ids = st.lists(st.one_of(st.integers(0, VOCAB - 1), st.integers(-5, VOCAB + 5), st.integers(0, 2**70)),
                     max_size=8)

# Anthropic's Messages: blocks of every kind (media and unknown ones too), tools, tool_choice, thinking.
_BLOCK = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": text}, optional={"cache_control": any_json}),
    st.fixed_dictionaries({"type": st.just("tool_use"), "id": text, "name": st.sampled_from(["f0", "f1", "bad name"]),
                           "input": st.one_of(st.dictionaries(text, any_json, max_size=2), any_json)}),
    st.fixed_dictionaries({"type": st.just("tool_result"), "tool_use_id": text},
                          optional={"content": st.one_of(text, st.lists(any_json, max_size=2)),
                                    "is_error": st.one_of(st.booleans(), any_json)}),
    st.fixed_dictionaries({"type": st.just("thinking"), "thinking": text}, optional={"signature": text}),
    st.fixed_dictionaries({"type": st.sampled_from(["redacted_thinking", "image", "document", "nope"]),
                           "data": text}),
    any_json)
anthropic_messages = st.lists(st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "ctx", "msg", "tool", "wizard"]),
                           "content": st.one_of(text, st.lists(_BLOCK, max_size=3), st.none())}),
    any_json), min_size=1, max_size=4)
anthropic_tools = st.lists(st.one_of(
    st.fixed_dictionaries({"name": st.sampled_from(["f0", "f1", "x y"]), "input_schema": schema},
                          optional={"description": st.one_of(text, any_json),
                                    "type": st.sampled_from(["custom", "bash_20250124"])}),
    any_json), max_size=3)
anthropic_tool_choice = st.fixed_dictionaries(
    {"type": st.sampled_from(["auto", "any", "tool", "none", "required"])},
    optional={"name": st.sampled_from(["f0", "f1", "g"]), "disable_parallel_tool_use": st.one_of(st.booleans(),
                                                                                               any_json)})
anthropic_thinking = st.fixed_dictionaries(
    {"type": st.sampled_from(["enabled", "disabled", "adaptive", "maybe"])},
    optional={"budget_tokens": st.one_of(st.integers(-2, 64), any_json), "display": st.sampled_from(["omitted", "x"])})

# Ollama's: messages with their own fields (thinking, images, tool_calls with object arguments, tool_name), think,
# format, images, embed's input.
_OLLAMA_CALL = st.fixed_dictionaries(
    {"function": st.one_of(st.fixed_dictionaries({"name": st.sampled_from(["f0", "x", ""]), "arguments": st.one_of(
        st.dictionaries(text, any_json, max_size=2), text, any_json)}), any_json)},
    optional={"id": st.one_of(text, any_json)})
ollama_messages = st.lists(st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant", "tool", "USER", "wizard"]),
                           "content": st.one_of(text, st.none(), any_json)},
                          optional={"thinking": st.one_of(text, any_json),
                                    "images": st.one_of(st.lists(text, max_size=2), any_json),
                                    "tool_calls": st.one_of(st.lists(_OLLAMA_CALL, max_size=2), any_json),
                                    "tool_name": st.one_of(text, any_json), "tool_call_id": st.one_of(text, any_json)}),
    any_json), max_size=4)

# Values of the right shape for the field classes that are not plain numbers, strings or booleans. A field
# class missing here gets any JSON, and the typed kinds below come from the field's own declaration.
BY_CLASS = {
    protocol.MessagesField: messages,
    protocol.PromptField: st.one_of(text, st.lists(text, min_size=1, max_size=3), token_ids,
                                    st.lists(token_ids, min_size=1, max_size=2)),
    protocol.AnyField: any_json,
    strict.StopField: st.one_of(text, st.lists(text, max_size=5)),
    strict.TokenIdListField: token_ids,
    strict.StringListField: st.lists(text, max_size=5),
    strict.LogitBiasField: st.dictionaries(st.one_of(st.integers(-3, VOCAB + 3).map(str), text),
                                           st.one_of(st.floats(-120, 120), any_json), max_size=4),
    strict.MetadataField: st.dictionaries(st.text(max_size=70), st.one_of(st.text(max_size=20), huge_text, any_json),
                                          max_size=17),
    strict.ObjectField: st.dictionaries(text, any_json, max_size=3),
    thinking.ThinkingField: st.fixed_dictionaries({}, optional={
        "type": st.sampled_from(["enabled", "disabled", "maybe"]),
        "budget_tokens": st.one_of(st.integers(-2, 64), any_json)}),
    tool_fields.ToolsField: tools,
    tool_fields.ToolChoiceField: tool_choice,
    responses.InputField: st.one_of(text, items),
    responses.ItemsField: items,
    responses.ReasoningField: st.fixed_dictionaries({}, optional={
        "effort": st.sampled_from(["low", "high", "none", "extreme"]), "summary": st.sampled_from(["auto", "x"])}),
    responses.TextConfigField: text_config,
    responses.ConversationRefField: st.one_of(text, st.fixed_dictionaries({"id": text})),
    responses.IncludeField: st.lists(st.sampled_from([*responses.INCLUDABLE, "everything"]), max_size=3),
    anthropic.MessagesField: anthropic_messages,
    anthropic.SystemField: st.one_of(text, st.lists(_BLOCK, max_size=3)),
    anthropic.ToolsField: anthropic_tools,
    anthropic.ToolChoiceField: anthropic_tool_choice,
    anthropic.ThinkingField: anthropic_thinking,
    anthropic.MetadataField: st.fixed_dictionaries({}, optional={"user_id": st.one_of(text, huge_text, any_json)}),
    ollama.MessagesField: ollama_messages,
    ollama.ToolsField: tools,
    ollama.ThinkField: st.one_of(st.booleans(), st.sampled_from(["low", "medium", "high", "max", "extreme"]), any_json),
    ollama.FormatField: st.one_of(st.sampled_from(["json", "", "yaml"]), schema, any_json),
    ollama.ImagesField: st.one_of(st.lists(text, max_size=2), any_json),
    ollama.EmbedInputField: st.one_of(text, st.lists(text, max_size=4), any_json),
    anthropic.OutputConfigField: st.fixed_dictionaries({}, optional={
        "effort": st.one_of(text, any_json), "format": st.fixed_dictionaries(
            {"type": st.sampled_from(["json_schema", "xml"])}, optional={"schema": schema})}),
}
# ObjectFields whose content has a shape of its own.
BY_NAME = {"response_format": response_format, "structured_outputs": structured_outputs}


def typed(field: serializers.Field):
    """Values of the field's declared kind, in and around its range (its own bounds, then just past them)."""
    if isinstance(field, strict.NumberField):
        lim = field.limits
        low = INT64_MIN if lim["low"] is None else lim["low"]
        high = INT64_MAX if lim["high"] is None else lim["high"]
        if lim["integer"]:
            inside = st.integers(low + lim["low_open"], high)
            edges = st.sampled_from([low, high, low - 1, high + 1])
        else:
            inside = st.floats(low, high, exclude_min=lim["low_open"])
            edges = st.sampled_from([low, high, low - 1e-6, high + 1e-6, float(high) * 2])
        return st.one_of(inside, inside, edges)
    if isinstance(field, strict.StringField):
        return st.sampled_from(field.choices) if field.choices else text
    if isinstance(field, strict.BooleanField):
        return st.booleans()
    return None


def valid_for(name: str, field: serializers.Field):
    """A strategy of plausible values for `field` (right kind and shape, not always valid)."""
    if name in BY_NAME:
        return BY_NAME[name]
    for cls in type(field).__mro__:
        if cls in BY_CLASS:
            return BY_CLASS[cls]
    kind = typed(field)
    return any_json if kind is None else kind


def value_for(name: str, field: serializers.Field):
    """Plausible values, hostile ones, and null."""
    return st.one_of(valid_for(name, field), valid_for(name, field), hostile, st.none())


# For the real engine: completion lengths and choices kept small, so every example ends in a few steps.
SHORT = {"max_tokens": st.integers(1, 4), "max_completion_tokens": st.integers(1, 4),
         "max_output_tokens": st.integers(1, 4), "n": st.integers(1, 2), "best_of": st.integers(1, 2),
         "min_tokens": st.integers(0, 4), "options": st.fixed_dictionaries({"num_predict": st.integers(1, 4)})}


def top_level(route: Route, overrides: dict | None = None) -> dict[str, st.SearchStrategy]:
    """{top-level field: strategy}; a nested serializer's fields become an object of theirs. overrides:
    {field: strategy} used instead (e.g. SHORT)."""
    out = {}
    for name, field in route.serializer().fields.items():
        if overrides and name in overrides:
            out[name] = overrides[name]
        elif isinstance(field, serializers.Serializer):
            inner = {n: value_for(n, f) for n, f in field.fields.items()}
            out[name] = st.one_of(st.fixed_dictionaries({}, optional=inner), hostile, st.none())
        else:
            out[name] = value_for(name, field)
    return out


def field_mutation(route: Route, overrides: dict | None = None):
    """A body of the route's base with one field set to a generated value: Body(mutated=that field)."""
    choices = top_level(route, overrides)
    return st.sampled_from(sorted(choices)).flatmap(
        lambda name: st.tuples(choices[name], st.booleans()).map(
            lambda va: Body(dumps({**route.base, name: va[0]}, ascii=va[1]), name)))


_GOOD_SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]}
_words = st.text(alphabet="abcdefgh ijklm", min_size=1, max_size=12)
# Values each field accepts (alone), by field name: the fields whose shape has rules of its own.
VALID_BY_NAME = {
    # Every kind of `model`: none (the default), the served one, unknown ones, an adapter's forms, the
    # embedding model's name on a chat route, paths and a GGUF file name (never loaded from a request).
    "model": st.sampled_from(["", "smollm2-135m-instruct", "no-such-model", "smollm2-135m-instruct:poet", "poet",
                              "all-minilm-l6-v2", "/etc/passwd", "../models/x", "tiny.gguf", "x" * 300, "\u00e9"]),
    "keep_alive": st.one_of(st.sampled_from(["5m", "0", "-1", "1h30m", "300ms"]), st.integers(-10, 3600),
                            st.floats(-10, 3600)),
    "messages": st.lists(st.fixed_dictionaries({"role": st.just("user"), "content": _words}),
                                               min_size=1, max_size=2),
    "prompt": st.one_of(_words, st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=6)),
    "input": st.one_of(_words, st.lists(st.fixed_dictionaries({"role": st.just("user"), "content": _words}),
                                        min_size=1, max_size=2)),
    "stop": st.lists(_words, max_size=4), "stop_token_ids": st.lists(st.integers(0, VOCAB - 1), max_size=3),
    "logit_bias": st.dictionaries(st.integers(0, VOCAB - 1).map(str), st.floats(-100, 100), max_size=3),
    "metadata": st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
    "dry_sequence_breakers": st.lists(_words, max_size=3), "modalities": st.just(["text"]),
    "thinking": st.fixed_dictionaries({"type": st.sampled_from(["enabled", "disabled"]),
                                       "budget_tokens": st.integers(0, 8)}),
    "tools": st.integers(1, 3).map(lambda n: [_tool(i, _GOOD_SCHEMA, False) for i in range(n)]),
    "tool_choice": st.sampled_from(["auto", "none"]),
    "response_format": st.sampled_from([{"type": "text"}, {"type": "json_object"},
                                        {"type": "json_schema", "json_schema": {"name": "s", "schema": _GOOD_SCHEMA}}]),
    "structured_outputs": st.sampled_from([{"choice": ["yes", "no"]}, {"regex": "[a-z]{1,5}"}]),
    "text": st.sampled_from([{"format": {"type": "text"}}, {"format": {"type": "json_object"}}]),
    "reasoning": st.fixed_dictionaries({"effort": st.sampled_from(["low", "medium", "high"])}),
    "chat_template_kwargs": st.just({}), "include": st.just([]), "suffix": st.none(),
    # Ollama's
    "think": st.just(False), "format": st.sampled_from(["json", _GOOD_SCHEMA]), "images": st.just([]),
    "options": st.fixed_dictionaries({}, optional={"temperature": st.floats(0, 2), "top_k": st.integers(0, 50),
                                                   "seed": st.integers(-1, 100), "stop": st.lists(_words, max_size=2),
                                                   "num_predict": st.integers(1, 8), "num_ctx": st.integers(64, 4096)}),
    "context": st.lists(st.integers(0, VOCAB - 1), max_size=4),
    "template": st.sampled_from(["{{ .Prompt }}", "{{ if .System }}{{ .System }}\n{{ end }}{{ .Prompt }}"]),
    "source": st.sampled_from(["smollm2-135m-instruct", "smollm2-135m-instruct:latest"]),
    "destination": st.sampled_from(["fuzzed", "other:v1", "ns/model:tag"]),
}
# Fields a plausible body leaves out: they need stored objects or are refused whenever set; a beam search
# runs width beams up to the context's end (tests/serving/test_beam_search.py).
NOT_PLAUSIBLE = {"prediction", "audio", "web_search_options", "previous_response_id", "conversation", "items",
                 "stream_options", "echo", "continue_final_message", "add_generation_prompt", "top_logprobs",
                 "use_beam_search"}


def valid_only(name: str, field: serializers.Field):
    """Values `field` accepts on its own: VALID_BY_NAME, else the declared range or choices."""
    if name in VALID_BY_NAME:
        return VALID_BY_NAME[name]
    if isinstance(field, strict.NumberField):
        lim = field.limits
        low = INT64_MIN if lim["low"] is None else lim["low"]
        high = INT64_MAX if lim["high"] is None else lim["high"]
        if lim["integer"]:
            return st.integers(low, high)
        return st.floats(low, high, exclude_min=lim["low_open"])
    return typed(field)


def plausible_fields(route: Route, overrides: dict | None = None):
    """A body with up to four fields set to values each accepts alone: most of them reach the engine."""
    choices = {}
    for name, field in route.serializer().fields.items():
        if name in NOT_PLAUSIBLE or isinstance(field, serializers.Serializer):
            continue
        strategy = (overrides or {}).get(name)
        if strategy is None:
            strategy = valid_only(name, field)
        if strategy is not None:
            choices[name] = strategy
    if not choices:
        return st.just(Body(dumps(route.base), None))
    names = st.lists(st.sampled_from(sorted(choices)), max_size=4, unique=True)
    return names.flatmap(lambda ns: st.fixed_dictionaries({n: choices[n] for n in ns})).map(
        lambda extra: Body(dumps({**route.base, **extra}), None))


def many_fields(route: Route, overrides: dict | None = None):
    """A body with several generated fields at once (cross-field rules, combinations)."""
    choices = top_level(route, overrides)
    return st.fixed_dictionaries({}, optional=choices).map(lambda extra: Body(dumps({**route.base, **extra}), None))


def _splice_bad_utf8(raw: bytes, at: int, junk: bytes) -> bytes:
    at = at % (len(raw) + 1)
    return raw[:at] + junk + raw[at:]


def whole_body(route: Route):
    """Bodies that are not a JSON object, not UTF-8 or not JSON at all, or sent as another content type."""
    base = dumps(route.base)
    return st.one_of(
        st.binary(max_size=64).map(lambda b: Body(b, None)),
        st.builds(lambda at, junk: Body(_splice_bad_utf8(base, at, junk), None), st.integers(0, 200),
                  st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x00"])),
        st.integers(1, len(base)).map(lambda n: Body(base[:n], None)),
        any_json.map(lambda v: Body(dumps(v), None)),
        deep.map(lambda d: Body(str(d).encode(), None)),
        st.sampled_from([b"\xef\xbb\xbf" + base, b"NaN", b"{}" * 3, base + b"x", b" " * 100 + base]).map(
            lambda b: Body(b, None)),
        st.sampled_from(["multipart/form-data; boundary=x", "multipart/form-data", "text/plain",
                         "application/x-www-form-urlencoded", "application/json; charset=utf-16"]).map(
            lambda ct: Body(b"--x\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nb\r\n--x--\r\n", None, ct)),
    )


def bodies(route: Route, overrides: dict | None = None):
    """Every kind of body for the route: mostly single-field mutations, then combinations and whole bodies.
    overrides: {field: strategy} in place of the field's own (e.g. SHORT)."""
    mutation = field_mutation(route, overrides)
    return st.one_of(mutation, mutation, mutation, many_fields(route, overrides), whole_body(route))


def routes_and_bodies(routes=ROUTES, overrides: dict | None = None, plausible: float = 0.0):
    """(route, Body) over the routes; the fraction `plausible` of them plausible_fields bodies."""
    def of(route):
        # (one_of would flatten into bodies' own branches and weigh them all alike)
        kinds = st.integers(0, 99).flatmap(
            lambda k: plausible_fields(route, overrides) if k < plausible * 100 else bodies(route, overrides))
        return kinds.map(lambda b: (route, b))
    return st.sampled_from(routes).flatmap(of)


def covered_fields() -> dict[str, list[str]]:
    """{route path: its declared fields (dotted)} that the strategies fill (all of them, by construction)."""
    return {route.path: sorted(declared_fields(route.serializer)) for route in ROUTES}
