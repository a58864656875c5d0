"""Chat template rendering: as transformers' apply_chat_template; failures as ChatTemplateError."""

import pytest

from inference.engine.chat_template import ChatTemplateError, render_chat_template
from inference.engine.tokenizer import Tokenizer

CONVERSATIONS = {
    "user only": [{"role": "user", "content": "Hi!"}],
    "system and user": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2?"},
    ],
    "multi-turn": [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi! How can I help?"},
        {"role": "user", "content": "Tell me a joke about café ☕ and 日本."},
    ],
    "ends with assistant": [
        {"role": "user", "content": "Say yes"},
        {"role": "assistant", "content": "yes"},
    ],
}

# Exercises what real tool-calling templates use: tojson, tools, namespace, loop controls,
# raise_exception, generation tags, extra kwargs.
FEATURE_TEMPLATE = """
{%- set ns = namespace(n=0) -%}
{%- if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>
{% endif -%}
{%- for m in messages %}
  {%- if m['role'] not in ['system', 'user', 'assistant', 'tool'] %}
    {{- raise_exception('bad role ' + m['role']) }}
  {%- endif %}
  {%- if m['role'] == 'tool' %}{% continue %}{% endif %}
  {%- set ns.n = ns.n + 1 %}
<|im_start|>{{ m['role'] }}
{% generation %}{{ m['content'] }}{% endgeneration %}<|im_end|>
{% endfor -%}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}<think>

</think>
{% endif %}{% endif %}{{ ns.n }}{{ bos_token }}
"""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather <now> & 'here'",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def ours(smollm2_dir):
    return Tokenizer.from_folder(smollm2_dir)


@pytest.fixture(scope="module")
def featured(smollm2_dir):
    tokenizer = Tokenizer.from_folder(smollm2_dir)
    tokenizer.chat_template = FEATURE_TEMPLATE
    return tokenizer


@pytest.fixture(scope="module")
def hf(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_it_renders_smollm2_like_transformers(name, add_generation_prompt, ours, hf):
    messages = CONVERSATIONS[name]
    expected = hf.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert (
        ours.apply_chat_template(messages, add_generation_prompt=add_generation_prompt) == expected
    )


@pytest.mark.parametrize("kwargs", [{}, {"enable_thinking": False}, {"enable_thinking": True}])
@pytest.mark.parametrize("tools", [None, TOOLS])
def test_it_renders_template_features_like_transformers(tools, kwargs, featured, hf):
    messages = CONVERSATIONS["multi-turn"] + [{"role": "tool", "content": "sunny"}]
    expected = hf.apply_chat_template(
        messages,
        tools=tools,
        tokenize=False,
        add_generation_prompt=True,
        chat_template=FEATURE_TEMPLATE,
        **kwargs,
    )
    assert featured.apply_chat_template(messages, tools=tools, **kwargs) == expected
    if tools:
        assert "<now> & 'here'" in expected  # tojson does not HTML-escape


def test_it_encodes_a_chat_with_its_special_tokens_whole(ours):
    ids = ours.encode_chat([{"role": "user", "content": "Hi"}])
    assert ids[0] == ours.token_to_id("<|im_start|>")
    assert ours.decode(ids, skip_special_tokens=False).endswith("<|im_start|>assistant\n")


def test_it_raises_chat_template_error_for_raise_exception():
    with pytest.raises(ChatTemplateError, match="bad role robot"):
        render_chat_template(FEATURE_TEMPLATE, [{"role": "robot", "content": "beep"}])


def test_it_raises_chat_template_error_for_a_syntax_error():
    with pytest.raises(ChatTemplateError, match="does not compile"):
        render_chat_template("{% for m in messages %}{{ m['content'] }", [])


def test_it_raises_chat_template_error_for_messages_the_template_cannot_take(ours):
    with pytest.raises(ChatTemplateError):
        ours.apply_chat_template([{"role": "user", "content": None}])


def test_it_raises_chat_template_error_for_a_sandbox_escape():
    with pytest.raises(ChatTemplateError):
        render_chat_template("{{ messages.__class__.__mro__[1].__subclasses__() }}", [])


def test_it_raises_chat_template_error_without_a_template(ours):
    bare = Tokenizer(ours.backend, {}, {})
    with pytest.raises(ChatTemplateError, match="no chat template"):
        bare.apply_chat_template([{"role": "user", "content": "x"}])


def test_it_offers_strftime_now():
    assert len(render_chat_template("{{ strftime_now('%Y') }}", [])) == 4
