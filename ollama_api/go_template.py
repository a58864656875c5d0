"""Generate's `template`: the part of Go's text/template that prompt templates sent with a request use.

Source: Go's text/template documentation (actions `{{ pipeline }}`, `{{ if }} {{ else }} {{ end }}`,
`{{/* comments */}}`, `{{-` and `-}}` trimming the white space beside them) and Ollama's template variables
(.System, .Prompt, .Suffix, .Response; docs/template.md). A template is rendered with those four values (an
empty one is false in `if`); `.Response` is empty, so the text after it is what the model continues from.
Anything else (`range .Messages`, functions, `with`, variables) is refused with a 400 naming the action:
this server renders whole conversations with the model's own chat template (use /api/chat for those).
"""
from __future__ import annotations

import re

from inference.serving.errors import bad_request

VARIABLES = ("System", "Prompt", "Suffix", "Response")
# How deep `if`s may nest (rendering recurses per level; prompt templates nest two or three).
MAX_IF_DEPTH = 64
_ACTION = re.compile(r"\{\{(-\s)?(.*?)(\s-)?\}\}", re.S)
_FIELD = re.compile(r"\.(\w+)")


def _tokens(template: str) -> list[tuple[str, str]]:
    """("text", text) and ("action", its words) in order, the text beside `{{-` / `-}}` trimmed."""
    out: list[tuple[str, str]] = []
    pos, trim_next = 0, False
    for match in _ACTION.finditer(template):
        text = template[pos:match.start()]
        if trim_next:
            text = text.lstrip()
        if match.group(1):
            text = text.rstrip()
        out.append(("text", text))
        out.append(("action", match.group(2).strip()))
        pos, trim_next = match.end(), bool(match.group(3))
    tail = template[pos:]
    out.append(("text", tail.lstrip() if trim_next else tail))
    if "{{" in tail:
        raise _refused("an action that is never closed with }}")
    return out


def _refused(what: str):
    return bad_request(f"'template' uses {what}; this server renders templates of {{{{ .System }}}}, "
                       "{{ .Prompt }}, {{ .Suffix }}, {{ .Response }} and {{ if }} / {{ else }} / {{ end }} only "
                       "(send whole conversations to /api/chat, which uses the model's own template).", "template")


def _variable(words: str) -> str:
    match = _FIELD.fullmatch(words)
    if match is None or match.group(1) not in VARIABLES:
        raise _refused(f"{{{{ {words[:60]} }}}}")
    return match.group(1)


def _render(tokens: list[tuple[str, str]], i: int, values: dict[str, str], out: list[str] | None,
            depth: int) -> tuple[int, str]:
    """Render from tokens[i] to an `else` / `end` (inside `depth` ifs) or the end (depth 0); text goes to `out`
    (None: a branch not taken). Returns (the index after the stopping action, which action stopped it)."""
    while i < len(tokens):
        kind, value = tokens[i]
        i += 1
        if kind == "text":
            if out is not None:
                out.append(value)
        elif value.startswith("/*") and value.endswith("*/"):
            continue
        elif value in ("else", "end"):
            if not depth:
                raise _refused(f"{{{{ {value} }}}} outside an if")
            return i, value
        elif value.startswith("if "):
            if depth == MAX_IF_DEPTH:
                raise _refused(f"{{{{ if }}}} nested more than {MAX_IF_DEPTH} deep")
            taken = bool(values[_variable(value[3:].strip())])
            i, stop = _render(tokens, i, values, out if taken else None, depth + 1)
            if stop == "else":
                i, stop = _render(tokens, i, values, None if taken or out is None else out, depth + 1)
            if stop != "end":
                raise _refused("an {{ if }} that is never closed with {{ end }}")
        else:
            name = _variable(value)
            if out is not None:
                out.append(values[name])
    return i, ""


def render(template: str, *, system: str = "", prompt: str = "", suffix: str = "") -> str:
    """The prompt text of `template` with .System, .Prompt and .Suffix (and .Response empty). Raises ApiError 400
    (param template) for an action outside the subset in the module doc, one left unclosed, or `if`s nested
    more than MAX_IF_DEPTH deep."""
    values = {"System": system, "Prompt": prompt, "Suffix": suffix, "Response": ""}
    out: list[str] = []
    _render(_tokens(template), 0, values, out, 0)
    return "".join(out)
