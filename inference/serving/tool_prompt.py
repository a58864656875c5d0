"""Tools in the prompt: the chat template renders them, or, when it ignores them, a system section does.

Source: transformers' apply_chat_template (the template receives `tools`; a
template that never reads them renders the conversation without them), and
llama.cpp's chat-template capability probe (render once with a dummy tool and
see whether its name shows up). For a template that ignores tools (SmolLM2's
ChatML template is one), the model is told about them the way Qwen2.5's
template does it, in the Hermes format: a `# Tools` system section listing the
function signatures in `<tools></tools>` and asking for calls as
`<tool_call>{"name": ..., "arguments": ...}</tool_call>`, which is what the
`hermes` tool parser reads back (so such a model gets that parser; see
text_setup.py). Earlier calls are written into their assistant messages the
same way when the template ignores `tool_calls`.
"""
from __future__ import annotations

import json
from functools import lru_cache

from inference.engine.chat_template import ChatTemplateError, render_chat_template

PROBE_NAME = "metrale_probe_function"
_PROBE_TOOL = {"type": "function", "function": {"name": PROBE_NAME, "description": "probe",
                                                 "parameters": {"type": "object", "properties": {}}}}
_PROBE_CALL = {"role": "assistant", "content": "",
               "tool_calls": [{"id": "call_probe", "type": "function",
                               "function": {"name": PROBE_NAME, "arguments": {}}}]}
_USER = {"role": "user", "content": "probe"}


def _renders(chat_template: str | None, messages: list[dict], tools: list[dict] | None) -> bool:
    if not chat_template:
        return False
    try:
        text = render_chat_template(chat_template, messages, tools=tools, add_generation_prompt=False,
                                    bos_token="", eos_token="")
    except ChatTemplateError:
        return False
    return PROBE_NAME in text


@lru_cache(maxsize=16)
def template_renders_tools(chat_template: str | None) -> bool:
    """Whether the template writes the `tools` it is given into the prompt (probed once per template)."""
    return _renders(chat_template, [_USER], [_PROBE_TOOL])


@lru_cache(maxsize=16)
def template_renders_tool_calls(chat_template: str | None) -> bool:
    """Whether the template writes an assistant message's `tool_calls` (else calls vanish from the prompt)."""
    return _renders(chat_template, [_USER, _PROBE_CALL, {"role": "tool", "tool_call_id": "call_probe",
                                                         "content": "ok"}], [_PROBE_TOOL])


def tools_section(tools: list[dict], tool_choice="auto", parallel_tool_calls: bool = True) -> str:
    """The Hermes-format system text describing `tools` (OpenAI chat shape) and how to call them.

    tool_choice "required" or a named function adds that the model must call (one named function);
    parallel_tool_calls false asks for at most one call.
    """
    how_many = "one or more functions" if parallel_tool_calls else "at most one function"
    lines = ["# Tools", "", f"You may call {how_many} to assist with the user query.", "",
             "You are provided with function signatures within <tools></tools> XML tags:", "<tools>"]
    lines += [json.dumps(t, ensure_ascii=False) for t in tools]
    lines += ["</tools>", "",
              "For each function call, return a json object with function name and arguments within "
              "<tool_call></tool_call> XML tags:",
              "<tool_call>", '{"name": <function-name>, "arguments": <args-json-object>}', "</tool_call>"]
    if tool_choice == "required":
        lines += ["", "You must call at least one function."]
    elif isinstance(tool_choice, dict):
        lines += ["", f"You must call the function {tool_choice['function']['name']}."]
    return "\n".join(lines)


def with_tools_section(messages: list[dict], section: str) -> list[dict]:
    """The messages with `section` appended to the leading system message, or as a new one."""
    if messages and messages[0]["role"] == "system" and isinstance(messages[0].get("content"), str):
        first = messages[0]
        content = f"{first['content']}\n\n{section}" if first["content"] else section
        return [{**first, "content": content}, *messages[1:]]
    return [{"role": "system", "content": section}, *messages]


def fold_tool_calls(messages: list[dict]) -> list[dict]:
    """Messages for a template that ignores `tool_calls`: each call is written into its
    assistant message's content as `<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`
    (the Hermes format, which is also what the hermes tool parser reads back), so the model
    still sees the calls it made. Tool messages are kept; templates render their role as is.
    """
    out = []
    for message in messages:
        calls = message.get("tool_calls")
        if not calls:
            out.append(message)
            continue
        written = [
            "<tool_call>\n" + json.dumps({"name": c["function"]["name"],
                                          "arguments": c["function"]["arguments"]},
                                         ensure_ascii=False) + "\n</tool_call>"
            for c in calls
        ]
        content = "\n".join(([message["content"]] if message.get("content") else []) + written)
        out.append({k: v for k, v in message.items() if k != "tool_calls"} | {"content": content})
    return out


def prompt_messages(messages: list[dict], tools: list[dict] | None, tool_choice="auto",
                    parallel_tool_calls: bool = True,
                    chat_template: str | None = None) -> tuple[list[dict], list[dict] | None]:
    """(messages, tools) to render: tools are offered unless tool_choice is "none" (then the prompt
    does not mention them, as vLLM's --exclude-tools-when-tool-choice-none does); a template that
    ignores tools gets the Hermes system section, one that ignores tool_calls gets them folded
    into the assistant messages' content.
    """
    offered = tools if tools and tool_choice != "none" else None
    if any(m.get("tool_calls") for m in messages) and not template_renders_tool_calls(chat_template):
        messages = fold_tool_calls(messages)
    if offered and not template_renders_tools(chat_template):
        messages = with_tools_section(messages, tools_section(offered, tool_choice, parallel_tool_calls))
    return messages, offered
