"""A validated /api/chat or /api/generate request -> the shared GenerationRequest (inference.serving.prepare).

Rules (Ollama's docs/api.md and api/types.go, contracts-wave4 §1.2-§1.5, onto this server's controls):
- options: num_predict is max_tokens, cut to the room the context leaves (Ollama shifts the context and goes
  on; this server stops at the context's end, done_reason length), a negative or 0 one no limit but the
  context (as Ollama's runner reads it); temperature, top_k, top_p, min_p, seed (a negative one: random), presence_penalty and frequency_penalty
  are the sampler's of the same names, repeat_penalty its repetition_penalty (vLLM's rule: over the prompt and
  the whole output, so repeat_last_n, Ollama's window, has no effect); stop the stop strings; num_ctx the
  request's own context length (GenerationRequest.context_limit: prompt + answer within it, never past the
  engine's, and the model is never reloaded for it; 0 or less: the engine's). typical_p is not a control this
  engine has, and num_keep, num_batch, num_gpu, main_gpu, use_mmap, num_thread and draft_num_predict are
  Ollama's loader's and runner's; they are checked and have no effect, as Ollama ignores options it does not
  know. A request's unset controls take the model's defaults (serving/sampling.py), not Ollama's;
- format: "json" is a JSON object, a schema that schema, through the structured-output grammar
  (serving/structured.py; for a thinking model it applies once the thinking ends);
- think: true / a level turn thinking on (a level is the template's reasoning_effort; "max" is "high"), false
  off, absent the model's default (serving/thinking.Thinking);
- truncate (default true) drops the oldest turns of a chat that does not fit its context (Ollama's), shift is
  accepted (generation stops at the context's end here);
- logprobs / top_logprobs: the content tokens' logprobs and that many alternatives;
- chat messages: Ollama's shapes to the template's (serving/messages.py shapes): an assistant's tool_calls
  with their arguments as objects and its `thinking` as reasoning_content; a tool result's `tool_call_id`, else
  the id of the latest call of its `tool_name` not yet answered;
- generate: the prompt as the user's message (after `system`) through the model's chat template; `raw` sends
  the prompt as it is; `template` is rendered (go_template.py: .System, .Prompt, .Suffix) and sent as it is;
  else `suffix` lays prompt and suffix out for fill-in-the-middle (the view refuses it on a model without the
  tokens; a system prompt has no place there and is left out); `context` (token ids a previous answer
  returned) comes before the new prompt.
"""
from __future__ import annotations

from inference.engine.grammar import GrammarSpec
from inference.serving.prepare import GenerationRequest
from inference.serving.thinking import Thinking

from . import go_template

# Ollama's option -> the sampling field it sets (serving/sampling.PASSTHROUGH names).
SAMPLING = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
            "repeat_penalty": "repetition_penalty", "presence_penalty": "presence_penalty",
            "frequency_penalty": "frequency_penalty", "seed": "seed"}


def sampling_of(options: dict) -> dict:
    """The sampling fields (serving/sampling.py names) of validated `options`; a negative seed is no seed."""
    out = {field: options[name] for name, field in SAMPLING.items() if options.get(name) is not None}
    if out.get("seed") is not None and out["seed"] < 0:
        del out["seed"]
    return out


def max_tokens_of(options: dict) -> int | None:
    """num_predict as max_tokens: None (up to the context) when unset, 0 or negative."""
    n = options.get("num_predict")
    return n if n is not None and n > 0 else None


def context_limit_of(options: dict) -> int | None:
    """num_ctx as the request's context length, None when unset or not positive."""
    n = options.get("num_ctx")
    return n if n is not None and n > 0 else None


def thinking_of(think) -> Thinking:
    """`think` as the thinking controls."""
    if think is None:
        return Thinking()
    if isinstance(think, bool):
        return Thinking(think)
    return Thinking(True, effort="high" if think == "max" else think)


def structured_of(fmt) -> tuple[GrammarSpec, str] | None:
    """`format` as (grammar spec, the field it names), None when unset."""
    if fmt is None:
        return None
    return GrammarSpec.json_schema({"type": "object"} if fmt == "json" else fmt), "format"


def logprobs_of(req: dict) -> int | None:
    """The logprobs the engine returns: None unless `logprobs`, else `top_logprobs` alternatives (0: none)."""
    return (req.get("top_logprobs") or 0) if req["logprobs"] else None


def chat_messages(messages: list[dict]) -> list[dict]:
    """Validated Ollama messages (protocol.validate_message) in the chat template's shape (rules above)."""
    out, unanswered = [], []  # unanswered: (name, id) of the calls made so far without a result
    for m in messages:
        msg: dict = {"role": m["role"], "content": m["content"]}
        if m["role"] == "assistant":
            calls = []
            for call in m["tool_calls"]:
                call_id = call["id"] or f"call_{len(unanswered)}_{call['name']}"
                calls.append({"id": call_id, "type": "function",
                              "function": {"name": call["name"], "arguments": call["arguments"]}})
                unanswered.append((call["name"], call_id))
            if calls:
                msg["tool_calls"] = calls
            if m["thinking"]:
                msg["reasoning_content"] = m["thinking"]
        elif m["role"] == "tool":
            call_id = m["tool_call_id"]
            if call_id is None:
                match = next((c for c in reversed(unanswered) if m["tool_name"] in (None, c[0])), None)
                call_id = match[1] if match else f"call_{m['tool_name'] or 'tool'}"
            unanswered = [c for c in unanswered if c[1] != call_id]
            msg["tool_call_id"] = call_id
            if m["tool_name"]:
                msg["name"] = m["tool_name"]
        out.append(msg)
    return out


def _common(req: dict, model: str) -> dict:
    options = req["options"]
    return {"model": model, "thinking": thinking_of(req.get("think")), "max_tokens": max_tokens_of(options),
            "fit_max_tokens": True,
            "sampling": sampling_of(options), "logprobs": logprobs_of(req), "stop": list(options.get("stop") or []),
            "structured": structured_of(req.get("format")), "context_limit": context_limit_of(options)}


def chat_request(req: dict, model: str) -> GenerationRequest:
    """A validated /api/chat request (messages not empty) in the pipeline's terms; `model`: the served name it
    selects (names.resolve)."""
    return GenerationRequest(param="messages", messages=chat_messages(req["messages"]), tools=req.get("tools"),
                             truncate=req["truncate"], **_common(req, model))


def generate_request(req: dict, model: str) -> GenerationRequest:
    """A validated /api/generate request (prompt or suffix not empty) in the pipeline's terms (rules above)."""
    common = _common(req, model)
    prefix = list(req.get("context") or [])
    if req["raw"]:
        return GenerationRequest(param="prompt", prompts=[req["prompt"]], **common)
    if req.get("template"):
        text = go_template.render(req["template"], system=req.get("system") or "", prompt=req["prompt"],
                                  suffix=req.get("suffix") or "")
        return GenerationRequest(param="prompt", prompts=[text], prefix_ids=prefix, **common)
    if req.get("suffix"):
        return GenerationRequest(param="prompt", prompts=[req["prompt"]], suffix=req["suffix"], prefix_ids=prefix,
                                 **common)
    messages = ([{"role": "system", "content": req["system"]}] if req.get("system") else []) + \
        [{"role": "user", "content": req["prompt"]}]
    return GenerationRequest(param="prompt", messages=messages, prefix_ids=prefix, **common)
