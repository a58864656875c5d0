"""Render HF chat templates (sandboxed Jinja2) exactly as transformers' `apply_chat_template` does.

The environment mirrors transformers' `utils/chat_template_utils.py`
(`_compile_jinja_template`): ImmutableSandboxedEnvironment with trim_blocks and
lstrip_blocks, the loopcontrols extension, a `{% generation %}` tag, a `tojson`
filter that does not HTML-escape, and the globals `raise_exception` and
`strftime_now`.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import ClassVar

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """A chat template that does not compile, or fails (raise_exception too) while rendering."""


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` renders its body unchanged.

    transformers uses the tag to find assistant tokens for training masks; a
    server only needs templates that use it to render.
    """

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers' override: Jinja's own tojson HTML-escapes <, >, & and '.
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format):
    return datetime.now().strftime(format)


@lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    """The compiled template for `source` (cached). Raises ChatTemplateError on a syntax error."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateError as exc:
        raise ChatTemplateError(f"chat template does not compile: {exc}") from exc


def render_chat_template(
    source: str,
    messages: list[dict],
    tools: list[dict] | None = None,
    documents: list[dict] | None = None,
    add_generation_prompt: bool = True,
    **kwargs,
) -> str:
    """The prompt text for `messages` under the template `source`.

    kwargs become template variables too (bos_token, eos_token, enable_thinking,
    documents, ...). Raises ChatTemplateError when the template fails: a Jinja
    error, raise_exception() from the template, or a type error from the
    messages (e.g. `None + str` on a missing content), so callers can answer 400.
    """
    template = compile_template(source)
    try:
        return template.render(
            messages=messages,
            tools=tools,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            **kwargs,
        )
    except jinja2.exceptions.TemplateError as exc:
        raise ChatTemplateError(f"chat template error: {exc}") from exc
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
        raise ChatTemplateError(f"chat template failed on these messages: {exc}") from exc
