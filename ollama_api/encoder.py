"""StreamDelta -> Ollama's NDJSON objects for /api/chat and /api/generate, and the blocking answer folded from them.

Source: Ollama's docs/api.md ("Generate a completion", "Generate a chat completion") and api/types.go
(ChatResponse, GenerateResponse, Metrics, ToolCall, Logprob); contracts-wave4 §1.2-§1.5. Rules:
- every object has `model` (exactly as the request named it), `created_at` (RFC 3339 in UTC with nanoseconds,
  Go's RFC3339Nano) and `done`; chat's carry `message` {role: assistant, content, thinking?, tool_calls?},
  generate's `response` (and `thinking`);
- content and reasoning are sent as they arrive (Content, Reasoning), an object each; an empty Content (token
  ids only) sends nothing unless it carries logprobs (`logprobs` [{token, logprob, bytes, top_logprobs?}]);
- a tool call is sent whole, never as partial arguments: its ToolCallArgs fragments are joined until they
  make a JSON object, and then the call goes out, {id: call_<8 letters and digits>, function: {index, name,
  arguments: the object}} (chat: in an object of its own; generate: on the final object). A call whose
  arguments never make an object (cut off by num_predict, or invalid) is not sent: Ollama's clients require an
  object there, and the done_reason (length) says what happened;
- the final object: `done: true`, `done_reason` (length when num_predict or the context ended it, whatever calls
  the turn made before: contracts-wave4 §1.4, num_predict; else stop, a turn that made tool calls too, as Ollama
  says), the metrics in nanoseconds and tokens (total_duration, load_duration, prompt_eval_count,
  prompt_eval_duration, eval_count, eval_duration; a zero one left out, as Ollama's omitempty does), and on
  generate `context` (the prompt's and the answer's token ids, which a next request sends back; not with `raw`);
- an engine error, an operator's cancel or a request past its deadline ends the answer with an error
  (`failure`): a final `{"error": "..."}` line on a stream, the status on a blocking answer;
- the blocking answer is `fold(objects)`: content, thinking and response concatenated, tool calls and logprobs
  gathered, the rest the final object's: what Ollama's server answers with "stream": false, so the stream and
  the blocking answer of one generation say the same.
"""
from __future__ import annotations

import json
import secrets
import string
import time
from dataclasses import dataclass

from inference.serving.deltas import (Content, Error, Finish, Reasoning, Refusal, TokenLogprob, ToolCallArgs,
                                      ToolCallStart, Usage)
from inference.serving.errors import ApiError

CHAT, GENERATE = "chat", "generate"
_ID_ALPHABET = string.ascii_lowercase + string.digits
DONE_REASONS = {"length": "length"}  # anything else that ends a turn normally is Ollama's "stop"
METRICS = ("total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count",
           "eval_duration")


def created_at(ns: int | None = None) -> str:
    """RFC 3339 in UTC with nanoseconds, trailing zeros dropped (Go's RFC3339Nano): `ns` (Unix nanoseconds,
    default now)."""
    ns = time.time_ns() if ns is None else ns
    seconds, frac = divmod(ns, 1_000_000_000)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    fraction = f"{frac:09d}".rstrip("0")
    return f"{stamp}.{fraction}Z" if fraction else f"{stamp}Z"


def new_call_id() -> str:
    """A tool call id in Ollama's form: `call_` and 8 lowercase letters and digits."""
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(8))


def failure(delta: Error | Finish) -> ApiError | None:
    """The error an answer ends with: an engine Error (500), a request an operator cancelled (500) or one past its
    deadline (500, as Ollama answers a runner's failure); None for a Finish that ends it normally."""
    if isinstance(delta, Error):
        return ApiError(500, delta.message, type="server_error", code=delta.code)
    if delta.reason == "cancelled":
        return ApiError(500, "the request was cancelled on the server before it finished", type="server_error",
                        code="cancelled")
    if delta.reason == "timeout":
        return ApiError(500, "the request ran past its deadline before it finished", type="server_error",
                        code="timeout")
    return None


@dataclass(slots=True)
class Timing:
    """An answer's clock (time.perf_counter seconds): `started` when the view began, `load_s` spent waiting for
    the model to load, `submitted` when the engine request went in, `first` at its first token, `ended` at its
    end."""

    started: float
    load_s: float = 0.0
    submitted: float | None = None
    first: float | None = None
    ended: float | None = None

    def metrics(self, usage: Usage) -> dict:
        """Ollama's metrics in nanoseconds and tokens (zeros left out)."""
        end = self.ended or time.perf_counter()
        submitted = self.submitted or self.started
        first = self.first or end
        values = {"total_duration": end - self.started, "load_duration": self.load_s,
                  "prompt_eval_count": usage.prompt_tokens, "prompt_eval_duration": first - submitted,
                  "eval_count": usage.completion_tokens, "eval_duration": end - first}
        out = {}
        for name in METRICS:
            value = values[name] if name.endswith("count") else int(values[name] * 1e9)
            if value > 0:
                out[name] = int(value)
        return out


def logprob_entries(entries: list[TokenLogprob], top: int) -> list[dict]:
    """Ollama's logprobs of content tokens: {token, logprob, bytes (ints), top_logprobs (with `top` > 0)}."""
    out = []
    for e in entries:
        item = {"token": e.token, "logprob": e.logprob if e.logprob is not None else 0.0, "bytes": list(e.bytes)}
        if top:
            item["top_logprobs"] = [{"token": t.token, "logprob": t.logprob, "bytes": list(t.bytes)}
                                    for t in (e.top or ())[:top]]
        out.append(item)
    return out


class OllamaStream:
    """One answer's deltas -> Ollama's objects (module doc): `feed(delta)` for each delta, `end(finish, usage)`
    for the final object.

    kind: CHAT or GENERATE. model: the request's `model`, as sent. context: generate's prompt token ids (the
    final object's `context` begins with them), None for chat and raw generate. logprobs: None (not asked),
    else how many alternatives each token lists. timing: the answer's clock (its `first` is set here)."""

    def __init__(self, kind: str, model: str, timing: Timing, *, context: list[int] | None = None,
                 logprobs: int | None = None, new_id=new_call_id):
        self.kind = kind
        self.model = model
        self.timing = timing
        self.context = list(context) if context is not None else None
        self.logprobs = logprobs
        self._new_id = new_id
        self._pending: dict[int, dict] = {}  # index -> {"name", "args"}: a call whose arguments are arriving
        self.calls: list[dict] = []
        self.generated: list[int] = []

    def _object(self, **fields) -> dict:
        return {"model": self.model, "created_at": created_at(), **fields}

    def _chunk(self, content: str = "", thinking: str | None = None, tool_calls: list | None = None,
               logprobs: list | None = None) -> dict:
        if self.kind == CHAT:
            message: dict = {"role": "assistant", "content": content}
            if thinking:
                message["thinking"] = thinking
            if tool_calls:
                message["tool_calls"] = tool_calls
            obj = self._object(message=message, done=False)
        else:
            obj = self._object(response=content, done=False)
            if thinking:
                obj["thinking"] = thinking
        if logprobs:
            obj["logprobs"] = logprobs
        return obj

    def _tokens(self, ids: list[int] | None) -> None:
        if ids:
            self.generated.extend(ids)
            if self.timing.first is None:
                self.timing.first = time.perf_counter()

    def _call(self, index: int) -> dict | None:
        """The call at `index` once its arguments make a JSON object (then no longer pending), else None."""
        pending = self._pending[index]
        if not pending["args"].rstrip().endswith("}"):
            return None
        try:
            arguments = json.loads(pending["args"])
        except ValueError:
            return None
        if not isinstance(arguments, dict):
            return None
        del self._pending[index]
        call = {"id": self._new_id(), "function": {"index": len(self.calls), "name": pending["name"],
                                                   "arguments": arguments}}
        self.calls.append(call)
        return call

    def feed(self, delta) -> list[dict]:
        """The objects a Content, Reasoning, Refusal or tool-call delta sends (often none)."""
        self._tokens(getattr(delta, "token_ids", None))
        if isinstance(delta, (Content, Refusal)):
            entries = getattr(delta, "logprobs", None)
            logprobs = logprob_entries(entries, self.logprobs) if self.logprobs is not None and entries else None
            return [self._chunk(delta.text, logprobs=logprobs)] if delta.text or logprobs else []
        if isinstance(delta, Reasoning):
            return [self._chunk(thinking=delta.text)] if delta.text else []
        if isinstance(delta, ToolCallStart):
            self._pending[delta.index] = {"name": delta.name, "args": ""}
            return []
        if isinstance(delta, ToolCallArgs) and delta.index in self._pending:
            self._pending[delta.index]["args"] += delta.fragment
            call = self._call(delta.index)
            if call is not None and self.kind == CHAT:
                return [self._chunk(tool_calls=[call])]
        return []

    def end(self, finish: Finish, usage: Usage) -> dict:
        """The final object of an answer that ended normally (failure(finish) is None)."""
        self.timing.ended = time.perf_counter()
        reason = DONE_REASONS.get(finish.engine_reason, "stop")
        if self.kind == CHAT:
            obj = self._object(message={"role": "assistant", "content": ""}, done=True, done_reason=reason)
        else:
            obj = self._object(response="", done=True, done_reason=reason)
            if self.calls:
                obj["tool_calls"] = self.calls
            if self.context is not None:
                obj["context"] = [*self.context, *self.generated]
        obj.update(self.timing.metrics(usage))
        return obj


def fold(objects: list[dict]) -> dict:
    """The blocking answer of a stream's objects (module doc): the final object with the text, thinking, tool
    calls and logprobs of all of them."""
    final = dict(objects[-1])
    texts, thoughts, calls, logprobs = [], [], [], []
    for obj in objects:
        part = obj.get("message", obj)
        texts.append(part.get("content", part.get("response", "")))
        thoughts.append(part.get("thinking") or "")
        calls += part.get("tool_calls") or []
        logprobs += obj.get("logprobs") or []
    if "message" in final:
        message = {"role": "assistant", "content": "".join(texts)}
        if any(thoughts):
            message["thinking"] = "".join(thoughts)
        if calls:
            message["tool_calls"] = calls
        final["message"] = message
    else:
        final["response"] = "".join(texts)
        if any(thoughts):
            final["thinking"] = "".join(thoughts)
        if calls:
            final["tool_calls"] = calls
    if logprobs:
        final["logprobs"] = logprobs
    return final


def load_answer(kind: str, model: str, reason: str, timing: Timing) -> dict:
    """The answer to a request with no messages / no prompt: the model loaded (done_reason "load"), or with
    keep_alive 0 let go ("unload"); chat's carries an empty assistant message, generate's no `response`."""
    timing.ended = time.perf_counter()
    obj = {"model": model, "created_at": created_at()}
    if kind == CHAT:
        obj["message"] = {"role": "assistant", "content": ""}
    obj.update(done=True, done_reason=reason)
    if reason == "load" and timing.load_s > 0:
        obj["load_duration"] = int(timing.load_s * 1e9)
    return obj
