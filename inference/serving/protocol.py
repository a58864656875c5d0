"""Request validation for the chat API (DRF serializers) -> ApiError 400 with `param` naming the field.

Source: OpenAI API reference, "Create chat completion" (field names and ranges);
vLLM's extra sampling fields (top_k, min_p, ...) where OpenAI is silent.
"""
from __future__ import annotations

import json

from rest_framework import serializers

from .errors import ApiError, bad_request

ROLES = ("system", "developer", "user", "assistant", "tool")


def parse_json_body(raw: bytes) -> dict:
    """The request body as a JSON object. Raises ApiError 400 for invalid JSON or a non-object."""
    try:
        body = json.loads(raw or b"")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_request(f"We could not parse the JSON body of your request: {exc}", code="invalid_json") from exc
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.", code="invalid_json")
    return body


def _text_of(content, param: str) -> str:
    """A message's content as text: a string, or an array of text parts (other part types are refused)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise bad_request(f"{param}[{i}] must be a content part object with a 'type'.", f"{param}[{i}]")
            if part["type"] in ("text", "input_text", "output_text"):
                if not isinstance(part.get("text"), str):
                    raise bad_request(f"{param}[{i}].text must be a string.", f"{param}[{i}].text")
                texts.append(part["text"])
            else:
                raise bad_request(
                    f"Content part type {part['type']!r} is not supported: this model accepts text only.",
                    f"{param}[{i}].type", code="unsupported_content_type")
        return "".join(texts)
    raise bad_request(f"{param} must be a string or an array of content parts.", param)


class MessagesField(serializers.Field):
    """`messages`: a non-empty list of {role, content, ...}; normalised for the chat template."""

    def to_internal_value(self, data):
        if not isinstance(data, list):
            raise ApiError(400, "'messages' must be an array of message objects.", param="messages")
        if not data:
            raise ApiError(400, "'messages' must contain at least one message.", param="messages")
        out = []
        for i, m in enumerate(data):
            p = f"messages[{i}]"
            if not isinstance(m, dict):
                raise bad_request(f"{p} must be an object.", p)
            role = m.get("role")
            if role not in ROLES:
                raise bad_request(f"{p}.role must be one of {', '.join(ROLES)}; got {role!r}.", f"{p}.role")
            msg = {"role": "system" if role == "developer" else role}
            content = m.get("content")
            if content is None:
                if role not in ("assistant",) or not m.get("tool_calls"):
                    if role != "assistant":
                        raise bad_request(f"{p}.content is required for role {role!r}.", f"{p}.content")
                msg["content"] = ""
            else:
                msg["content"] = _text_of(content, f"{p}.content")
            if role == "tool":
                if not isinstance(m.get("tool_call_id"), str):
                    raise bad_request(f"{p}.tool_call_id is required for tool messages.", f"{p}.tool_call_id")
                msg["tool_call_id"] = m["tool_call_id"]
            if role == "assistant" and m.get("tool_calls") is not None:
                if not isinstance(m["tool_calls"], list):
                    raise bad_request(f"{p}.tool_calls must be an array.", f"{p}.tool_calls")
                msg["tool_calls"] = m["tool_calls"]
            if isinstance(m.get("name"), str):
                msg["name"] = m["name"]
            out.append(msg)
        return out

    def to_representation(self, value):
        return value


class StopField(serializers.Field):
    """`stop`: null, a string, or an array of up to 4 strings."""

    def to_internal_value(self, data):
        if data is None:
            return []
        if isinstance(data, str):
            return [data]
        if isinstance(data, list) and all(isinstance(s, str) for s in data):
            if len(data) > 4:
                raise serializers.ValidationError("'stop' accepts at most 4 sequences.")
            return data
        raise serializers.ValidationError("'stop' must be a string or an array of strings.")

    def to_representation(self, value):
        return value


class StrictBooleanField(serializers.Field):
    """A JSON boolean only (DRF's BooleanField also takes "yes", 1, ...)."""

    def to_internal_value(self, data):
        if not isinstance(data, bool):
            raise serializers.ValidationError("Must be a boolean.")
        return data

    def to_representation(self, value):
        return value


class StreamOptionsSerializer(serializers.Serializer):
    include_usage = StrictBooleanField(required=False, default=False)
    continuous_usage_stats = StrictBooleanField(required=False, default=False)


class ChatCompletionRequest(serializers.Serializer):
    """POST /v1/chat/completions. Unknown fields are ignored, as OpenAI does."""

    model = serializers.CharField(required=False, allow_blank=True, default="")
    messages = MessagesField()
    stream = StrictBooleanField(required=False, default=False)
    stream_options = StreamOptionsSerializer(required=False, allow_null=True, default=None)
    max_tokens = serializers.IntegerField(required=False, allow_null=True, min_value=1, default=None)
    max_completion_tokens = serializers.IntegerField(required=False, allow_null=True, min_value=1, default=None)
    temperature = serializers.FloatField(required=False, allow_null=True, min_value=0.0, max_value=2.0, default=None)
    top_p = serializers.FloatField(required=False, allow_null=True, min_value=0.0, max_value=1.0, default=None)
    top_k = serializers.IntegerField(required=False, allow_null=True, min_value=-1, default=None)
    min_p = serializers.FloatField(required=False, allow_null=True, min_value=0.0, max_value=1.0, default=None)
    seed = serializers.IntegerField(required=False, allow_null=True, default=None)
    stop = StopField(required=False, default=list)
    n = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=1, default=None)
    include_stop_str_in_output = StrictBooleanField(required=False, default=False)
    ignore_eos = StrictBooleanField(required=False, default=False)
    user = serializers.CharField(required=False, allow_null=True, allow_blank=True, default=None)

    def validate_top_p(self, value):
        if value is not None and value <= 0:
            raise serializers.ValidationError("Must be greater than 0.")
        return value

    def validate(self, attrs):
        if attrs.get("stream_options") is not None and not attrs.get("stream"):
            raise ApiError(400, "'stream_options' is only allowed when 'stream' is true.", param="stream_options")
        return attrs


def validate(serializer_cls, body: dict) -> dict:
    """Run a serializer; the first error becomes ApiError 400 whose `param` names the field."""
    s = serializer_cls(data=body)
    try:
        ok = s.is_valid()
    except ApiError:
        raise
    if not ok:
        field, msgs = next(iter(s.errors.items()))
        msg = _first_message(msgs)
        if field == "non_field_errors":
            raise bad_request(msg)
        raise bad_request(f"Invalid value for '{field}': {msg}", param=field)
    return s.validated_data


def _first_message(errors) -> str:
    if isinstance(errors, dict):
        key, val = next(iter(errors.items()))
        return f"{key}: {_first_message(val)}"
    if isinstance(errors, list) and errors:
        return _first_message(errors[0])
    return str(errors)
