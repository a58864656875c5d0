"""The `glm47` tool parser: poolside_v1's wire format under the fail-closed call policy (GLM).

Source: the original server's behaviour doc, section 4, "Fail-closed
(`CallPolicy::FailClosed`, glm47 only)":
- only `<tool_call>` envelopes are calls; nothing is repaired, dropped, or
  turned into content; each envelope, including one cut off at the end or
  abandoned for another, yields exactly one verdict, in order;
- accept when the name resolves (an exact offered name, or the longest offered
  name that prefixes it and is not followed by a name character: `bash</x>` ->
  bash, `bash1635` -> none) and every key is a parameter (or the tool declares
  none); values stay strings unless the schema types them;
- otherwise refuse: the call is delivered under the resolved name (else the
  emitted name if name-shaped, else `unknown_tool`) with the single argument
  `{"_rejected_by_server": "<reason>"}`, the reason naming the valid parameters.
A bare `<tool_call>NAME</tool_call>` has no keys outside the schema, so it is
accepted as a zero-argument call (GLM's own spelling of one).
Not ported: the early header and the 5 s empty-arguments keep-alive while a
call is open (this parser sends a call when it closes).
"""
from __future__ import annotations

import re

from .base import ParsedCall, ParseResult
from .poolside_v1 import PoolsideV1ToolParser, read_arg_envelope
from .schema import type_raw_value

_NAME_SHAPED = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_NAME_CHAR = re.compile(r"[A-Za-z0-9_.\-]")
REJECTED_KEY = "_rejected_by_server"
_SHOWN_CHARS = 200   # how much of a broken call its refusal spells out


def resolve_tool_name(emitted: str, offered: tuple[str, ...]) -> str | None:
    """The offered tool an emitted name means (fail-closed rule: exact, else longest prefix)."""
    if emitted in offered:
        return emitted
    best = None
    for name in offered:
        if emitted.startswith(name) and not _NAME_CHAR.match(emitted, len(name)) \
                and (best is None or len(name) > len(best)):
            best = name
    return best


class Glm47ToolParser(PoolsideV1ToolParser):
    """Every `<tool_call>` envelope becomes one delivered call: accepted, or refused (a reason)."""

    name = "glm47"

    def _parse(self, region: str) -> ParseResult:
        env = read_arg_envelope(region)
        offered = self.schemas.allowed
        name = resolve_tool_name(env.raw_name, offered)
        if name is None:
            return self._refuse(env.raw_name, None,
                                f'tool "{env.raw_name}" is not offered; the offered tools are: '
                                f'{", ".join(offered) or "none"}')
        props = self.schemas.properties(name)
        if not env.closed:
            return self._refuse(env.raw_name, name, "the call was abandoned for another "
                                f"<tool_call> before it closed: {_shown(region)}")
        if env.error:
            return self._refuse(env.raw_name, name, f"{env.error} in {_shown(region)}")
        for key, _ in env.pairs:
            if props and key not in props:
                return self._refuse(env.raw_name, name,
                                    f'argument "{key}" is not a parameter of {name}')
        arguments = {k: type_raw_value(v, props.get(k), untyped="string", unwrap_json_string=False)
                     for k, v in env.pairs}
        return [ParsedCall(name, arguments)]

    def _truncated(self, region: str, out: list) -> None:
        self._call_boundary()
        env = read_arg_envelope(region)
        name = resolve_tool_name(env.raw_name, self.schemas.allowed)
        refused = self._refuse(env.raw_name, name,
                               f"the call was cut off before </tool_call>: {_shown(region)}")
        for call in refused:
            self._accept(call, out)

    def _refuse(self, emitted: str, resolved: str | None, reason: str) -> list[ParsedCall]:
        if resolved is not None:
            params = ", ".join(self.schemas.properties(resolved)) or "none"
            reason = f"{reason}; its parameters are: {params}"
            name = resolved
        elif _NAME_SHAPED.fullmatch(emitted) and len(emitted.encode()) <= 64:
            name = emitted
        else:
            name = "unknown_tool"
        return [ParsedCall(name, {REJECTED_KEY: reason}, refused=True)]


def _shown(region: str) -> str:
    return region if len(region) <= _SHOWN_CHARS else region[:_SHOWN_CHARS] + "..."
