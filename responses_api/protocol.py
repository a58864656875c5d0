"""Request validation for /v1/responses and /v1/conversations -> ApiError 400 naming the field.

Source: OpenAI API reference, "Create a model response", "List input items", "Create a
conversation", "Create items" (field names, types, limits: metadata 16 pairs with keys up to
64 and values up to 512 characters, at most 20 items per call, list `limit` 1-100 default 20,
`order` default desc); ../shared/reference/openai-contract.md section 2; the original server's
behaviour (../shared/reference/metrale-behaviour.md section 3, "Responses request").
Fields Responses shares with chat (temperature, top_p, user, service_tier and the sampling
extensions top_k, min_p, seed, stop, ...) are the chat request's own, and every other field is one
of serving.fields' strict fields: one validator, one set of types and ranges for every route.
"""

from __future__ import annotations

import copy

from rest_framework import serializers

from inference.serving.errors import bad_request
from inference.serving.fields import (INT64_MAX, BooleanField, IntegerField, KeepAliveField, MetadataField, StrictField,
                                      StringField)
from inference.serving.protocol import MAX_TOP_LOGPROBS, ChatCompletionRequest, opt, parse_json_body, validate
from inference.serving.structured import check_request as check_structured_request
from inference.serving.tool_fields import ToolChoiceField, ToolsField, check_tool_choice
from inference.serving.tool_grammar import check_forced_tools

from .models import new_id

MAX_ITEMS_PER_CALL = 20
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
# The one includable value this server has data for: the output text's logprobs (service.generation_request).
LOGPROBS_INCLUDE = "message.output_text.logprobs"
INCLUDABLE = (
    "file_search_call.results", "web_search_call.results", "web_search_call.action.sources",
    "message.input_image.image_url", "computer_call_output.output.image_url",
    "code_interpreter_call.outputs", "reasoning.encrypted_content", LOGPROBS_INCLUDE,
)
# The chat request's fields that Responses has too, with the same meaning: taken from the chat request
# (one validator for both), with their validate_<name> hooks.
SHARED_FIELDS = (
    "temperature", "top_p", "user", "service_tier",
    "top_k", "min_p", "top_n_sigma", "seed", "stop", "ignore_eos", "include_stop_str_in_output",
    "min_tokens", "repetition_penalty", "presence_penalty", "frequency_penalty", "logit_bias",
    "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
    # Thinking controls (inference.serving.thinking), with `reasoning.effort` below them.
    "thinking", "thinking_token_budget", "max_thinking_tokens", "thinking_budget",
)
_ITEM_ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco",
                   "reasoning": "rs"}


def _object(value, param: str) -> dict:
    if not isinstance(value, dict):
        raise bad_request(f"'{param}' must be an object.", param)
    return value


def _string(value, param: str, *, required: bool = True) -> str | None:
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise bad_request(f"'{param}' must be a string.", param)
    return value


# --- input items ---------------------------------------------------------------------------


def _content_parts(content, role: str, param: str) -> list[dict]:
    """A message's content as a list of text parts (output_text for the assistant)."""
    text_type = "output_text" if role == "assistant" else "input_text"
    if isinstance(content, str):
        parts = [{"type": text_type, "text": content}]
    elif isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            p = f"{param}[{j}]"
            part = _object(part, p)
            kind = part.get("type")
            if kind in ("input_text", "output_text", "text"):
                parts.append({"type": text_type, "text": _string(part.get("text"), f"{p}.text")})
            elif kind == "refusal" and role == "assistant":
                parts.append({"type": "refusal",
                              "refusal": _string(part.get("refusal"), f"{p}.refusal")})
            else:
                raise bad_request(
                    f"Content part type {kind!r} is not supported: this model accepts text only.",
                    f"{p}.type", code="unsupported_content_type")
    else:
        raise bad_request(f"'{param}' must be a string or an array of content parts.", param)
    if role == "assistant":
        for part in parts:
            if part["type"] == "output_text":
                part.update(annotations=[], logprobs=[])
    return parts


def normalize_item(raw, param: str) -> dict:
    """One input item in the shape the API returns it (with an id and a status).

    Accepted: `message` (roles user, assistant, system, developer; a `type` may be omitted),
    `function_call`, `function_call_output` and `reasoning`. Raises ApiError 400 for anything
    else, naming the field in `param` (e.g. `input[2].content[0].type`).
    """
    raw = _object(raw, param)
    kind = raw.get("type") or ("message" if "role" in raw else None)
    item_id = raw.get("id")
    if item_id is not None and (not isinstance(item_id, str) or not 0 < len(item_id) <= 100):
        raise bad_request(f"'{param}.id' must be a string of 1 to 100 characters.", f"{param}.id")
    if not isinstance(kind, str) or kind not in _ITEM_ID_PREFIX:
        what = "missing" if kind is None else f"{kind!r}, which is not supported here"
        raise bad_request(
            f"The type of '{param}' is {what}: input items may be message, function_call, "
            "function_call_output or reasoning.", f"{param}.type")
    item = {"id": item_id or new_id(_ITEM_ID_PREFIX[kind]), "type": kind}
    if kind == "message":
        role = raw.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise bad_request(f"'{param}.role' must be one of user, assistant, system, developer; "
                              f"got {role!r}.", f"{param}.role")
        if raw.get("content") is None:
            raise bad_request(f"'{param}.content' is required.", f"{param}.content")
        item.update(role=role, status="completed",
                    content=_content_parts(raw["content"], role, f"{param}.content"))
    elif kind == "function_call":
        item.update(call_id=_string(raw.get("call_id"), f"{param}.call_id"),
                    name=_string(raw.get("name"), f"{param}.name"),
                    arguments=_string(raw.get("arguments"), f"{param}.arguments"),
                    status="completed")
    elif kind == "function_call_output":
        output = raw.get("output")
        if not isinstance(output, str):
            output = "".join(p["text"] for p in _content_parts(output, "user", f"{param}.output"))
        item.update(call_id=_string(raw.get("call_id"), f"{param}.call_id"), output=output,
                    status="completed")
    else:
        summary = raw.get("summary", [])
        if not isinstance(summary, list):
            raise bad_request(f"'{param}.summary' must be an array.", f"{param}.summary")
        item["summary"] = summary
        for key in ("content", "encrypted_content"):
            if raw.get(key) is not None:
                item[key] = raw[key]
    return item


def normalize_items(value, param: str, *, max_items: int | None = None) -> list[dict]:
    """A list of input items, normalized (see normalize_item). Raises ApiError 400."""
    if not isinstance(value, list):
        raise bad_request(f"'{param}' must be an array of items.", param)
    if max_items is not None and len(value) > max_items:
        raise bad_request(f"'{param}' may hold at most {max_items} items; got {len(value)}.",
                          param, code="items_too_many")
    return [normalize_item(raw, f"{param}[{i}]") for i, raw in enumerate(value)]


class InputField(StrictField):
    """`input`: a string (one user message) or an array of input items."""

    def to_internal_value(self, data):
        if isinstance(data, str):
            return [normalize_item({"role": "user", "content": data}, "input")]
        return normalize_items(data, "input")


# --- other structured fields -----------------------------------------------------------------


class ReasoningField(StrictField):
    """`reasoning`: {effort, summary}; effort one of REASONING_EFFORTS."""

    def to_internal_value(self, data):
        if data is None:
            return None
        data = _object(data, "reasoning")
        effort = data.get("effort")
        if effort is not None and effort not in REASONING_EFFORTS:
            raise bad_request(f"'reasoning.effort' must be one of {', '.join(REASONING_EFFORTS)}; "
                              f"got {effort!r}.", "reasoning.effort")
        summary = data.get("summary", data.get("generate_summary"))
        if summary not in (None, "auto", "concise", "detailed"):
            raise bad_request("'reasoning.summary' must be auto, concise or detailed.",
                              "reasoning.summary")
        return {"effort": effort, "summary": summary}


class TextConfigField(StrictField):
    """`text`: {format, verbosity}. format: text, json_object, or json_schema {name, schema,
    strict, description} (OpenAI's structured outputs; checked by serving.structured and
    compiled by the view before anything runs)."""

    def to_internal_value(self, data):
        if data is None:
            return {"format": {"type": "text"}}
        data = _object(data, "text")
        fmt = data.get("format") or {"type": "text"}
        kind = _object(fmt, "text.format").get("type")
        if kind in ("json_schema", "json_object"):
            check_structured_request({"text": {"format": fmt}}, format_field="text")
        elif kind != "text":
            raise bad_request("'text.format.type' must be text, json_schema or json_object.",
                              "text.format.type")
        verbosity = data.get("verbosity")
        if verbosity not in (None, "low", "medium", "high"):
            raise bad_request("'text.verbosity' must be low, medium or high.", "text.verbosity")
        out = {"format": dict(fmt) if kind != "text" else {"type": "text"}}
        if verbosity is not None:
            out["verbosity"] = verbosity
        return out


class ConversationRefField(StrictField):
    """`conversation`: an id string or {id}."""

    def to_internal_value(self, data):
        if isinstance(data, dict):
            data = data.get("id")
        if not isinstance(data, str) or not data:
            raise bad_request("'conversation' must be a conversation id or {\"id\": ...}.",
                              "conversation")
        return data


class IncludeField(StrictField):
    """`include`: OpenAI's includable values, accepted; only LOGPROBS_INCLUDE adds data here (the others name
    tools and inputs this server does not have)."""

    def to_internal_value(self, data):
        if data is None:
            return []
        if not isinstance(data, list):
            raise bad_request("'include' must be an array of strings.", "include")
        for i, value in enumerate(data):
            if value not in INCLUDABLE:
                raise bad_request(f"'include[{i}]' must be one of {', '.join(INCLUDABLE)}; "
                                  f"got {value!r}.", f"include[{i}]")
        return list(data)


class StreamOptionsSerializer(serializers.Serializer):
    """`stream_options`: include_obfuscation."""

    include_obfuscation = BooleanField(**opt())


class _CreateResponseFields(serializers.Serializer):
    model = StringField(**opt())
    keep_alive = KeepAliveField(**opt())
    input = InputField(required=False, default=list)
    instructions = StringField(**opt())
    max_output_tokens = IntegerField(**opt(low=1))
    max_tool_calls = IntegerField(**opt(low=1))
    top_logprobs = IntegerField(**opt(low=0, high=MAX_TOP_LOGPROBS))
    tools = ToolsField(flat=True, **opt())
    tool_choice = ToolChoiceField(flat=True, **opt())
    parallel_tool_calls = BooleanField(**opt())
    reasoning = ReasoningField(**opt())
    text = TextConfigField(**opt())
    metadata = MetadataField(**opt())
    store = BooleanField(**opt())
    previous_response_id = StringField(**opt())
    conversation = ConversationRefField(**opt())
    stream = BooleanField(**opt())
    stream_options = StreamOptionsSerializer(**opt())
    background = BooleanField(**opt())
    truncation = StringField(**opt(choices=("auto", "disabled")))
    include = IncludeField(**opt())
    safety_identifier = StringField(**opt())
    prompt_cache_key = StringField(**opt())

    def validate(self, attrs):
        """Nulls take OpenAI's defaults (store and parallel_tool_calls true, truncation disabled, tool_choice
        auto); previous_response_id excludes conversation; background needs store; stream_options needs
        stream; tool_choice required or a named function needs that tool (tool_fields.check_tool_choice), and each forced tool's schema compiles
        (tool_grammar.check_forced_tools)."""
        attrs["store"] = True if attrs["store"] is None else attrs["store"]
        attrs["stream"] = bool(attrs["stream"])
        attrs["background"] = bool(attrs["background"])
        attrs["parallel_tool_calls"] = (True if attrs["parallel_tool_calls"] is None
                                        else attrs["parallel_tool_calls"])
        attrs["truncation"] = attrs["truncation"] or "disabled"
        attrs["text"] = attrs["text"] or {"format": {"type": "text"}}
        attrs["model"] = attrs["model"] or ""
        attrs["tools"] = attrs["tools"] or []
        attrs["tool_choice"] = attrs["tool_choice"] or "auto"
        attrs["metadata"] = attrs["metadata"] or {}
        attrs["include"] = attrs["include"] or []
        if attrs["previous_response_id"] is not None and attrs["conversation"] is not None:
            raise bad_request("'previous_response_id' cannot be used together with "
                              "'conversation'.", "conversation")
        if attrs["background"] and not attrs["store"]:
            raise bad_request("Background responses must be stored: 'background' needs "
                              "'store' true.", "background")
        if attrs["stream_options"] is not None and not attrs["stream"]:
            raise bad_request("'stream_options' is only allowed when 'stream' is true.",
                              "stream_options")
        check_tool_choice(attrs["tools"], attrs["tool_choice"])
        check_forced_tools(attrs["tools"], attrs["tool_choice"], self.initial_data.get("tools"))
        return attrs


def _shared_field_attrs() -> dict:
    """Copies of the chat request's SHARED_FIELDS and their validate_<name> hooks."""
    declared = ChatCompletionRequest._declared_fields
    attrs = {}
    for name in SHARED_FIELDS:
        attrs[name] = copy.deepcopy(declared[name])
        hook = getattr(ChatCompletionRequest, f"validate_{name}", None)
        if hook is not None:
            attrs[f"validate_{name}"] = hook
    return attrs


CreateResponseRequest = serializers.SerializerMetaclass(
    "CreateResponseRequest", (_CreateResponseFields,),
    {"__module__": __name__, "__doc__": "POST /v1/responses. Unknown fields are ignored.",
     **_shared_field_attrs()})


def parse_create(raw_body: bytes) -> dict:
    """The validated body of POST /v1/responses. Raises ApiError 400 on bad input."""
    return validate(CreateResponseRequest, parse_json_body(raw_body))


# --- conversations and lists ---------------------------------------------------------------


class ItemsField(StrictField):
    """`items` of a conversation call: an array of input items (see normalize_item), at most
    MAX_ITEMS_PER_CALL, and not empty unless `allow_empty`."""

    def __init__(self, *, allow_empty: bool = True, **kw):
        super().__init__(**kw)
        self.allow_empty = allow_empty

    def to_internal_value(self, data):
        if not data and not self.allow_empty and isinstance(data, list):
            raise bad_request("'items' must not be empty.", "items")
        return normalize_items(data, "items", max_items=MAX_ITEMS_PER_CALL)


class ConversationCreateRequest(serializers.Serializer):
    """POST /v1/conversations: up to 20 items and metadata, both optional."""

    items = ItemsField(**opt())
    metadata = MetadataField(**opt())


class ConversationUpdateRequest(serializers.Serializer):
    """POST /v1/conversations/{id}: the new metadata (required; null clears it)."""

    metadata = MetadataField(required=True, allow_null=True)


class ConversationItemsRequest(serializers.Serializer):
    """POST /v1/conversations/{id}/items: 1 to 20 items."""

    items = ItemsField(allow_empty=False)


def parse_conversation_create(raw_body: bytes) -> tuple[list[dict], dict]:
    """(items, metadata) of POST /v1/conversations; an empty body is an empty conversation."""
    req = validate(ConversationCreateRequest, parse_json_body(raw_body) if raw_body.strip() else {})
    return req["items"] or [], req["metadata"] or {}


def parse_conversation_update(raw_body: bytes) -> dict:
    """The new metadata of POST /v1/conversations/{id} (`metadata` is required, may be null)."""
    return validate(ConversationUpdateRequest, parse_json_body(raw_body))["metadata"] or {}


def parse_items_create(raw_body: bytes) -> list[dict]:
    """The items of POST /v1/conversations/{id}/items: 1 to 20 input items."""
    return validate(ConversationItemsRequest, parse_json_body(raw_body))["items"]


def parse_list_query(query) -> tuple[int, str, str | None]:
    """(limit, order, after) of a cursor-paginated list: limit 1-100 (default 20), order asc or
    desc (default desc), after an item id. Raises ApiError 400."""
    raw_limit = query.get("limit")
    try:
        limit = 20 if raw_limit in (None, "") else int(raw_limit)
    except ValueError:
        raise bad_request("'limit' must be an integer from 1 to 100.", "limit") from None
    if not 1 <= limit <= 100:
        raise bad_request("'limit' must be an integer from 1 to 100.", "limit")
    order = query.get("order") or "desc"
    if order not in ("asc", "desc"):
        raise bad_request("'order' must be asc or desc.", "order")
    return limit, order, query.get("after") or None


def parse_stream_query(query) -> tuple[bool, int | None]:
    """(stream, starting_after) of GET /v1/responses/{id}. Raises ApiError 400."""
    stream = (query.get("stream") or "false").lower()
    if stream not in ("true", "false"):
        raise bad_request("'stream' must be true or false.", "stream")
    raw = query.get("starting_after")
    if raw in (None, ""):
        return stream == "true", None
    try:
        starting_after = int(raw)
    except ValueError:
        raise bad_request("'starting_after' must be an integer.", "starting_after") from None
    if not -1 <= starting_after <= INT64_MAX:
        raise bad_request(f"'starting_after' must be from -1 to {INT64_MAX}.", "starting_after")
    if stream != "true":
        raise bad_request("'starting_after' is only allowed when 'stream' is true.",
                          "starting_after")
    return True, starting_after


__all__ = ["ConversationCreateRequest", "ConversationItemsRequest", "ConversationUpdateRequest",
           "CreateResponseRequest", "normalize_item", "normalize_items", "parse_conversation_create",
           "parse_conversation_update", "parse_create", "parse_items_create", "parse_list_query",
           "parse_stream_query"]
