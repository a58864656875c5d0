"""Request validation (DRF serializers) for chat and completions -> ApiError 400 naming the field.

Source: OpenAI API reference, "Create chat completion" and "Create completion"
(field names, types and ranges); vLLM's extra sampling fields (top_k, min_p,
repetition_penalty, min_tokens, stop_token_ids, ...) and llama.cpp's DRY and
top_n_sigma where OpenAI is silent. Unknown fields are ignored (and logged at
debug), as OpenAI does.
"""
from __future__ import annotations

import logging
import threading

from rest_framework import serializers

from .errors import ApiError, bad_request
from .fields import (BooleanField, IntegerField, KeepAliveField, LogitBiasField, MetadataField, NumberField,
                     ObjectField, StopField, StrictField, StringField, StringListField, TokenIdListField)
from .json_body import parse_json_body
from .messages import normalize_messages
from .beam_search import MAX_BEAMS, beam_spec
from .prediction import prediction_text
from .structured import check_request as check_structured_request
from .thinking import REASONING_EFFORTS, ThinkingField
from .tool_fields import ToolChoiceField, ToolsField, check_tool_choice
from .tool_grammar import check_forced_tools

log = logging.getLogger("metrale.api")

MAX_N = 128
MAX_TOP_LOGPROBS = 20
# Past these the control does nothing more (top-n-sigma keeps every token; a DRY penalty already bans),
# and a bound keeps the values the sampler multiplies finite. llama.cpp sets none; its defaults are
# top_n_sigma -1, dry_multiplier 0, dry_base 1.75.
MAX_TOP_N_SIGMA = 100.0
MAX_DRY = 100.0
# A request's own deadline (the server's METRALE["REQUEST_TIMEOUT_S"] caps it anyway).
MAX_TIMEOUT_S = 1e9
SERVICE_TIERS = ("auto", "default", "flex", "scale", "priority")


def opt(**kw) -> dict:
    """Keyword arguments of an optional, nullable field (null means "not set")."""
    return {"required": False, "allow_null": True, "default": None, **kw}


class MessagesField(StrictField):
    """`messages`: see messages.normalize_messages."""

    def to_internal_value(self, data):
        return normalize_messages(data)


class AnyField(StrictField):
    """Any JSON value, passed through (validated by the code that uses it)."""

    def to_internal_value(self, data):
        return data


class StreamOptions(serializers.Serializer):
    """`stream_options`: include_usage (OpenAI) and continuous_usage_stats (vLLM)."""

    include_usage = BooleanField(required=False, default=False)
    continuous_usage_stats = BooleanField(required=False, default=False)


class RepetitionDetectionField(serializers.Serializer):
    """`repetition_detection` (vLLM's RepetitionDetectionParams): stop once the output ends in a pattern of
    min..max_pattern_size tokens repeated min_count times (engine/repetition.py). Bounds keep the check cheap."""

    max_pattern_size = IntegerField(low=1, high=512)
    min_pattern_size = IntegerField(required=False, default=0, low=0, high=512)
    min_count = IntegerField(required=False, default=2, low=2, high=1024)

    def validate(self, attrs):
        if attrs["min_pattern_size"] > attrs["max_pattern_size"]:
            raise serializers.ValidationError({"min_pattern_size": "must not exceed max_pattern_size."})
        return attrs


class SamplingExtensions(serializers.Serializer):
    """The sampling controls beyond temperature / top_p / top_k (vLLM's and llama.cpp's), which every
    generating surface accepts (chat, completions, Anthropic's Messages)."""

    min_p = NumberField(**opt(low=0, high=1))
    top_n_sigma = NumberField(**opt(low=-1, high=MAX_TOP_N_SIGMA))
    repetition_penalty = NumberField(**opt(low=0, high=2, low_open=True))
    presence_penalty = NumberField(**opt(low=-2, high=2))
    frequency_penalty = NumberField(**opt(low=-2, high=2))
    dry_multiplier = NumberField(**opt(low=0, high=MAX_DRY))
    dry_base = NumberField(**opt(low=1, high=MAX_DRY))
    dry_allowed_length = IntegerField(**opt(low=0))
    dry_penalty_last_n = IntegerField(**opt(low=-1))
    dry_sequence_breakers = StringListField(**opt())
    logit_bias = LogitBiasField(**opt())
    min_tokens = IntegerField(**opt(low=0))
    seed = IntegerField(**opt())
    ignore_eos = BooleanField(required=False, default=False)
    stop_token_ids = TokenIdListField(**opt())
    repetition_detection = RepetitionDetectionField(**opt())


class GenerationRequest(SamplingExtensions):
    """The fields chat and completions share: sampling, length, stops and output controls."""

    model = StringField(required=False, default="")
    keep_alive = KeepAliveField(**opt())
    stream = BooleanField(required=False, default=False)
    stream_options = StreamOptions(**opt())
    n = IntegerField(**opt(low=1, high=MAX_N))
    max_tokens = IntegerField(**opt(low=1))
    temperature = NumberField(**opt(low=0, high=2))
    top_p = NumberField(**opt(low=0, high=1, low_open=True))
    top_k = IntegerField(**opt(low=-1))
    stop = StopField(required=False, allow_null=True, default=list)
    include_stop_str_in_output = BooleanField(required=False, default=False)
    return_token_ids = BooleanField(required=False, default=False)
    timeout = NumberField(**opt(low=0, high=MAX_TIMEOUT_S, low_open=True))
    user = StringField(**opt())
    metadata = MetadataField(**opt())
    service_tier = StringField(**opt(choices=SERVICE_TIERS))
    response_format = ObjectField(**opt())
    structured_outputs = ObjectField(**opt())
    # Beam search (serving/beam_search.py): vLLM's use_beam_search, length_penalty, early_stopping, and the width.
    use_beam_search = BooleanField(required=False, default=False)
    num_beams = IntegerField(**opt(low=1, high=MAX_BEAMS))
    length_penalty = NumberField(**opt(low=-10, high=10))
    early_stopping = BooleanField(required=False, default=False)

    def validate(self, attrs):
        """Cross-field rules: stream_options needs stream (vLLM answers 400 too); min_tokens <= max_tokens;
        response_format / structured_outputs well formed and at most one of them (structured.check_request).
        Subclasses then set attrs["beam"] (beam_search.beam_spec: its own 400s)."""
        if attrs.get("stop") is None:
            attrs["stop"] = []
        if attrs.get("stream_options") is not None and not attrs["stream"]:
            raise bad_request("'stream_options' is only allowed when 'stream' is true.", "stream_options")
        max_tokens = self.max_tokens_of(attrs)
        if attrs.get("min_tokens") and max_tokens is not None and attrs["min_tokens"] > max_tokens:
            raise bad_request(f"'min_tokens' ({attrs['min_tokens']}) must not exceed the maximum number of "
                              f"tokens to generate ({max_tokens}).", "min_tokens")
        check_structured_request(attrs)
        return attrs

    @staticmethod
    def max_tokens_of(attrs) -> int | None:
        """The requested completion budget in tokens, or None (see sampling.resolve_max_tokens)."""
        return attrs.get("max_tokens")


def _refuse_if_set(attrs: dict, name: str, why: str) -> None:
    if attrs.get(name) is not None:
        raise bad_request(f"'{name}' is not supported by this server: {why}", name, code="unsupported_parameter")


class ChatCompletionRequest(GenerationRequest):
    """POST /v1/chat/completions."""

    messages = MessagesField()
    max_completion_tokens = IntegerField(**opt(low=1))
    logprobs = BooleanField(**opt())
    top_logprobs = IntegerField(**opt(low=0, high=MAX_TOP_LOGPROBS))
    echo = BooleanField(required=False, default=False)
    add_generation_prompt = BooleanField(required=False, default=True)
    continue_final_message = BooleanField(required=False, default=False)
    chat_template_kwargs = ObjectField(**opt())
    tools = ToolsField(**opt())
    tool_choice = ToolChoiceField(**opt())
    parallel_tool_calls = BooleanField(**opt())
    # Thinking controls (thinking.py has the priority order).
    thinking = ThinkingField(**opt())
    thinking_token_budget = IntegerField(**opt(low=0))
    max_thinking_tokens = IntegerField(**opt(low=0))
    thinking_budget = IntegerField(**opt(low=0))
    reasoning_effort = StringField(**opt(choices=REASONING_EFFORTS))
    store = BooleanField(required=False, default=False)
    modalities = StringListField(**opt(max_items=4))
    prediction = AnyField(**opt())
    audio = AnyField(**opt())
    web_search_options = AnyField(**opt())
    # OpenAI's deprecated forms of tools and tool_choice: refused by name (served, they would need a
    # message.function_call and finish_reason "function_call" of their own; ignored, a forced call went unmade).
    functions = AnyField(**opt())
    function_call = AnyField(**opt())

    @staticmethod
    def max_tokens_of(attrs) -> int | None:
        """max_completion_tokens (OpenAI's current name) wins over max_tokens (deprecated for chat)."""
        return attrs.get("max_completion_tokens") or attrs.get("max_tokens")

    def validate(self, attrs):
        """top_logprobs needs logprobs (OpenAI); continue_final_message excludes an explicit
        add_generation_prompt (vLLM); tool_choice required or a named function needs that tool
        (tool_fields.check_tool_choice) and, when a call is forced, each tool's schema compiles
        (tool_grammar.check_forced_tools); `prediction` becomes its text (prediction.prediction_text);
        fields this server cannot honour (audio, web_search_options, the deprecated functions and
        function_call) are refused by name."""
        attrs = super().validate(attrs)
        if attrs.get("top_logprobs") is not None and not attrs.get("logprobs"):
            raise bad_request("'top_logprobs' requires 'logprobs' to be true.", "top_logprobs")
        if attrs["continue_final_message"] and self.initial_data.get("add_generation_prompt") is True:
            raise bad_request("'continue_final_message' and 'add_generation_prompt' cannot both be true: the "
                              "first continues the last message, the second starts a new one.",
                              "continue_final_message")
        _refuse_if_set(attrs, "functions", "it is deprecated; send each function in 'tools' as "
                       "{\"type\": \"function\", \"function\": {...}}.")
        _refuse_if_set(attrs, "function_call", "it is deprecated; send 'tool_choice' (\"none\", \"auto\", "
                       "\"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}).")
        check_tool_choice(attrs.get("tools"), attrs.get("tool_choice"))
        check_forced_tools(attrs.get("tools"), attrs.get("tool_choice"))
        attrs["prediction"] = prediction_text(attrs.get("prediction"), attrs)
        attrs["beam"] = beam_spec(attrs)
        _refuse_if_set(attrs, "audio", "this model has no audio output.")
        _refuse_if_set(attrs, "web_search_options", "this server has no web search.")
        if attrs.get("modalities") and set(attrs["modalities"]) != {"text"}:
            raise bad_request("'modalities' other than 'text' are not supported: this model outputs text only.",
                              "modalities", code="unsupported_parameter")
        return attrs


class PromptField(StrictField):
    """`prompt`: a string, an array of strings, an array of token ids, or an array of such arrays.

    Returns a list of prompts, each a str or a list[int].
    """

    def to_internal_value(self, data):
        if isinstance(data, str):
            return [data]
        if not isinstance(data, list) or not data:
            raise serializers.ValidationError("must be a string, an array of strings, or an array of token ids "
                                              "(or of arrays of token ids), and not empty.")
        if all(isinstance(x, str) for x in data):
            return data
        if all(isinstance(x, int) and not isinstance(x, bool) for x in data):
            return [TokenIdListField().to_internal_value(data)]
        if all(isinstance(x, list) for x in data):
            return [TokenIdListField(allow_empty=False).to_internal_value(x) for x in data]
        raise serializers.ValidationError("must not mix strings, token ids and arrays.")


class CompletionRequest(GenerationRequest):
    """POST /v1/completions (OpenAI's legacy completions)."""

    prompt = PromptField()
    suffix = StringField(**opt())
    echo = BooleanField(required=False, default=False)
    logprobs = IntegerField(**opt(low=0, high=MAX_TOP_LOGPROBS))
    best_of = IntegerField(**opt(low=1, high=MAX_N))

    def validate(self, attrs):
        """best_of must be >= n (OpenAI) and, here, equal to it; echo excludes suffix (OpenAI)."""
        attrs = super().validate(attrs)
        n, best_of = attrs.get("n") or 1, attrs.get("best_of")
        if best_of is not None and best_of < n:
            raise bad_request(f"'best_of' ({best_of}) must be at least 'n' ({n}).", "best_of")
        if best_of is not None and best_of > n:
            raise bad_request("'best_of' greater than 'n' is not supported by this server.", "best_of",
                              code="unsupported_parameter")
        if best_of is not None and attrs["stream"] and best_of > 1:
            raise bad_request("'best_of' cannot be used with 'stream'.", "best_of")
        if attrs.get("suffix") and attrs["echo"]:
            raise bad_request("'echo' cannot be used with 'suffix'.", "echo")
        attrs["beam"] = beam_spec(attrs)
        if attrs["beam"] is not None and len(attrs["prompt"]) > 1:
            raise bad_request("'use_beam_search' takes one prompt.", "prompt")
        if attrs["beam"] is not None and attrs["echo"]:
            raise bad_request("'echo' cannot be used with 'use_beam_search'.", "echo")
        return attrs


# Each thread's serializer of each class, its fields built once (see _serializer_over).
_shells = threading.local()


def _serializer_over(serializer_cls, body: dict):
    """A `serializer_cls` instance with `body` as its data, ready for is_valid().

    DRF builds a serializer's fields anew for every instance (Serializer.get_fields deep-copies every
    declared field, nested serializers and their fields included): 60-80% of validating a chat completion
    request. Validation holds no state on the fields themselves (only the root's initial_data, and
    _validated_data, _errors and _data once is_valid() ran), and it runs start to end on one thread
    without yielding, so each thread keeps one instance per class, its fields bound once, and hands it
    the next body with those four attributes reset. A call that finds its class's instance in use (a
    validation inside a validation) gets a new one."""
    shells = _shells.__dict__.setdefault("by_class", {})
    shell = shells.pop(serializer_cls, None)
    if shell is None:
        shell = serializer_cls(data=body)
        shell.fields  # noqa: B018 - built and bound here, once per class and thread
    else:
        for name in ("_validated_data", "_errors", "_data"):
            shell.__dict__.pop(name, None)
        shell.initial_data = body
    return shell


def validate(serializer_cls, body: dict) -> dict:
    """Run a serializer over a JSON object. Returns the validated fields (a new dict each call).

    Raises ApiError 400 for the first bad field, its `param` naming the field (dotted for
    nested objects, e.g. stream_options.include_usage). Unknown fields are logged at debug.
    """
    s = _serializer_over(serializer_cls, body)
    try:
        valid = s.is_valid()
    finally:
        _shells.by_class[serializer_cls] = s  # free for the thread's next call
    if not valid:
        param, msg = _first_error(s.errors)
        if param == "non_field_errors":
            raise bad_request(msg)
        raise bad_request(f"Invalid value for '{param}': {msg}", param=param)
    unknown = set(body) - set(s.fields)
    if unknown:
        log.debug("ignoring unknown fields: %s", ", ".join(sorted(unknown)))
    return s.validated_data


def _first_error(errors, prefix: str = "") -> tuple[str, str]:
    """(dotted field path, message) of the first error in DRF's nested error structure."""
    if isinstance(errors, dict):
        key, val = next(iter(errors.items()))
        path = prefix if key == "non_field_errors" and prefix else (f"{prefix}.{key}" if prefix else key)
        return _first_error(val, path)
    if isinstance(errors, list) and errors:
        return _first_error(errors[0], prefix)
    return prefix, str(errors)


__all__ = ["ApiError", "ChatCompletionRequest", "CompletionRequest", "MessagesField", "opt", "parse_json_body",
           "validate"]
