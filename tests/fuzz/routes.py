"""Every JSON route and its own validation, read from its serializer: the fields, their kinds and ranges.

The fuzz strategies and the range tests are built from this, so a field added to a serializer is
covered without touching the tests.
"""
from __future__ import annotations

from dataclasses import dataclass

from rest_framework import serializers

from anthropic_api.protocol import CountTokensRequest, MessagesRequest
from inference.serving import fields as strict
from inference.serving.protocol import ChatCompletionRequest, CompletionRequest
from inference.serving.tokenize import DetokenizeRequest, TokenizeRequest
from ollama_api import protocol as ollama
from responses_api.protocol import (ConversationCreateRequest, ConversationItemsRequest, ConversationUpdateRequest,
                                    CreateResponseRequest)

USER = [{"role": "user", "content": "hi"}]


@dataclass(frozen=True)
class Route:
    """A JSON route: its path, its serializer, the smallest body it serves (the required fields), the
    error shape it answers in ("openai", "anthropic" or "ollama") and the method it takes the body with."""

    path: str
    serializer: type[serializers.Serializer]
    base: dict
    generates: bool = False
    shape: str = "openai"
    method: str = "POST"


SERVED = "smollm2-135m-instruct"  # the fixtures' model id (any other name is a 404)
SHORT_OPTIONS = {"num_predict": 4}
# Ollama's routes (ollama_api.protocol). Pulls name models the catalogue has pulled already (METRALE_HOME's), so
# none fetches anything; copies and deletes change only the test's own registry.
OLLAMA_ROUTES = (
    Route("/api/chat", ollama.ChatRequest, {"model": SERVED, "messages": USER, "options": SHORT_OPTIONS},
          generates=True, shape="ollama"),
    Route("/api/generate", ollama.GenerateRequest, {"model": SERVED, "prompt": "hi", "options": SHORT_OPTIONS},
          generates=True, shape="ollama"),
    Route("/api/embed", ollama.EmbedRequest, {"model": "all-minilm-l6-v2", "input": "hi"}, shape="ollama"),
    Route("/api/embeddings", ollama.EmbeddingsRequest, {"model": "all-minilm-l6-v2", "prompt": "hi"}, shape="ollama"),
    Route("/api/show", ollama.ModelRequest, {"model": SERVED}, shape="ollama"),
    Route("/api/pull", ollama.PullRequest, {"model": SERVED}, shape="ollama"),
    Route("/api/copy", ollama.CopyRequest, {"source": SERVED, "destination": "fuzzed"}, shape="ollama"),
    Route("/api/delete", ollama.ModelRequest, {"model": "fuzzed"}, shape="ollama", method="DELETE"),
)
ROUTES = (
    Route("/v1/chat/completions", ChatCompletionRequest, {"messages": USER, "max_tokens": 4}, generates=True),
    Route("/v1/completions", CompletionRequest, {"prompt": "hi", "max_tokens": 4}, generates=True),
    Route("/v1/responses", CreateResponseRequest, {"input": "hi", "max_output_tokens": 4}, generates=True),
    Route("/tokenize", TokenizeRequest, {"prompt": "hi"}),
    Route("/detokenize", DetokenizeRequest, {"tokens": [1, 2]}),
    Route("/v1/conversations", ConversationCreateRequest, {}),
    Route("/v1/conversations/conv_fuzz", ConversationUpdateRequest, {"metadata": {}}),
    Route("/v1/conversations/conv_fuzz/items", ConversationItemsRequest, {"items": USER}),
    Route("/v1/messages", MessagesRequest, {"model": SERVED, "max_tokens": 4, "messages": USER}, generates=True,
          shape="anthropic"),
    Route("/v1/messages/count_tokens", CountTokensRequest, {"model": SERVED, "messages": USER}, shape="anthropic"),
    *OLLAMA_ROUTES,
)


def declared_fields(serializer_cls, prefix: str = "") -> dict[str, serializers.Field]:
    """{dotted name: field} of a serializer, nested serializers flattened (stream_options.include_usage)."""
    out = {}
    for name, field in serializer_cls().fields.items():
        path = f"{prefix}{name}"
        if isinstance(field, serializers.Serializer):
            out.update(declared_fields(type(field), f"{path}."))
        else:
            out[path] = field
    return out


def numeric_fields(serializer_cls) -> dict[str, dict]:
    """{dotted name: limits} of a serializer's numeric fields (NumberField.limits: integer, low, high, low_open)."""
    return {name: dict(field.limits) for name, field in declared_fields(serializer_cls).items()
            if isinstance(field, strict.NumberField)}


def nested(name: str, value) -> dict:
    """{"a": {"b": value}} for "a.b"."""
    head, _, rest = name.partition(".")
    return {head: nested(rest, value) if rest else value}


def context_for(name: str, route: Route) -> dict:
    """Fields a value of `name` needs beside it to be judged on its own (top_logprobs needs logprobs,
    stream_options needs stream)."""
    if name.startswith("stream_options."):
        return {"stream": True}
    if name == "top_logprobs" and route.serializer is ChatCompletionRequest:
        return {"logprobs": True}
    if name.startswith("repetition_detection.") and name != "repetition_detection.max_pattern_size":
        return {"repetition_detection": {"max_pattern_size": 512}}
    return {}


def merged(*bodies: dict) -> dict:
    """The bodies merged left to right, nested objects key by key."""
    out: dict = {}
    for body in bodies:
        for key, value in body.items():
            out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def body_for(route: Route, name: str, value) -> dict:
    """The route's base body with `value` at the dotted `name` and the context it needs."""
    return merged(route.base, context_for(name, route), nested(name, value))
