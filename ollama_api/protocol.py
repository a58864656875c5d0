"""Request validation (DRF serializers) for Ollama's /api routes -> ApiError 400 naming the field.

Source: Ollama's docs/api.md and api/types.go (ChatRequest, GenerateRequest, EmbedRequest, EmbeddingRequest,
ShowRequest, PullRequest, DeleteRequest, CopyRequest, Options), and what the official `ollama` Python client
sends (its _types.py): `stream` defaults to true on chat, generate and pull; `model` is required (`model is
required`); a `name` is still read where `model` is missing (the older field); roles are lowercased; unknown
fields and unknown `options` keys are ignored (options Ollama removed in 2025, e.g. mirostat, tfs_z, numa, are
unknown keys there too). Values of the wrong type are a 400 here (Ollama answers some with a 500). The
strict fields are inference.serving.fields', so the fuzz suite reads these serializers as it reads the others.
"""
from __future__ import annotations

import json

from rest_framework import serializers

from inference.serving.errors import bad_request
from inference.serving.fields import (BooleanField, IntegerField, KeepAliveField, NumberField, StrictField,
                                      StringField, StringListField, TokenIdListField)
from inference.serving.json_body import parse_json_body
from inference.serving.protocol import opt, validate
from inference.serving.schema_size import check_schema_size

from .messages import MessagesField, ToolsField

THINK_LEVELS = ("low", "medium", "high", "max")
MAX_TOP_LOGPROBS = 20
MAX_STOP = 16
MAX_INPUTS = 2048


class Options(serializers.Serializer):
    """`options` (api.Options and api.Runner, as they are today). The sampling ones are mapped
    (mapping.sampling_of); num_ctx is the request's context length; the runner's load-time ones (num_batch,
    num_gpu, main_gpu, use_mmap, num_thread) and num_keep, typical_p, repeat_last_n, draft_num_predict are
    checked and have no effect here (mapping.py says why)."""

    num_predict = IntegerField(**opt())
    num_ctx = IntegerField(**opt())
    num_keep = IntegerField(**opt())
    seed = IntegerField(**opt())
    temperature = NumberField(**opt(low=0, high=2))
    top_k = IntegerField(**opt(low=-1))
    top_p = NumberField(**opt(low=0, high=1, low_open=True))
    min_p = NumberField(**opt(low=0, high=1))
    typical_p = NumberField(**opt(low=0, high=1))
    repeat_penalty = NumberField(**opt(low=0, high=2, low_open=True))
    repeat_last_n = IntegerField(**opt(low=-1))
    presence_penalty = NumberField(**opt(low=-2, high=2))
    frequency_penalty = NumberField(**opt(low=-2, high=2))
    stop = StringListField(**opt(max_items=MAX_STOP))
    num_batch = IntegerField(**opt())
    num_gpu = IntegerField(**opt())
    main_gpu = IntegerField(**opt())
    use_mmap = BooleanField(**opt())
    num_thread = IntegerField(**opt())
    draft_num_predict = IntegerField(**opt())


class ThinkField(StrictField):
    """`think`: true, false, or a level ("low", "medium", "high"; "max" as Ollama's harmony models read it)."""

    def to_internal_value(self, data):
        if isinstance(data, bool) or data in THINK_LEVELS:
            return data
        raise serializers.ValidationError(f"invalid think value: {json.dumps(data)[:40]} (must be \"high\", "
                                          "\"medium\", \"low\", true, or false)")


class FormatField(StrictField):
    """`format`: "json" (JSON mode) or a JSON schema (an object); "" and null mean none. Returns "json", the
    schema, or None."""

    def to_internal_value(self, data):
        if data == "":
            return None
        if data == "json":
            return data
        if isinstance(data, dict):
            check_schema_size(data, "format")
            return data
        raise serializers.ValidationError(f"invalid format: {json.dumps(data)[:40]}; expected \"json\" or a valid "
                                          "JSON Schema object")


class ImagesField(StrictField):
    """`images`: base64 strings (none of this server's models has vision: a non-empty list is refused where it
    is used, naming the model)."""

    def to_internal_value(self, data):
        if not isinstance(data, list) or not all(isinstance(x, str) for x in data):
            raise serializers.ValidationError("must be an array of base64 strings.")
        return data


class Generating(serializers.Serializer):
    """The fields /api/chat and /api/generate share."""

    model = StringField(required=False, default="")
    format = FormatField(**opt())
    options = Options(**opt())
    stream = BooleanField(required=False, default=True)
    keep_alive = KeepAliveField(**opt())
    think = ThinkField(**opt())
    truncate = BooleanField(required=False, default=True)
    shift = BooleanField(required=False, default=True)
    logprobs = BooleanField(required=False, default=False)
    top_logprobs = IntegerField(**opt(low=0, high=MAX_TOP_LOGPROBS))

    def validate(self, attrs):
        attrs["model"] = required_model(attrs, self.initial_data)
        attrs["options"] = attrs.get("options") or {}
        return attrs


def required_model(attrs: dict, body: dict) -> str:
    """`model`, else the older `name`. Raises ApiError 400 `model is required` (Ollama's words)."""
    model = attrs.get("model") or body.get("name")
    if not isinstance(model, str) or not model:
        raise bad_request("model is required", "model")
    return model


class ChatRequest(Generating):
    """POST /api/chat."""

    messages = MessagesField(required=False, default=list)
    tools = ToolsField(**opt())


class GenerateRequest(Generating):
    """POST /api/generate."""

    prompt = StringField(required=False, allow_null=True, default="")
    suffix = StringField(**opt())
    system = StringField(**opt())
    template = StringField(**opt())
    context = TokenIdListField(**opt())
    raw = BooleanField(required=False, default=False)
    images = ImagesField(**opt())

    def validate(self, attrs):
        """raw excludes template, system and context (Ollama's 400 and words)."""
        attrs = super().validate(attrs)
        attrs["prompt"] = attrs.get("prompt") or ""
        if attrs["raw"] and (attrs.get("template") or attrs.get("system") or attrs.get("context")):
            raise bad_request("raw mode does not support template, system, or context", "raw")
        return attrs


class EmbedInputField(StrictField):
    """/api/embed's `input`: a string or an array of strings (Ollama: `invalid input type` for anything else).
    An empty string is no input (the request loads the model). Returns the list of texts."""

    def to_internal_value(self, data):
        if isinstance(data, str):
            return [data] if data else []
        if not isinstance(data, list) or not all(isinstance(x, str) for x in data):
            raise serializers.ValidationError("invalid input type: a string or an array of strings.")
        if len(data) > MAX_INPUTS:
            raise serializers.ValidationError(f"accepts at most {MAX_INPUTS} inputs; got {len(data)}.")
        return data


class EmbedRequest(serializers.Serializer):
    """POST /api/embed."""

    model = StringField(required=False, default="")
    input = EmbedInputField(required=False, default=list)
    truncate = BooleanField(required=False, default=True)
    dimensions = IntegerField(**opt(low=1))
    keep_alive = KeepAliveField(**opt())
    options = Options(**opt())

    def validate(self, attrs):
        attrs["model"] = required_model(attrs, self.initial_data)
        return attrs


class EmbeddingsRequest(serializers.Serializer):
    """POST /api/embeddings (the older route: one prompt, one vector)."""

    model = StringField(required=False, default="")
    prompt = StringField(required=False, allow_null=True, default="")
    keep_alive = KeepAliveField(**opt())
    options = Options(**opt())

    def validate(self, attrs):
        attrs["model"] = required_model(attrs, self.initial_data)
        attrs["prompt"] = attrs.get("prompt") or ""
        return attrs


class ModelRequest(serializers.Serializer):
    """POST /api/show and DELETE /api/delete: {model} (or the older {name})."""

    model = StringField(required=False, default="")
    verbose = BooleanField(required=False, default=False)

    def validate(self, attrs):
        attrs["model"] = required_model(attrs, self.initial_data)
        return attrs


class PullRequest(ModelRequest):
    """POST /api/pull: {model, insecure?, stream?} (username and password, deprecated, are ignored)."""

    insecure = BooleanField(required=False, default=False)
    stream = BooleanField(required=False, default=True)


class CopyRequest(serializers.Serializer):
    """POST /api/copy: {source, destination}."""

    source = StringField()
    destination = StringField()


def parser(serializer_cls):
    """A body parser for `serializer_cls`: raw bytes -> the validated fields. Raises ApiError 400 (`missing request
    body`, invalid JSON, a bad field, named)."""

    def parse(raw_body: bytes) -> dict:
        if not raw_body.strip():
            raise bad_request("missing request body", code="invalid_json")
        return validate(serializer_cls, parse_json_body(raw_body))
    parse.__doc__ = f"The validated fields of a {serializer_cls.__name__} body. Raises ApiError 400."
    return parse


parse_chat = parser(ChatRequest)
parse_generate = parser(GenerateRequest)
parse_embed = parser(EmbedRequest)
parse_embeddings = parser(EmbeddingsRequest)
parse_model = parser(ModelRequest)
parse_pull = parser(PullRequest)
parse_copy = parser(CopyRequest)
