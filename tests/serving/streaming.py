"""Test helpers for streaming parsers: run text split any way, merge deltas by kind, compare splits."""
from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from inference.serving.deltas import Content, Reasoning, ToolCallArgs, ToolCallStart
from inference.serving.text_pipeline import TextPipeline

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"},
            "hot": {"type": "boolean"}, "ratio": {"type": "number"}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "get_time", "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {
        "name": "write_file", "parameters": {"type": "object", "properties": {
            "path": {"type": "string"}, "content": {"type": "string"},
            "options": {"type": "object"}}}}},
]


def counter_ids() -> Callable[[], str]:
    """An id factory giving call_0, call_1, ... (so an id tells its call's index)."""
    n = iter(range(10_000))
    return lambda: f"call_{next(n)}"


def make_pipeline(**kwargs) -> TextPipeline:
    kwargs.setdefault("tools", TOOLS)
    return TextPipeline(id_factory=counter_ids(), **kwargs)


def run(factory: Callable[[], TextPipeline], pieces: Iterable[str]) -> list:
    """All deltas of one pipeline fed `pieces` in order, then finished."""
    pipeline = factory()
    out = []
    for piece in pieces:
        out += pipeline.feed(piece)
    return out + pipeline.finish()


def merge(deltas: list) -> list[tuple]:
    """Deltas as comparable tuples, consecutive text of the same kind (and args of one call) joined."""
    merged: list[list] = []
    for d in deltas:
        if isinstance(d, (Content, Reasoning)):
            kind = "content" if isinstance(d, Content) else "reasoning"
            if merged and merged[-1][0] == kind:
                merged[-1][1] += d.text
            else:
                merged.append([kind, d.text])
        elif isinstance(d, ToolCallStart):
            merged.append(["call", d.index, d.id, d.name])
        elif isinstance(d, ToolCallArgs):
            if merged and merged[-1][0] == "args" and merged[-1][1] == d.index:
                merged[-1][2] += d.fragment
            else:
                merged.append(["args", d.index, d.fragment])
        else:
            merged.append([type(d).__name__, d])
    return [tuple(m) for m in merged]


def assert_split_invariant(factory: Callable[[], TextPipeline], text: str) -> list[tuple]:
    """Every 2-way split and one-char-at-a-time give the unsplit result; returns it, merged."""
    whole = merge(run(factory, [text]))
    for k in range(len(text) + 1):
        got = merge(run(factory, [text[:k], text[k:]]))
        assert got == whole, f"split at {k}: {text[:k]!r} | {text[k:]!r}"
    assert merge(run(factory, list(text))) == whole, "one char at a time"
    for args in (m for m in whole if m[0] == "args"):
        assert isinstance(json.loads(args[2]), dict)
    return whole


def C(text: str) -> tuple:
    return ("content", text)


def R(text: str) -> tuple:
    return ("reasoning", text)


def CALL(index: int, name: str, arguments: dict) -> list[tuple]:
    """The merged form of one delivered call with the counter ids."""
    return [("call", index, f"call_{index}", name),
            ("args", index, json.dumps(arguments, ensure_ascii=False, separators=(",", ":")))]


def smollm2_tokenizer_path() -> Path:
    home = Path(os.environ.get("METRALE_HOME", Path.home() / ".cache" / "metrale"))
    return home / "models" / "smollm2-135m-instruct" / "tokenizer.json"


def token_pieces(tokenizer, text: str) -> list[str]:
    """text split where the tokenizer's tokens split it, each piece decoded from a growing prefix."""
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    pieces, previous = [], ""
    for i in range(len(ids)):
        decoded = tokenizer.decode(ids[:i + 1], skip_special_tokens=False)
        if not decoded.startswith(previous) or decoded.endswith("\ufffd"):
            continue   # an unfinished character: wait for the next token
        pieces.append(decoded[len(previous):])
        previous = decoded
    return pieces
