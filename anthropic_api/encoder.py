"""StreamDelta -> Anthropic Messages stream events, and the blocking message folded from the same events.

Source: Anthropic's API reference, "Messages" and "Streaming Messages"; the `anthropic` SDK's
stream accumulator (lib/streaming/_messages.py). Rules:
- events: message_start (content [], stop_reason null, usage with the prompt's tokens), then per
  block content_block_start / content_block_delta* / content_block_stop with indices 0, 1, 2 ...
  and one block open at a time, then message_delta (stop_reason, stop_sequence, the final usage:
  output_tokens cumulative) and message_stop; the stream layer adds `ping`s (MessagesWire);
- blocks: thinking (thinking_delta, then a signature_delta of signatures.sign(text) just before it
  stops), text (text_delta), tool_use (`toolu_` id, input {} at the start, one input_json_delta per
  ToolCallArgs fragment: several while a streamed call's arguments are written, joining into the
  arguments' JSON; a call cut off stays as sent, unclosed, which the SDK's partial JSON reader
  (jiter's partial mode) takes as the part it got, and so does `fold`: a blocking body holds the
  same cut call, stop_reason max_tokens);
- text that is only whitespace opens no block until more text follows; at the end it is a text
  block only when the turn made no tool call (no stray empty text block beside a tool_use);
- stop_reason: tool_use when the turn made a call, stop_sequence (with stop_sequence set to the
  matched string) for a stop string, end_turn at EOS, max_tokens at the length limit, refusal for
  content_filter; a request cancelled (by an operator) or past its deadline has no message: it
  ends as an error (`failure`), as an engine error does;
- usage: input_tokens are the prompt tokens not read from the prefix cache, cache_read_input_tokens
  those read from it (Anthropic's split: the prompt is their sum), cache_creation_input_tokens 0;
- warm_only (max_tokens 0): no block, stop_reason max_tokens, output_tokens 0.
The blocking body is `fold(events)`: the SDK accumulator's rules, so a blocking answer and the
stream of the same generation are the same message.
"""
from __future__ import annotations

import copy
import secrets

from jiter import from_json

from inference.serving.deltas import Content, Error, Finish, Reasoning, Refusal, ToolCallArgs, ToolCallStart, Usage
from inference.serving.errors import ApiError

from .signatures import sign

STOP_REASONS = {"length": "max_tokens", "content_filter": "refusal", "tool_calls": "tool_use"}


def new_message_id() -> str:
    """A message id in Anthropic's form: `msg_` and 24 random hex digits."""
    return f"msg_{secrets.token_hex(12)}"


def new_tool_use_id() -> str:
    """A tool_use block id in Anthropic's form: `toolu_` and 24 random hex digits."""
    return f"toolu_{secrets.token_hex(12)}"


def failure(delta: Error | Finish) -> ApiError | None:
    """The error a delta ends the request with: an engine Error (500), a Finish cancelled (500, not to
    be retried: an operator ended it) or past its deadline (504 timeout_error, not retried); None for a
    Finish that is a message's end."""
    if isinstance(delta, Error):
        return ApiError(500, delta.message, type="server_error")
    if delta.reason == "cancelled":
        return ApiError(500, "The request was cancelled on the server before it finished.", type="server_error",
                        code="cancelled", headers={"x-should-retry": "false"})
    if delta.reason == "timeout":
        return ApiError(504, "The request ran past its deadline before it finished.", type="server_error",
                        code="timeout", headers={"x-should-retry": "false"})
    return None


def usage_body(usage: Usage, warm_only: bool = False) -> dict:
    """Anthropic's usage object of a request's Usage (rules in the module doc)."""
    cached = usage.cached_prompt_tokens
    return {"input_tokens": usage.prompt_tokens - cached, "output_tokens": 0 if warm_only else usage.completion_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}


class MessageStream:
    """One message's deltas -> event dicts: `start()`, `feed(delta)` for each delta, `end(finish, usage)`."""

    def __init__(self, message_id: str, model: str, prompt_tokens: int, *, warm_only: bool = False):
        self.message_id = message_id
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.warm_only = warm_only
        self.next_index = 0
        self.open: tuple[str, int] | None = None  # (block type, index)
        self.thinking: list[str] = []
        self.pending_space = ""
        self.made_calls = False

    def start(self) -> list[dict]:
        """message_start: the message with no content yet, usage counting the whole prompt as input
        (how much of it the prefix cache held is known at the end: message_delta's usage)."""
        message = {"id": self.message_id, "type": "message", "role": "assistant", "model": self.model, "content": [],
                   "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0,
                             "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}
        return [{"type": "message_start", "message": message}]

    def _close(self) -> list[dict]:
        if self.open is None:
            return []
        kind, index = self.open
        events = []
        if kind == "thinking":
            events.append({"type": "content_block_delta", "index": index,
                           "delta": {"type": "signature_delta", "signature": sign("".join(self.thinking))}})
            self.thinking = []
        events.append({"type": "content_block_stop", "index": index})
        self.open = None
        return events

    def _open(self, block: dict) -> list[dict]:
        events = self._close()
        index, self.next_index = self.next_index, self.next_index + 1
        self.open = (block["type"], index)
        events.append({"type": "content_block_start", "index": index, "content_block": block})
        return events

    def _delta(self, delta: dict) -> dict:
        return {"type": "content_block_delta", "index": self.open[1], "delta": delta}

    def _text(self, text: str) -> list[dict]:
        events = []
        if self.open is None or self.open[0] != "text":
            if not (self.pending_space + text).strip():
                self.pending_space += text
                return []
            events = self._open({"type": "text", "text": ""})
        text, self.pending_space = self.pending_space + text, ""
        return [*events, self._delta({"type": "text_delta", "text": text})]

    def feed(self, delta) -> list[dict]:
        """The events for one Reasoning, Content, Refusal, ToolCallStart or ToolCallArgs delta."""
        if self.warm_only:
            return []
        if isinstance(delta, Reasoning) and delta.text:
            events = [] if self.open is not None and self.open[0] == "thinking" else \
                self._open({"type": "thinking", "thinking": "", "signature": ""})
            self.thinking.append(delta.text)
            return [*events, self._delta({"type": "thinking_delta", "thinking": delta.text})]
        if isinstance(delta, (Content, Refusal)) and delta.text:
            return self._text(delta.text)
        if isinstance(delta, ToolCallStart):
            self.made_calls = True
            self.pending_space = ""
            return self._open({"type": "tool_use", "id": new_tool_use_id(), "name": delta.name, "input": {}})
        if isinstance(delta, ToolCallArgs) and delta.fragment and self.open is not None and self.open[0] == "tool_use":
            return [self._delta({"type": "input_json_delta", "partial_json": delta.fragment})]
        return []

    def end(self, finish: Finish, usage: Usage) -> list[dict]:
        """The last events: open blocks closed, message_delta (stop reason, final usage), message_stop."""
        events = []
        if self.pending_space and not self.made_calls and not self.warm_only:
            events += self._open({"type": "text", "text": ""})
            events.append(self._delta({"type": "text_delta", "text": self.pending_space}))
        events += self._close()
        stop_sequence = None
        if self.warm_only:
            stop_reason = "max_tokens"
        elif finish.reason == "stop":
            stop_reason, stop_sequence = ("stop_sequence", finish.stop_string) if finish.stop_string else ("end_turn", None)
        else:
            stop_reason = STOP_REASONS.get(finish.reason, "end_turn")
        events.append({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                       "usage": usage_body(usage, self.warm_only)})
        events.append({"type": "message_stop"})
        return events


def fold(events: list[dict]) -> dict:
    """The message a complete event list describes (the SDK accumulator's rules): blocks appended at
    content_block_start, deltas applied to content[index], tool input parsed from its joined
    partial_json at the block's stop by jiter in partial mode, as the SDK's accumulator does (a call cut
    off keeps the members it completed; a string cut inside is dropped), message_delta's stop reason
    and usage applied."""
    message: dict | None = None
    partial: dict[int, str] = {}
    for event in events:
        kind = event["type"]
        if kind == "message_start":
            message = copy.deepcopy(event["message"])
        elif kind == "content_block_start":
            message["content"].append(dict(event["content_block"]))
        elif kind == "content_block_delta":
            block, delta = message["content"][event["index"]], event["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
            elif delta["type"] == "input_json_delta":
                partial[event["index"]] = partial.get(event["index"], "") + delta["partial_json"]
        elif kind == "content_block_stop" and message["content"][event["index"]]["type"] == "tool_use":
            joined = partial.get(event["index"])
            message["content"][event["index"]]["input"] = (from_json(joined.encode(), partial_mode=True)
                                                           if joined else {})
        elif kind == "message_delta":
            message.update(event["delta"])
            message["usage"].update({k: v for k, v in event["usage"].items() if v is not None})
    return message
