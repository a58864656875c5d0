"""Tools in the prompt: templates are probed for tool support; the Hermes section and folded calls otherwise."""
import json

from inference.serving.tool_prompt import (fold_tool_calls, prompt_messages, template_renders_tool_calls,
                                           template_renders_tools, tools_section)

CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# A Qwen2.5-style template: tools in the system turn, calls written as <tool_call> JSON.
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}"
    "<|im_end|>\n{% endfor %}")
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}


def test_it_probes_whether_a_template_renders_tools_and_tool_calls():
    assert not template_renders_tools(CHATML) and not template_renders_tool_calls(CHATML)
    assert template_renders_tools(TOOLS_TEMPLATE) and template_renders_tool_calls(TOOLS_TEMPLATE)
    assert not template_renders_tools(None) and not template_renders_tools("{{ raise_exception('no') }}")


def test_a_template_that_ignores_tools_gets_the_hermes_section_in_the_system_message():
    user = [{"role": "user", "content": "hi"}]
    messages, tools = prompt_messages(user, [WEATHER], "auto", True, CHATML)
    assert tools == [WEATHER]
    assert messages[0]["role"] == "system" and messages[0]["content"] == tools_section([WEATHER])
    assert json.dumps(WEATHER) in messages[0]["content"] and messages[1:] == user
    messages, _ = prompt_messages([{"role": "system", "content": "Be brief."}, *user], [WEATHER],
                                  {"type": "function", "function": {"name": "get_weather"}}, False, CHATML)
    assert messages[0]["content"].startswith("Be brief.\n\n# Tools\n\nYou may call at most one function")
    assert messages[0]["content"].endswith("You must call the function get_weather.")


def test_a_template_that_renders_tools_is_left_alone_and_tool_choice_none_offers_none():
    user = [{"role": "user", "content": "hi"}]
    assert prompt_messages(user, [WEATHER], "auto", True, TOOLS_TEMPLATE) == (user, [WEATHER])
    assert prompt_messages(user, [WEATHER], "none", True, CHATML) == (user, None)


def test_calls_are_folded_into_content_only_for_templates_that_ignore_them():
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Checking.", "tool_calls": [CALL]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    assert fold_tool_calls(history)[1] == {
        "role": "assistant",
        "content": 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'}
    assert prompt_messages(history, None, "auto", True, CHATML)[0] == fold_tool_calls(history)
    assert prompt_messages(history, None, "auto", True, TOOLS_TEMPLATE)[0] == history
