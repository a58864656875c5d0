"""Legacy completions on the wire: `text_completion` chunks and the blocking `text_completion` body.

Source: OpenAI API reference, "The completion object" (choices[]: text, index,
logprobs, finish_reason; usage); streamed chunks have the same shape, one choice
each, finish_reason null until a choice's last chunk, and with include_usage one
last chunk with `choices: []` and the usage before [DONE] (as chat does).
"""
from __future__ import annotations

from .deltas import Usage


class CompletionChunkEncoder:
    """Builds one response's chunk dicts. `continuous_usage` adds the running usage to every chunk."""

    def __init__(self, completion_id: str, model: str, created: int, *, continuous_usage: bool = False,
                 fingerprint: str | None = None):
        self.id = completion_id
        self.model = model
        self.fingerprint = fingerprint
        self.created = created
        self.continuous_usage = continuous_usage

    def chunk(self, index: int, text: str, *, logprobs: dict | None = None, finish_reason: str | None = None,
              token_ids: list[int] | None = None, usage: Usage | None = None) -> dict:
        """A chunk carrying one choice's next text (or, with finish_reason, its end)."""
        choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
        if token_ids is not None:
            choice["token_ids"] = token_ids
        body = {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "system_fingerprint": self.fingerprint, "choices": [choice]}
        if self.continuous_usage and usage is not None:
            body["usage"] = usage.to_openai()
        return body

    def usage_chunk(self, usage: Usage) -> dict:
        """The include_usage chunk: `choices: []` and the whole request's usage."""
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "system_fingerprint": self.fingerprint, "choices": [], "usage": usage.to_openai()}


def completion_body(completion_id: str, model: str, created: int, choices: list[dict], usage: Usage,
                    fingerprint: str | None = None) -> dict:
    """The blocking `text_completion` object."""
    return {"id": completion_id, "object": "text_completion", "created": created, "model": model,
            "system_fingerprint": fingerprint, "choices": choices, "usage": usage.to_openai()}
