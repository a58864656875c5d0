"""Request validation (DRF serializers) for POST /v1/messages and /v1/messages/count_tokens -> ApiError 400.

Source: Anthropic's API reference, "Messages" and "Count Message tokens" (the `anthropic` SDK's
message_create_params.py and the param types it links): `model`, `max_tokens` (0 allowed: it
only fills the prompt cache), `messages` of roles user / assistant (and system, which the SDK
now allows; Claude Code's `ctx` and `msg` roles read as user, as vLLM does), content as a string
or blocks (text, tool_use, tool_result, thinking, redacted_thinking), `system` (a string or text
blocks), `stop_sequences`, `temperature` (0 to 1), `top_p`, `top_k`, `tools` (name, description,
input_schema), `tool_choice` (auto, any, tool + name, none; disable_parallel_tool_use), `thinking`
(enabled + budget_tokens, disabled, adaptive), `metadata.user_id`, `stream`. The sampling
extensions chat accepts (serving.protocol.SamplingExtensions) are accepted too. Fields that do not
change this server's output (cache_control on blocks, service_tier, output_config.effort) are
accepted and ignored; blocks this server cannot represent (image, document, ...) are a 400
naming the block; unknown fields are ignored, as on chat. Deviation: `thinking.budget_tokens`
needs only to be at least 1 (Anthropic asks 1024), so a small local model can think briefly.
"""
from __future__ import annotations

import re

from rest_framework import serializers

from inference.serving.errors import bad_request
from inference.serving.fields import (BooleanField, IntegerField, KeepAliveField, NumberField, StrictField, StringField,
                                      StringListField)
from inference.serving.protocol import SamplingExtensions, opt, parse_json_body, validate
from inference.serving.schema_size import check_schema_size
from inference.serving.tool_grammar import check_forced_tools

from . import signatures
from .mapping import chat_tool_choice

ROLES = ("user", "assistant", "system")
READ_AS_USER = ("ctx", "msg")  # Claude Code's extra roles (vLLM reads them as user too)
# Anthropic tool names: letters, digits, '_' and '-' (MCP tools are often long).
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,128}")
TOOL_CHOICES = ("auto", "any", "tool", "none")
THINKING_DISPLAYS = ("summarized", "omitted")
# The blocks each place may hold (system messages and a tool_result's content: text only).
ROLE_BLOCKS = {"user": ("text", "tool_result"), "assistant": ("text", "tool_use", "thinking", "redacted_thinking"),
               "system": ("text",), "tool_result": ("text",)}
PLACES = {"user": "a user message", "assistant": "an assistant message", "system": "a system message",
          "tool_result": "a tool_result's content"}
KNOWN_BLOCKS = ("text", "tool_use", "tool_result", "thinking", "redacted_thinking")
MEDIA_BLOCKS = ("image", "document", "search_result", "container_upload")
MAX_STOP_SEQUENCES = 64


def _str(block: dict, key: str, p: str, *, empty: bool = True) -> str:
    value = block.get(key)
    if not isinstance(value, str) or (not empty and not value):
        raise bad_request(f"{p}.{key} must be a {'' if empty else 'non-empty '}string.", f"{p}.{key}")
    return value


def _unsupported(kind: str, p: str):
    if kind in MEDIA_BLOCKS:
        return bad_request(f"{p} is an {kind!r} block, but this model accepts text only: it has no {kind} input.",
                           f"{p}.type", code="unsupported_content_type")
    return bad_request(f"{p} is a {kind!r} block, which this server does not support; use text, tool_use, "
                       "tool_result, thinking or redacted_thinking.", f"{p}.type", code="unsupported_content_type")


def _tool_result_content(content, p: str) -> str:
    """A tool_result's content (a string, or text blocks joined) as text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{p} must be a string or an array of text blocks.", p)
    return "".join(validate_block(part, f"{p}[{j}]", "tool_result")["text"] for j, part in enumerate(content))


def validate_block(block, p: str, role: str) -> dict:
    """One content block of a `role` message (or of a tool_result's content, role "tool_result"),
    normalized (only the fields this server reads).

    Raises ApiError 400 naming the block: malformed, of a kind the role cannot send, media this
    model cannot read, or a thinking block whose signature is not this server's (signatures.py)."""
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise bad_request(f"{p} must be a content block object with a 'type'.", p)
    kind = block["type"]
    if kind not in KNOWN_BLOCKS:
        raise _unsupported(kind, p)
    if kind not in ROLE_BLOCKS[role]:
        raise bad_request(f"{p} is a {kind!r} block, which {PLACES[role]} cannot contain.", f"{p}.type")
    if kind == "text":
        return {"type": "text", "text": _str(block, "text", p)}
    if kind == "tool_use":
        name = block.get("name")
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
            raise bad_request(f"{p}.name must be 1 to 128 letters, digits, '_' or '-'; got {name!r}.", f"{p}.name")
        if not isinstance(block.get("input"), dict):
            raise bad_request(f"{p}.input must be an object.", f"{p}.input")
        return {"type": "tool_use", "id": _str(block, "id", p, empty=False), "name": name, "input": block["input"]}
    if kind == "tool_result":
        is_error = block.get("is_error")
        if is_error is not None and not isinstance(is_error, bool):
            raise bad_request(f"{p}.is_error must be a boolean.", f"{p}.is_error")
        return {"type": "tool_result", "tool_use_id": _str(block, "tool_use_id", p, empty=False),
                "content": _tool_result_content(block.get("content"), f"{p}.content"), "is_error": bool(is_error)}
    if kind == "thinking":
        thinking = _str(block, "thinking", p)
        if not signatures.verifies(thinking, block.get("signature")):
            raise bad_request(f"{p} has an invalid signature: a thinking block must be sent back exactly as this "
                              "server returned it.", f"{p}.signature", code="invalid_signature")
        return {"type": "thinking", "thinking": thinking}
    return {"type": "redacted_thinking", "data": _str(block, "data", p)}


def validate_message(m, i: int) -> dict:
    """One message: {"role", "content": [blocks]}, ctx / msg read as user. Raises ApiError 400."""
    p = f"messages[{i}]"
    if not isinstance(m, dict):
        raise bad_request(f"{p} must be an object.", p)
    role = m.get("role")
    role = "user" if role in READ_AS_USER else role
    if role not in ROLES:
        raise bad_request(f"{p}.role must be one of user, assistant, system; got {m.get('role')!r}.", f"{p}.role")
    content = m.get("content")
    if isinstance(content, str):
        return {"role": role, "content": [{"type": "text", "text": content}]}
    if not isinstance(content, list):
        raise bad_request(f"{p}.content must be a string or an array of content blocks.", f"{p}.content")
    return {"role": role, "content": [validate_block(b, f"{p}.content[{j}]", role) for j, b in enumerate(content)]}


def check_tool_results(messages: list[dict]) -> None:
    """Each tool_result block answers a tool_use block of the assistant turn just before its own turn, by id
    (Anthropic's 400: "Each `tool_result` block must have a corresponding `tool_use` block in the previous
    message"). Consecutive messages of one role are one turn, as Anthropic combines them: results may come in
    several user messages, calls in several assistant messages. Raises ApiError 400 naming
    messages[i].content[j].tool_use_id."""
    asked: set[str] = set()  # the tool_use ids of the assistant turn before the current user turn
    calls: set[str] = set()  # those of the assistant turn being read
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            if i == 0 or messages[i - 1]["role"] != "assistant":
                calls = set()
            calls |= {b["id"] for b in m["content"] if b["type"] == "tool_use"}
            continue
        if i == 0 or messages[i - 1]["role"] != m["role"]:  # a new user turn answers the turn just read
            asked = calls if i and messages[i - 1]["role"] == "assistant" else set()
        for j, block in enumerate(m["content"]):
            if block["type"] == "tool_result" and block["tool_use_id"] not in asked:
                raise bad_request(f"messages[{i}].content[{j}]: unexpected `tool_use_id` found in `tool_result` "
                                  f"blocks: {block['tool_use_id'][:64]}. Each `tool_result` block must have a "
                                  "corresponding `tool_use` block in the previous message.",
                                  f"messages[{i}].content[{j}].tool_use_id")


class MessagesField(StrictField):
    """`messages`: a non-empty array of messages (validate_message), each tool_result answering a tool_use of the
    assistant turn before (check_tool_results); a final assistant message (a prefill the reply continues) may not
    end in whitespace, as Anthropic requires."""

    def to_internal_value(self, data):
        if not isinstance(data, list):
            raise bad_request("'messages' must be an array of message objects.", "messages")
        if not data:
            raise bad_request("'messages' must contain at least one message.", "messages")
        messages = [validate_message(m, i) for i, m in enumerate(data)]
        check_tool_results(messages)
        last = messages[-1]
        if last["role"] == "assistant" and last["content"] and last["content"][-1]["type"] == "text" \
                and last["content"][-1]["text"] != last["content"][-1]["text"].rstrip():
            raise bad_request("The final assistant message's content cannot end with trailing whitespace.",
                              f"messages[{len(messages) - 1}].content")
        return messages


class SystemField(StrictField):
    """`system`: a string or an array of text blocks -> a list of texts."""

    def to_internal_value(self, data):
        if isinstance(data, str):
            return [data]
        if not isinstance(data, list):
            raise bad_request("'system' must be a string or an array of text blocks.", "system")
        return [validate_block(b, f"system[{j}]", "system")["text"] for j, b in enumerate(data)]


def validate_tools(data) -> list[dict]:
    """`tools`: client tools {name, description?, input_schema, type?: "custom"} -> chat's form
    {type: function, function: {name, description?, parameters}}. Server tools (a `type` such as
    bash_20250124 or web_search_20250305) are a 400 naming the tool: this server runs none."""
    if not isinstance(data, list):
        raise bad_request("'tools' must be an array of tools.", "tools")
    out, names = [], set()
    for i, tool in enumerate(data):
        p = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise bad_request(f"{p} must be an object.", p)
        if tool.get("type") not in (None, "custom"):
            raise bad_request(f"{p} is a {tool['type']!r} server tool, which this server does not run; give "
                              "client tools (name, description, input_schema).", f"{p}.type",
                              code="unsupported_tool_type")
        name = tool.get("name")
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
            raise bad_request(f"{p}.name must be 1 to 128 letters, digits, '_' or '-'; got {name!r}.", f"{p}.name")
        if name in names:
            raise bad_request(f"Tool name {name!r} is used twice.", f"{p}.name")
        names.add(name)
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise bad_request(f"{p}.input_schema must be a JSON Schema object.", f"{p}.input_schema")
        check_schema_size(schema, f"{p}.input_schema")
        fn = {"name": name}
        if tool.get("description") is not None:
            fn["description"] = _str(tool, "description", p)
        fn["parameters"] = schema
        out.append({"type": "function", "function": fn})
    return out


class ToolsField(StrictField):
    """`tools`: see validate_tools."""

    def to_internal_value(self, data):
        return validate_tools(data)


class ToolChoiceField(StrictField):
    """`tool_choice`: {type: auto | any | none} or {type: tool, name}; disable_parallel_tool_use."""

    def to_internal_value(self, data):
        if not isinstance(data, dict) or data.get("type") not in TOOL_CHOICES:
            raise bad_request("'tool_choice' must be {\"type\": \"auto\"}, {\"type\": \"any\"}, {\"type\": \"none\"} "
                              "or {\"type\": \"tool\", \"name\": ...}.", "tool_choice")
        if data["type"] == "tool" and (not isinstance(data.get("name"), str) or not data["name"]):
            raise bad_request("'tool_choice.name' is required when 'tool_choice.type' is 'tool'.", "tool_choice.name")
        disable = data.get("disable_parallel_tool_use")
        if disable is not None and not isinstance(disable, bool):
            raise bad_request("'tool_choice.disable_parallel_tool_use' must be a boolean.",
                              "tool_choice.disable_parallel_tool_use")
        return {"type": data["type"], "name": data.get("name") if data["type"] == "tool" else None,
                "disable_parallel_tool_use": bool(disable)}


class ThinkingField(StrictField):
    """`thinking`: {type: enabled, budget_tokens >= 1}, {type: disabled} or {type: adaptive}, each with
    an optional display (summarized, omitted; accepted, the text is always shown)."""

    def to_internal_value(self, data):
        if not isinstance(data, dict) or data.get("type") not in ("enabled", "disabled", "adaptive"):
            raise bad_request("'thinking' must be {\"type\": \"enabled\", \"budget_tokens\": N}, "
                              "{\"type\": \"disabled\"} or {\"type\": \"adaptive\"}.", "thinking")
        display = data.get("display")
        if display is not None and display not in THINKING_DISPLAYS:
            raise bad_request(f"'thinking.display' must be summarized or omitted; got {display!r}.", "thinking.display")
        budget = None
        if data["type"] == "enabled":
            try:
                budget = IntegerField(low=1).to_internal_value(data.get("budget_tokens"))
            except serializers.ValidationError:
                raise bad_request("'thinking.budget_tokens' must be a whole number of at least 1 when thinking is "
                                  f"enabled; got {data.get('budget_tokens')!r}.", "thinking.budget_tokens") from None
        return {"type": data["type"], "budget_tokens": budget}


class MetadataField(StrictField):
    """`metadata`: an object whose `user_id` is a string (at most 256 characters) or null."""

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            raise bad_request("'metadata' must be an object.", "metadata")
        user_id = data.get("user_id")
        if user_id is not None and (not isinstance(user_id, str) or len(user_id) > 256):
            raise bad_request("'metadata.user_id' must be a string of at most 256 characters.", "metadata.user_id")
        return {"user_id": user_id}


class OutputConfigField(StrictField):
    """`output_config`: `effort` (a string, ignored) and `format` ({type: json_schema, schema}: the
    answer is constrained to the schema). Returns {"schema": ... or None}."""

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            raise bad_request("'output_config' must be an object.", "output_config")
        if data.get("effort") is not None and not isinstance(data["effort"], str):
            raise bad_request("'output_config.effort' must be a string.", "output_config.effort")
        fmt = data.get("format")
        if fmt is None:
            return {"schema": None}
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or "schema" not in fmt:
            raise bad_request("'output_config.format' must be {\"type\": \"json_schema\", \"schema\": {...}}.",
                              "output_config.format")
        if not isinstance(fmt["schema"], dict):
            raise bad_request("'output_config.format.schema' must be a JSON Schema object.",
                              "output_config.format.schema")
        check_schema_size(fmt["schema"], "output_config.format.schema")
        return {"schema": fmt["schema"]}


class CountTokensRequest(serializers.Serializer):
    """POST /v1/messages/count_tokens: what shapes the prompt (no max_tokens)."""

    model = StringField()
    messages = MessagesField()
    system = SystemField(**opt())
    tools = ToolsField(**opt())
    tool_choice = ToolChoiceField(**opt())
    thinking = ThinkingField(**opt())
    output_config = OutputConfigField(**opt())

    def validate(self, attrs):
        """tool_choice any / tool needs tools (and the named one among them); with a forced call,
        each callable tool's input_schema must compile (tool_grammar.check_forced_tools)."""
        choice, tools = attrs.get("tool_choice"), attrs.get("tools") or []
        names = [t["function"]["name"] for t in tools]
        if choice is not None and choice["type"] in ("any", "tool") and not names:
            raise bad_request(f"tool_choice {choice['type']!r} needs at least one tool in 'tools'.", "tool_choice")
        if choice is not None and choice["type"] == "tool" and choice["name"] not in names:
            raise bad_request(f"tool_choice names the tool {choice['name']!r}, which is not in 'tools' (offered: "
                              f"{', '.join(names)}).", "tool_choice.name")
        check_forced_tools(tools or None, chat_tool_choice(choice))
        return attrs


class MessagesRequest(CountTokensRequest, SamplingExtensions):
    """POST /v1/messages."""

    max_tokens = IntegerField(low=0)
    keep_alive = KeepAliveField(**opt())
    stop_sequences = StringListField(**opt(max_items=MAX_STOP_SEQUENCES))
    temperature = NumberField(**opt(low=0, high=1))
    top_p = NumberField(**opt(low=0, high=1, low_open=True))
    top_k = IntegerField(**opt(low=-1))
    metadata = MetadataField(**opt())
    stream = BooleanField(required=False, default=False)
    service_tier = StringField(**opt())

    def validate(self, attrs):
        """The prompt's rules (CountTokensRequest.validate); thinking.budget_tokens below max_tokens
        (Anthropic's rule: the budget is part of max_tokens); min_tokens at most max_tokens."""
        attrs = super().validate(attrs)
        thinking = attrs.get("thinking")
        if thinking is not None and thinking["budget_tokens"] is not None \
                and thinking["budget_tokens"] >= attrs["max_tokens"]:
            raise bad_request(f"'thinking.budget_tokens' ({thinking['budget_tokens']}) must be less than 'max_tokens' "
                              f"({attrs['max_tokens']}).", "thinking.budget_tokens")
        if attrs.get("min_tokens") and attrs["min_tokens"] > attrs["max_tokens"]:
            raise bad_request(f"'min_tokens' ({attrs['min_tokens']}) must not exceed 'max_tokens' "
                              f"({attrs['max_tokens']}).", "min_tokens")
        attrs["stop_sequences"] = [s for s in attrs.get("stop_sequences") or [] if s]
        return attrs


def parse_messages(raw_body: bytes) -> dict:
    """Parse and validate a /v1/messages body. Raises ApiError (400) on bad input."""
    return validate(MessagesRequest, parse_json_body(raw_body))


def parse_count_tokens(raw_body: bytes) -> dict:
    """Parse and validate a /v1/messages/count_tokens body. Raises ApiError (400) on bad input."""
    return validate(CountTokensRequest, parse_json_body(raw_body))
