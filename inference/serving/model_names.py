"""Which `model` names this server answers to (the served model, its aliases, its LoRA adapters), and OpenAI's Model object.

The served id (METRALE_SERVED_MODEL_NAME, else the model folder's name) and its
aliases (METRALE_MODEL_ALIASES, like vLLM's extra served model names) select the base
model; a loaded adapter's name (or `<served id>:<adapter>`) selects that adapter. Any
other name is a 404 model_not_found, as OpenAI and vLLM answer, unless
METRALE_ACCEPT_ANY_MODEL_NAME is on (then it reaches the base model; off by default:
a client asking for its fine-tune must not silently get the base). An adapter limited
to some tenants is a 404 for the others. Source: OpenAI API reference, "Models"; vLLM's
/v1/models cards of adapters (`root`: the adapter's path, `parent`: the base's id).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from django.conf import settings

from .errors import not_found


@dataclass(frozen=True, slots=True)
class ServedAdapter:
    """A LoRA adapter requests may name: its name, folder, when it was loaded (Unix seconds), its
    fingerprint part, and the prefix-cache salts of the tenants allowed to use it (None: all)."""

    name: str
    path: str
    created: int
    digest: str = ""
    allowed_salts: frozenset[str] | None = None

    def allows(self, cache_salt: str) -> bool:
        return self.allowed_salts is None or cache_salt in self.allowed_salts


def served_names(model_id: str) -> list[str]:
    """The served id followed by its aliases: METRALE_MODEL_ALIASES, then those made while the process runs
    (Ollama's /api/copy: operations/registry.ModelRegistry.alias)."""
    from inference.operations.registry import process_registry

    made = process_registry().aliases_of(model_id)
    return [model_id, *[a for a in [*(settings.METRALE.get("MODEL_ALIASES") or []), *made] if a != model_id]]


def check_model(requested: str, model_id: str, adapters: Mapping[str, ServedAdapter] | None = None,
                cache_salt: str = "") -> str | None:
    """The adapter a request's `model` selects (its name), or None for the base model.

    An empty name is the base model. Raises ApiError 404 (code model_not_found, param model) for a
    name this server does not serve to this tenant (`cache_salt`: its prefix-cache salt)."""
    adapters = adapters or {}
    names = served_names(model_id)
    if not requested or requested in names:
        return None
    base, sep, tail = requested.partition(":")
    name = tail if sep and base in names else requested
    adapter = adapters.get(name)
    if adapter is not None and adapter.allows(cache_salt):
        return name
    if adapter is None and settings.METRALE.get("ACCEPT_ANY_MODEL_NAME"):
        return None
    served = names + [n for n, a in adapters.items() if a.allows(cache_salt)]
    raise not_found(f"The model '{requested}' does not exist or you do not have access to it. This server "
                    f"serves {', '.join(repr(n) for n in served)}.", code="model_not_found", param="model")


def model_object(name: str, created: int, *, root: str | None = None, parent: str | None = None,
                 max_model_len: int | None = None) -> dict:
    """OpenAI's Model object, with vLLM's `root` (the folder) and `parent` (an adapter's base id)."""
    card = {"id": name, "object": "model", "created": created, "owned_by": "metrale", "root": root, "parent": parent}
    if max_model_len is not None:
        card["max_model_len"] = max_model_len
    return card


def model_cards(model_id: str, created: int, root: str, adapters: Mapping[str, ServedAdapter], cache_salt: str = "",
                max_model_len: int | None = None) -> list[dict]:
    """GET /v1/models: the served id, then each adapter this tenant may use (parent: the served id)."""
    cards = [model_object(model_id, created, root=root, max_model_len=max_model_len)]
    cards += [model_object(a.name, a.created, root=a.path, parent=model_id, max_model_len=max_model_len)
              for a in adapters.values() if a.allows(cache_salt)]
    return cards


def find_model(name: str, model_id: str, created: int, root: str | None = None,
               adapters: Mapping[str, ServedAdapter] | None = None, cache_salt: str = "") -> dict:
    """GET /v1/models/{name}: the Model object for the served id, an alias or an adapter. Raises ApiError 404."""
    if name in served_names(model_id):
        return model_object(name, created, root=root)
    adapter = (adapters or {}).get(name)
    if adapter is not None and adapter.allows(cache_salt):
        return model_object(name, adapter.created, root=adapter.path, parent=model_id)
    raise not_found(f"The model '{name}' does not exist.", code="model_not_found", param="model")


def unknown_model(requested: str, registry, cache_salt: str = "", kind: str = "chat"):
    """The ApiError 404 (model_not_found, param model) for a `model` no configured model, alias or adapter
    answers to, naming it and the models this server serves on the route (`kind`: "chat" or "embedding";
    registry: operations/registry.ModelRegistry), the adapters this tenant may use among them."""
    names = registry.names(kind)
    if kind == "chat":
        names += [a for a in settings.METRALE.get("MODEL_ALIASES") or [] if a not in names]
        for entry, rt in registry.loaded_models("chat"):
            names += [n for n, a in getattr(rt, "adapters", {}).items() if a.allows(cache_salt)]
    served = ", ".join(repr(n) for n in names) or "none"
    what = "does not exist or is not an embedding model" if kind == "embedding" else "does not exist or you do not have access to it"
    hint = " (set METRALE_MODELS or METRALE_EMBEDDING_MODEL)" if kind == "embedding" and not names else ""
    return not_found(f"The model '{requested}' {what}. This server serves {served}{hint}.",
                     code="model_not_found", param="model")


def wrong_kind(name: str, kind: str, registry):
    """The ApiError 400 for a served model of the other kind: a chat model on /v1/embeddings
    (model_not_embedding), an embedding model on a generating route (model_not_chat)."""
    from .errors import ApiError

    if kind == "embedding":
        served = ", ".join(repr(n) for n in registry.names("embedding")) or "none (set METRALE_EMBEDDING_MODEL)"
        return ApiError(400, f"The model '{name}' is a generation model; /v1/embeddings serves the embedding "
                             f"models: {served}.", param="model", code="model_not_embedding")
    served = ", ".join(repr(n) for n in registry.names("chat")) or "none"
    return ApiError(400, f"The model '{name}' is an embedding model; this route serves the chat models: {served}.",
                    param="model", code="model_not_chat")
