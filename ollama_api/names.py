"""Which served model an Ollama `model` name selects, and Ollama's words when none does.

Source: Ollama's types/model/name.go (names are `[host/][namespace/]model[:tag]`, the tag `latest` by default,
parts compared case-insensitively) and server/routes.go's errors (contracts-wave4 §1.9): 404 `model 'x' not
found` on generate, chat, show and delete; 404 `model "x" not found, try pulling it first` on embed and
embeddings; 404 `model "x" not found` on copy; 400 `"x" does not support chat` (generate, embeddings) for a
model of the other kind. A name is looked up as the registry looks up every surface's (`find`: served names,
aliases, `base:adapter`), its `:latest` tag dropped, then without regard to case.
"""
from __future__ import annotations

import re

from inference.operations.model_specs import CHAT, EMBEDDING
from inference.operations.registry import ModelEntry, ModelRegistry
from inference.serving.errors import ApiError, bad_request

# Each route's not-found wording (module doc).
NOT_FOUND = {"chat": "model '{}' not found", "generate": "model '{}' not found", "show": "model '{}' not found",
             "delete": "model '{}' not found", "embed": 'model "{}" not found, try pulling it first',
             "copy": 'model "{}" not found'}
WHAT = {CHAT: {"chat": "chat", "generate": "generate"}, EMBEDDING: {"embed": "embeddings"}}
# A name a copy may make: Ollama's parts ([host/][namespace/]model[:tag]) in its characters.
VALID_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*(/[A-Za-z0-9][A-Za-z0-9_.\-]*){0,2}(:[A-Za-z0-9_][A-Za-z0-9_.\-]*)?")
MAX_NAME = 200


def untagged(name: str) -> str:
    """`name` without a trailing `:latest` tag (any case): what the registry serves it as."""
    base, sep, tag = name.rpartition(":")
    return base if sep and tag.lower() == "latest" and "/" not in tag else name


def _entry(registry: ModelRegistry, name: str, kind: str | None) -> tuple[ModelEntry | None, str]:
    """(the entry `name` selects, the served name it matched: `name` itself unless only its case differs)."""
    entry = registry.find(name, kind or CHAT)
    if entry is not None:
        return entry, name
    lowered = name.lower()
    served = next((s for s in [*registry.entries, *registry.aliases] if s.lower() == lowered), None)
    return (registry.find(served, kind or CHAT), served) if served is not None else (None, name)


def resolve(registry: ModelRegistry, requested: str, route: str, kind: str | None = None) -> tuple[ModelEntry, str]:
    """(the entry, the name to hand the pipeline) of a request's `model` on `route` (a key of NOT_FOUND) serving
    `kind` (None: either). Raises ApiError 404 (the route's wording) when nothing is served under that name, 400
    `"x" does not support <what>` for a model of the other kind."""
    entry, name = _entry(registry, untagged(requested), kind)
    if entry is None:
        raise ApiError(404, NOT_FOUND[route].format(requested), code="model_not_found", param="model")
    if kind is not None and entry.kind != kind:
        what = WHAT[kind].get(route, route)
        raise bad_request(f'"{requested}" does not support {what}', "model", code="model_wrong_kind")
    return entry, name


def check_new_name(name: str, field: str) -> str:
    """A name a copy may make, untagged. Raises ApiError 400 `<field> "x" is invalid` (Ollama's words)."""
    if len(name) > MAX_NAME or not VALID_NAME.fullmatch(name):
        raise bad_request(f'{field} "{name[:MAX_NAME]}" is invalid', field)
    return untagged(name)
