"""Prompt token ids from requests: chat messages through the chat template, and completions' prompts.

Source: transformers' apply_chat_template (continue_final_message cuts the rendered
text right after the final message's content, so the model continues it); vLLM's
chat_template_kwargs; llama.cpp's server for infill (fill-in-the-middle) prompts.
"""
from __future__ import annotations

from inference.engine.chat_template import ChatTemplateError

from .errors import bad_request
from .thinking import Thinking
from .tool_prompt import prompt_messages

# Template variables a request may not override through chat_template_kwargs.
RESERVED_TEMPLATE_KWARGS = frozenset({"messages", "tools", "add_generation_prompt", "documents", "source"})
# Fill-in-the-middle token triples (prefix, suffix, middle), StarCoder's and Qwen's spellings.
FIM_TOKENS = (("<fim_prefix>", "<fim_suffix>", "<fim_middle>"), ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"))


def render_messages(tokenizer, messages: list[dict], *, tools: list[dict] | None = None, tool_choice="auto",
                    parallel_tool_calls: bool = True, thinking: Thinking = Thinking(),
                    chat_template_kwargs: dict | None = None, add_generation_prompt: bool = True,
                    continue_final_message: bool = False, param: str = "messages") -> str:
    """The prompt text of normalized chat `messages` (messages.py shapes) through the chat template.

    Tools reach the template, or a system section when the template ignores them (tool_prompt.py);
    the resolved thinking choice (thinking.py) sets enable_thinking and reasoning_effort over
    chat_template_kwargs. The final message is continued instead of a new turn started when
    continue_final_message is set, or add_generation_prompt is off with an assistant message last
    (transformers' rule). Raises ApiError 400: param chat_template_kwargs for a reserved name or a
    value the template cannot use; `param` when the template fails or the final message cannot be
    continued.
    """
    kwargs = dict(chat_template_kwargs or {})
    reserved = RESERVED_TEMPLATE_KWARGS & set(kwargs)
    if reserved:
        raise bad_request(f"'chat_template_kwargs' may not set {', '.join(sorted(reserved))}; use the request "
                          "fields of those names.", "chat_template_kwargs")
    kwargs.update(thinking.template_kwargs())
    messages, offered = prompt_messages(messages, tools, tool_choice or "auto", parallel_tool_calls,
                                        tokenizer.chat_template)
    cont = continue_final_message or (not add_generation_prompt and messages[-1]["role"] == "assistant")
    try:
        text = tokenizer.apply_chat_template(messages, tools=offered,
                                             add_generation_prompt=add_generation_prompt and not cont, **kwargs)
    except ChatTemplateError as exc:
        raise bad_request(f"The chat template could not render '{param}': {exc}", param) from exc
    except TypeError as exc:  # a chat_template_kwargs value the template cannot use
        raise bad_request(f"The chat template could not use chat_template_kwargs: {exc}",
                          "chat_template_kwargs") from exc
    if cont:
        final = messages[-1]["content"].strip()
        cut = text.rfind(final) if final else -1
        if final and cut < 0:
            raise bad_request("The final message cannot be continued: its content does not appear in the "
                              "rendered prompt.", param)
        if final:
            text = text[:cut + len(final)]
    return text


def render_chat(tokenizer, req: dict, thinking: Thinking) -> str:
    """The prompt text of a validated chat (or /tokenize) request: render_messages over its fields."""
    return render_messages(tokenizer, req["messages"], tools=req.get("tools"),
                           tool_choice=req.get("tool_choice") or "auto",
                           parallel_tool_calls=req.get("parallel_tool_calls") is not False, thinking=thinking,
                           chat_template_kwargs=req.get("chat_template_kwargs"),
                           add_generation_prompt=req.get("add_generation_prompt", True),
                           continue_final_message=bool(req.get("continue_final_message")))


def echo_text(req: dict) -> str:
    """Chat `echo`: the text the response starts with, as vLLM does: the last message's content when
    its role is the one being generated (assistant, or the last role when not adding a new turn)."""
    if not req.get("echo"):
        return ""
    last = req["messages"][-1]
    role = "assistant" if req.get("add_generation_prompt", True) and not req.get("continue_final_message") \
        else last["role"]
    return last["content"] if last["role"] == role else ""


def fim_tokens(tokenizer) -> tuple[int, int, int] | None:
    """(prefix, suffix, middle) token ids when the vocabulary has fill-in-the-middle tokens, else None."""
    for names in FIM_TOKENS:
        ids = tuple(tokenizer.token_to_id(n) for n in names)
        if None not in ids:
            return ids
    return None


def completion_prompt_ids(tokenizer, prompt: str | list[int], suffix: str | None, vocab_size: int,
                          param: str = "prompt") -> list[int]:
    """Token ids of one completions prompt.

    Text is encoded with the tokenizer's special tokens (as vLLM does); an empty prompt becomes the BOS
    token (OpenAI: "as if from the beginning of a new document"). With a suffix, the prompt is the
    prefix-suffix-middle infill layout. Raises ApiError 400 for out-of-vocabulary ids, an empty prompt
    on a model without BOS, and a suffix on a model without infill tokens (param suffix).
    """
    if isinstance(prompt, list):
        bad = next((t for t in prompt if t >= vocab_size), None)
        if bad is not None:
            raise bad_request(f"Token id {bad} in '{param}' is out of range: this model's vocabulary has "
                              f"{vocab_size} tokens.", param)
        ids = list(prompt)
    else:
        ids = tokenizer.encode(prompt, add_special_tokens=True)
    if suffix:
        fim = fim_tokens(tokenizer)
        if fim is None:
            raise bad_request("'suffix' (infill) is not supported by this model: its vocabulary has no "
                              "fill-in-the-middle tokens.", "suffix", code="unsupported_parameter")
        prefix_id, suffix_id, middle_id = fim
        ids = [prefix_id, *ids, suffix_id, *tokenizer.encode(suffix), middle_id]
    if not ids:
        if tokenizer.bos_token_id is None:
            raise bad_request("The prompt is empty and this model has no beginning-of-text token.", param)
        ids = [tokenizer.bos_token_id]
    return ids
