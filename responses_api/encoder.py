"""StreamDelta -> Responses streaming events and output items: the event state machine.

Source: OpenAI API reference, "Streaming events" (Responses), and
../shared/reference/openai-contract.md section 2e (the order the official SDK's stream
helper checks); behaviour ported from the original server's responses stream
(../shared/reference/seed-responses-stream.rs.txt), with its one-call limit lifted.

At most one output item is open at a time, and items take output_index 0, 1, 2... in the
order they open:
- Reasoning opens a reasoning item (a new one if something else is open, which closes first);
  its text streams as one `summary_text` part.
- Content and Refusal open a message item (closing an open reasoning item or function call);
  a message holds parts in order: text goes to an `output_text` part and refusal text to a
  `refusal` part, a new part whenever the kind changes.
- ToolCallStart closes whatever is open and opens a function_call item; ToolCallArgs stream
  into it. So a call after text closes the message, and text after a call opens a new one.
- `close(status)` at the end closes the open item; `status` is "completed", or "incomplete"
  when the response stops early (length, content filter, error, cancel).
- `ResponsesEventEncoder.resume(events)` rebuilds that state from recorded events, so a response
  whose process died can be closed where its events stopped (store.fail_response).
"""

from __future__ import annotations

from collections.abc import Callable

from inference.serving.deltas import (
    Content,
    Error,
    Finish,
    Reasoning,
    Refusal,
    StreamDelta,
    ToolCallArgs,
    ToolCallStart,
    Usage,
)
from inference.serving.logprobs import chat_logprobs

from .models import new_id


class EncoderError(ValueError):
    """The deltas broke the IR's rules (arguments for a call that is not open)."""


def _text_part(kind: str, text: str, logprobs: list[dict] | None = None) -> dict:
    """A message's content part: refusal, or output_text with its tokens' logprobs (chat's entry shape:
    logprobs.chat_logprobs; empty unless `include` asked for them)."""
    if kind == "refusal":
        return {"type": "refusal", "refusal": text}
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


class _Message:
    type = "message"

    def __init__(self, item_id: str):
        self.id = item_id
        # (kind, text pieces, logprob entries), kind: text | refusal
        self.parts: list[tuple[str, list[str], list[dict]]] = []
        self.part_open = False

    def item(self, status: str) -> dict:
        content = [_text_part(kind, "".join(pieces), logprobs) for kind, pieces, logprobs in self.parts]
        return {"id": self.id, "type": "message", "role": "assistant", "status": status,
                "content": content}


class _Reasoning:
    type = "reasoning"

    def __init__(self, item_id: str):
        self.id = item_id
        self.pieces: list[str] = []

    def item(self, status: str) -> dict:
        summary = [{"type": "summary_text", "text": "".join(self.pieces)}] if self.pieces else []
        return {"id": self.id, "type": "reasoning", "summary": summary, "status": status}


class _FunctionCall:
    type = "function_call"

    def __init__(self, item_id: str, index: int, call_id: str, name: str):
        self.id = item_id
        self.index = index
        self.call_id = call_id
        self.name = name
        self.pieces: list[str] = []

    def item(self, status: str) -> dict:
        return {"id": self.id, "type": "function_call", "call_id": self.call_id, "name": self.name,
                "arguments": "".join(self.pieces), "status": status}


class ResponsesEventEncoder:
    """One response's deltas -> event dicts (without `sequence_number`) and its output items.

    `feed(delta)` returns the events the delta causes; Finish and Error only record themselves
    (`finish`, `error`) and emit nothing. `close(status)` closes the open item. `output` holds
    every item in output_index order, closed ones in their final form. id_factory(prefix) makes
    item ids (msg, rs, fc). Raises EncoderError when ToolCallArgs name a call that is not open.
    """

    def __init__(self, id_factory: Callable[[str], str] = new_id):
        self._new_id = id_factory
        self.output: list[dict] = []
        self._open: _Message | _Reasoning | _FunctionCall | None = None
        self.finish: Finish | None = None
        self.error: Error | None = None

    @classmethod
    def resume(cls, events: list[dict], id_factory: Callable[[str], str] = new_id
               ) -> "ResponsesEventEncoder":
        """An encoder in the state that `events` (one response's recorded events, in order) left
        one in: `output` holds the items they built, and the item they left open is open again,
        so `close()` gives the events that finish it. Events other than item events are skipped.
        A resumed function call takes no further ToolCallArgs (its delta index is not recorded).
        """
        enc = cls(id_factory)
        for event in events:
            kind = event["type"]
            item = enc._open
            if kind == "response.output_item.added":
                added = event["item"]
                enc.output.append(added)
                if added["type"] == "message":
                    enc._open = _Message(added["id"])
                elif added["type"] == "reasoning":
                    enc._open = _Reasoning(added["id"])
                else:
                    enc._open = _FunctionCall(added["id"], -1, added.get("call_id"),
                                              added.get("name"))
            elif kind == "response.output_item.done":
                enc.output[event["output_index"]] = event["item"]
                enc._open = None
            elif kind == "response.content_part.added" and isinstance(item, _Message):
                item.parts.append(("refusal" if event["part"]["type"] == "refusal" else "text", [], []))
                item.part_open = True
            elif kind == "response.content_part.done" and isinstance(item, _Message):
                item.part_open = False
            elif kind in ("response.output_text.delta", "response.refusal.delta") and \
                    isinstance(item, _Message) and item.parts:
                item.parts[-1][1].append(event["delta"])
                item.parts[-1][2].extend(event.get("logprobs") or [])
            elif kind in ("response.reasoning_summary_text.delta",
                          "response.function_call_arguments.delta") and \
                    isinstance(item, (_Reasoning, _FunctionCall)):
                item.pieces.append(event["delta"])
        return enc

    @property
    def output_index(self) -> int:
        """The output_index of the open item (the next one when none is open)."""
        return len(self.output) - 1 if self._open is not None else len(self.output)

    def feed(self, delta: StreamDelta) -> list[dict]:
        if isinstance(delta, Content):
            return self._text("text", delta.text, chat_logprobs(delta.logprobs) if delta.logprobs else [])
        if isinstance(delta, Refusal):
            return self._text("refusal", delta.text)
        if isinstance(delta, Reasoning):
            return self._reasoning(delta.text)
        if isinstance(delta, ToolCallStart):
            return self._call_start(delta)
        if isinstance(delta, ToolCallArgs):
            return self._call_args(delta)
        if isinstance(delta, Finish):
            self.finish = delta
        elif isinstance(delta, Error):
            self.error = delta
        return []

    def close(self, status: str = "completed") -> list[dict]:
        """Events that close the open item (none when nothing is open)."""
        item, self._open = self._open, None
        if item is None:
            return []
        index = len(self.output) - 1
        events: list[dict] = []
        if isinstance(item, _Message):
            events += self._close_part(item, index)
        elif isinstance(item, _Reasoning):
            text = "".join(item.pieces)
            part = {"type": "summary_text", "text": text}
            events.append({"type": "response.reasoning_summary_text.done", "item_id": item.id,
                           "output_index": index, "summary_index": 0, "text": text})
            events.append({"type": "response.reasoning_summary_part.done", "item_id": item.id,
                           "output_index": index, "summary_index": 0, "part": part})
        else:
            events.append({"type": "response.function_call_arguments.done", "item_id": item.id,
                           "output_index": index, "name": item.name,
                           "arguments": "".join(item.pieces)})
        final = item.item(status)
        self.output[index] = final
        events.append({"type": "response.output_item.done", "output_index": index, "item": final})
        return events

    # --- transitions ---

    def _open_item(self, item) -> list[dict]:
        events = self.close()
        self._open = item
        self.output.append(item.item("in_progress"))
        events.append({"type": "response.output_item.added", "output_index": len(self.output) - 1,
                       "item": dict(self.output[-1])})
        return events

    def _text(self, kind: str, text: str, logprobs: list[dict] | None = None) -> list[dict]:
        if not text:
            if logprobs and isinstance(self._open, _Message) and self._open.part_open \
                    and self._open.parts[-1][0] == "text":
                self._open.parts[-1][2].extend(logprobs)  # a token whose text the stream holds back yet
            return []
        events: list[dict] = []
        msg = self._open
        if not isinstance(msg, _Message):
            msg = _Message(self._new_id("msg"))
            events += self._open_item(msg)
        index = len(self.output) - 1
        if not msg.part_open or msg.parts[-1][0] != kind:
            events += self._close_part(msg, index)
            msg.parts.append((kind, [], []))
            msg.part_open = True
            events.append({"type": "response.content_part.added", "item_id": msg.id,
                           "output_index": index, "content_index": len(msg.parts) - 1,
                           "part": _text_part(kind, "")})
        msg.parts[-1][1].append(text)
        msg.parts[-1][2].extend(logprobs or [])
        content_index = len(msg.parts) - 1
        if kind == "refusal":
            events.append({"type": "response.refusal.delta", "item_id": msg.id,
                           "output_index": index, "content_index": content_index, "delta": text})
        else:
            events.append({"type": "response.output_text.delta", "item_id": msg.id,
                           "output_index": index, "content_index": content_index, "delta": text,
                           "logprobs": logprobs or []})
        return events

    @staticmethod
    def _close_part(msg: _Message, index: int) -> list[dict]:
        """Events that finish the message's last part (none when no part is open)."""
        if not msg.parts or not msg.part_open:
            return []
        msg.part_open = False
        kind, pieces, logprobs = msg.parts[-1]
        text = "".join(pieces)
        content_index = len(msg.parts) - 1
        common = {"item_id": msg.id, "output_index": index, "content_index": content_index}
        if kind == "refusal":
            done = {"type": "response.refusal.done", **common, "refusal": text}
        else:
            done = {"type": "response.output_text.done", **common, "text": text, "logprobs": logprobs}
        return [done, {"type": "response.content_part.done", **common,
                       "part": _text_part(kind, text, logprobs)}]

    def _reasoning(self, text: str) -> list[dict]:
        if not text:
            return []
        events: list[dict] = []
        item = self._open
        if not isinstance(item, _Reasoning):
            item = _Reasoning(self._new_id("rs"))
            events += self._open_item(item)
            events.append({"type": "response.reasoning_summary_part.added", "item_id": item.id,
                           "output_index": len(self.output) - 1, "summary_index": 0,
                           "part": {"type": "summary_text", "text": ""}})
        item.pieces.append(text)
        events.append({"type": "response.reasoning_summary_text.delta", "item_id": item.id,
                       "output_index": len(self.output) - 1, "summary_index": 0, "delta": text})
        return events

    def _call_start(self, delta: ToolCallStart) -> list[dict]:
        return self._open_item(_FunctionCall(self._new_id("fc"), delta.index, delta.id, delta.name))

    def _call_args(self, delta: ToolCallArgs) -> list[dict]:
        call = self._open
        if not isinstance(call, _FunctionCall) or call.index != delta.index:
            raise EncoderError(f"arguments for tool call {delta.index}, which is not the open item")
        if not delta.fragment:
            return []
        call.pieces.append(delta.fragment)
        return [{"type": "response.function_call_arguments.delta", "item_id": call.id,
                 "output_index": len(self.output) - 1, "delta": delta.fragment}]


def responses_usage(usage: Usage) -> dict:
    """The Response `usage` object (OpenAI's ResponseUsage) from the IR's token counts."""
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_prompt_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.total_tokens,
    }


# The SDK's stream events have no response.cancelled: a cancelled response ends with
# response.incomplete, whose `response.status` says "cancelled".
TERMINAL_EVENT = {"completed": "response.completed", "incomplete": "response.incomplete",
                  "failed": "response.failed", "cancelled": "response.incomplete"}


def terminal_events(final: dict) -> list[dict]:
    """The events (without sequence numbers) that end the stream of a response whose final
    Response object is `final`: an `error` event when it has an error, then exactly one
    terminal event (TERMINAL_EVENT[final["status"]]). Source: openai-contract.md 2e, rule 6.
    Raises KeyError for a status that is not final (queued, in_progress)."""
    events = []
    if final.get("error") is not None:
        events.append({"type": "error", "code": final["error"]["code"],
                       "message": final["error"]["message"], "param": None})
    events.append({"type": TERMINAL_EVENT[final["status"]], "response": final})
    return events


def outcome(finish: Finish | None, error: Error | None) -> tuple[str, dict | None, dict | None]:
    """(status, incomplete_details, error) of a response whose deltas ended this way.

    stop and tool_calls -> completed; length -> incomplete (reason max_output_tokens), whenever the
    token limit ended the generation (Finish.engine_reason), calls made before it or not: OpenAI's
    rule for max_output_tokens, and vLLM's status from the engine's finish reason; content_filter ->
    incomplete (content_filter); cancelled -> cancelled; timeout, an Error delta, or no Finish at all
    -> failed with a server_error.
    """
    if error is not None:
        return "failed", None, {"code": error.code or "server_error", "message": error.message}
    reason = finish.engine_reason if finish else None
    if reason in ("stop", "tool_calls"):
        return "completed", None, None
    if reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}, None
    if reason == "content_filter":
        return "incomplete", {"reason": "content_filter"}, None
    if reason == "cancelled":
        return "cancelled", None, None
    if reason == "timeout":
        return "failed", None, {"code": "server_error",
                                "message": "The response ran past the server's request timeout."}
    return "failed", None, {"code": "server_error",
                            "message": "Generation ended without a finish reason."}
