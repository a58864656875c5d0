"""A validated Messages request -> the shared GenerationRequest (inference.serving.prepare).

Rules (Anthropic's Messages <-> Chat Completions mapping, as vLLM applies it, plus Anthropic's own):
- `system` (a string or text blocks) and every role `system` message inside `messages` are merged
  into one system message at the start, in order, joined by a blank line; a block (or the first
  line of a string) that is Claude Code's `x-anthropic-billing-header: ...` is dropped first: it
  changes with every request and would defeat the prefix cache (vLLM drops it too);
- a user message's tool_result blocks become tool messages (`tool_call_id` = tool_use_id; an
  is_error result's text starts "Error: "), in order, before a user message with its text blocks;
- an assistant message's text blocks are its content, its tool_use blocks its `tool_calls`
  (arguments as the object, which chat templates `tojson`), its thinking blocks its
  `reasoning_content` (templates that know the field render it); redacted_thinking is dropped;
- consecutive user (or assistant) messages are one turn, as Anthropic combines them;
- a final assistant message with text is a prefill: the reply continues it;
- tools become chat's function tools; tool_choice any / tool force a call through the same grammar
  as chat's required / named function, none and auto are chat's; disable_parallel_tool_use is
  parallel_tool_calls false;
- thinking enabled (budget_tokens the cap), disabled and adaptive (on, no cap) are the chat
  thinking controls (serving.thinking.Thinking); absent, the model's default;
- max_tokens 0 runs the prefill and one sampled token that is not returned (the engine always
  samples after a prefill); the answer is an empty message (encoder.MessageStream, warm_only).
"""
from __future__ import annotations

from inference.engine.grammar import GrammarSpec
from inference.serving.prepare import GenerationRequest
from inference.serving.thinking import Thinking

BILLING_HEADER = "x-anthropic-billing-header"


def without_billing_header(text: str) -> str:
    """`text` without a leading Claude Code billing header line (the whole text when it is only that)."""
    if text.lstrip().lower().startswith(BILLING_HEADER):
        return text.lstrip().partition("\n")[2]
    return text


def chat_tool_choice(choice: dict | None) -> str | dict:
    """A validated Anthropic tool_choice in chat's form: auto, required (any), none, or a named function."""
    if choice is None or choice["type"] == "auto":
        return "auto"
    if choice["type"] == "any":
        return "required"
    if choice["type"] == "none":
        return "none"
    return {"type": "function", "function": {"name": choice["name"]}}


def thinking_of(thinking: dict | None) -> Thinking:
    """A validated `thinking` as the chat thinking controls."""
    if thinking is None:
        return Thinking()
    if thinking["type"] == "disabled":
        return Thinking(False)
    return Thinking(True, thinking["budget_tokens"])


def _turn(out: list[dict], message: dict) -> None:
    """Append a user or assistant message, joining it to the previous one of the same role."""
    last = out[-1] if out else None
    if last is None or last["role"] != message["role"]:
        out.append(message)
        return
    last["content"] = "\n\n".join(t for t in (last["content"], message["content"]) if t)
    if message.get("tool_calls"):
        last.setdefault("tool_calls", []).extend(message["tool_calls"])
    if message.get("reasoning_content"):
        last["reasoning_content"] = "\n\n".join(
            t for t in (last.get("reasoning_content", ""), message["reasoning_content"]) if t)


def _user(message: dict, out: list[dict]) -> None:
    texts = []
    for block in message["content"]:
        if block["type"] == "tool_result":
            text = ("Error: " if block["is_error"] else "") + block["content"]
            out.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": text})
        else:
            texts.append(block["text"])
    if texts or all(b["type"] != "tool_result" for b in message["content"]):
        _turn(out, {"role": "user", "content": "\n\n".join(texts)})


def _assistant(message: dict, out: list[dict]) -> None:
    msg: dict = {"role": "assistant", "content": "".join(b["text"] for b in message["content"] if b["type"] == "text")}
    calls = [{"id": b["id"], "type": "function", "function": {"name": b["name"], "arguments": b["input"]}}
             for b in message["content"] if b["type"] == "tool_use"]
    if calls:
        msg["tool_calls"] = calls
    reasoning = "".join(b["thinking"] for b in message["content"] if b["type"] == "thinking")
    if reasoning:
        msg["reasoning_content"] = reasoning
    _turn(out, msg)


def chat_messages(system: list[str] | None, messages: list[dict]) -> list[dict]:
    """The chat messages (serving/messages.py shapes) of a validated system and messages (rules above)."""
    systems = [without_billing_header(t) for t in system or []]
    out: list[dict] = []
    for message in messages:
        if message["role"] == "system":
            systems.extend(b["text"] for b in message["content"])
        elif message["role"] == "user":
            _user(message, out)
        else:
            _assistant(message, out)
    system_text = "\n\n".join(t for t in systems if t.strip())
    return [{"role": "system", "content": system_text}, *out] if system_text else out


def generation_request(req: dict) -> GenerationRequest:
    """A validated Messages (or count_tokens) request in the preparation pipeline's terms."""
    messages = chat_messages(req.get("system"), req["messages"])
    prefill = bool(messages) and messages[-1]["role"] == "assistant" and bool(messages[-1]["content"]) \
        and not messages[-1].get("tool_calls")
    choice = req.get("tool_choice")
    schema = (req.get("output_config") or {}).get("schema")
    max_tokens = req.get("max_tokens")
    return GenerationRequest(
        param="messages", model=req["model"], messages=messages,
        add_generation_prompt=not prefill, continue_final_message=prefill,
        tools=req.get("tools") or None, tool_choice=chat_tool_choice(choice),
        parallel_tool_calls=not (choice or {}).get("disable_parallel_tool_use", False),
        thinking=thinking_of(req.get("thinking")),
        max_tokens=None if max_tokens is None else max(1, max_tokens), sampling=req,
        stop=req.get("stop_sequences") or [],
        structured=(GrammarSpec.json_schema(schema), "output_config.format.schema") if schema is not None else None)
