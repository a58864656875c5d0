"""StreamDelta -> `chat.completion.chunk` frames and the blocking `chat.completion` body.

Source: OpenAI API reference, "The chat completion chunk object" and "The chat
completion object"; ../shared/reference/openai-contract.md section 3 (first chunk
carries delta.role, finish_reason null until the last chunk of a choice, one
usage chunk with `choices: []` before [DONE] when include_usage is set).
"""
from __future__ import annotations

import json
import time

from .assembly import final_content
from .deltas import (Content, Error, Finish, Reasoning, Refusal, StreamDelta, TokenLogprob, ToolCallArgs,
                     ToolCallStart, Usage)
from .logprobs import chat_logprobs


def sse(obj: dict | str) -> bytes:
    """One Server-Sent Events frame: `data: <json>\\n\\n`."""
    data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


DONE = sse("[DONE]")


class ChatChunkEncoder:
    """Turns one request's deltas into chunk dicts. One instance per response; `index` picks the choice."""

    def __init__(self, completion_id: str, model: str, *, include_usage: bool = False,
                 continuous_usage: bool = False, created: int | None = None, service_tier: str | None = None,
                 return_token_ids: bool = False, fingerprint: str | None = None):
        self.id = completion_id
        self.model = model
        self.fingerprint = fingerprint
        self.created = created or int(time.time())
        self.include_usage = include_usage
        self.continuous_usage = continuous_usage
        self.service_tier = service_tier
        self.return_token_ids = return_token_ids
        self._role_sent: set[int] = set()
        self._tool_calls_seen: set[int] = set()

    def _chunk(self, choices: list[dict], usage: dict | None = None) -> dict:
        chunk = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                 "system_fingerprint": self.fingerprint, "choices": choices}
        if self.service_tier is not None:
            chunk["service_tier"] = self.service_tier
        if usage is not None:
            chunk["usage"] = usage
        return chunk

    def role_chunk(self, index: int = 0, prompt_token_ids: list[int] | None = None) -> dict:
        """The first chunk of a choice: delta {"role": "assistant", "content": ""}.

        prompt_token_ids (vLLM's return_token_ids extension) go on the chunk when given."""
        self._role_sent.add(index)
        chunk = self._chunk([{"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                              "finish_reason": None}])
        if prompt_token_ids is not None:
            chunk["prompt_token_ids"] = prompt_token_ids
        return chunk

    def encode(self, delta: StreamDelta, index: int = 0, running_usage: Usage | None = None) -> dict | None:
        """The chunk for one delta, or None when it carries nothing for the wire (Finish is `finish_chunk`)."""
        body: dict
        logprobs = None
        if isinstance(delta, Content):
            body = {"content": delta.text}
            if delta.logprobs is not None:
                logprobs = {"content": chat_logprobs(delta.logprobs), "refusal": None}
        elif isinstance(delta, Reasoning):
            body = {"reasoning_content": delta.text, "reasoning": delta.text}
        elif isinstance(delta, Refusal):
            body = {"refusal": delta.text}
        elif isinstance(delta, ToolCallStart):
            self._tool_calls_seen.add(index)
            body = {"tool_calls": [{"index": delta.index, "id": delta.id, "type": "function",
                                    "function": {"name": delta.name, "arguments": ""}}]}
        elif isinstance(delta, ToolCallArgs):
            body = {"tool_calls": [{"index": delta.index, "function": {"arguments": delta.fragment}}]}
        else:
            return None
        usage = running_usage.to_openai() if self.continuous_usage and running_usage else None
        choice = {"index": index, "delta": body, "logprobs": logprobs, "finish_reason": None}
        if self.return_token_ids:
            choice["token_ids"] = getattr(delta, "token_ids", None) or []
        return self._chunk([choice], usage)

    def finish_chunk(self, finish: Finish, index: int = 0) -> dict:
        """The last chunk of a choice: an empty delta with its finish_reason."""
        usage = finish.usage.to_openai() if self.continuous_usage else None
        return self._chunk([{"index": index, "delta": {}, "logprobs": None, "finish_reason": finish.reason}], usage)

    def usage_chunk(self, usage: Usage) -> dict:
        """The include_usage chunk: `choices: []` and the whole request's usage."""
        return self._chunk([], usage.to_openai())

    @staticmethod
    def error_frame(error: Error) -> dict:
        """An error after the 200 went out, sent in-band (the SDK raises APIError on it)."""
        return {"error": {"message": error.message, "type": error.type, "param": None, "code": error.code}}


class ChatCompletionAssembler:
    """Collects one choice's deltas into the blocking response's `message` and finish_reason."""

    def __init__(self, index: int = 0):
        self.index = index
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.refusal: list[str] = []
        self.tool_calls: dict[int, dict] = {}   # by call index (a broken streamed call keeps its index)
        self.logprobs: list[TokenLogprob] | None = None
        self.finish: Finish | None = None
        self.error: Error | None = None

    def add(self, delta: StreamDelta) -> None:
        if isinstance(delta, Content):
            self.content.append(delta.text)
            if delta.logprobs is not None:
                self.logprobs = (self.logprobs or []) + delta.logprobs
        elif isinstance(delta, Reasoning):
            self.reasoning.append(delta.text)
        elif isinstance(delta, Refusal):
            self.refusal.append(delta.text)
        elif isinstance(delta, ToolCallStart):
            self.tool_calls[delta.index] = {"id": delta.id, "type": "function",
                                            "function": {"name": delta.name, "arguments": ""}}
        elif isinstance(delta, ToolCallArgs):
            self.tool_calls[delta.index]["function"]["arguments"] += delta.fragment
        elif isinstance(delta, Finish):
            self.finish = delta
        elif isinstance(delta, Error):
            self.error = delta

    def choice(self) -> dict:
        """The `choices[i]` object (content rules: assembly.final_content). Reasoning is under both
        `reasoning_content` and `reasoning`, as on the stream."""
        content = final_content("".join(self.content), bool(self.tool_calls))
        message: dict = {"role": "assistant", "content": content, "refusal": "".join(self.refusal) or None}
        if self.reasoning:
            message["reasoning_content"] = message["reasoning"] = "".join(self.reasoning)
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        logprobs = {"content": chat_logprobs(self.logprobs), "refusal": None} if self.logprobs is not None else None
        reason = self.finish.reason if self.finish else "stop"
        return {"index": self.index, "message": message, "logprobs": logprobs, "finish_reason": reason}


def chat_completion_body(completion_id: str, model: str, created: int, choices: list[dict], usage: Usage,
                         fingerprint: str | None = None) -> dict:
    """The blocking `chat.completion` object."""
    return {"id": completion_id, "object": "chat.completion", "created": created, "model": model,
            "system_fingerprint": fingerprint, "choices": choices, "usage": usage.to_openai()}
