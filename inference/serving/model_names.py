"""Which `model` names this server answers to, and OpenAI's Model object.

The served id (METRALE_SERVED_MODEL_NAME, else the model folder's name) and its
aliases (METRALE_MODEL_ALIASES, like vLLM's extra served model names) always
match; any other name is a 404 model_not_found unless METRALE_ACCEPT_ANY_MODEL_NAME
is on (the default, as llama.cpp's server does, so clients with a hard-coded
model name work). Source: OpenAI API reference, "Models".
"""
from __future__ import annotations

from django.conf import settings

from .errors import not_found


def served_names(model_id: str) -> list[str]:
    """The served id followed by its aliases."""
    return [model_id, *[a for a in settings.METRALE.get("MODEL_ALIASES") or [] if a != model_id]]


def check_model(requested: str, model_id: str) -> None:
    """Raises ApiError 404 (code model_not_found, param model) for a name this server does not serve.
    An empty name is accepted (the one model served)."""
    if not requested or settings.METRALE.get("ACCEPT_ANY_MODEL_NAME") or requested in served_names(model_id):
        return
    raise not_found(f"The model '{requested}' does not exist or you do not have access to it. This server "
                    f"serves {', '.join(repr(n) for n in served_names(model_id))}.",
                    code="model_not_found", param="model")


def model_object(name: str, created: int) -> dict:
    """OpenAI's Model object."""
    return {"id": name, "object": "model", "created": created, "owned_by": "metrale"}


def find_model(name: str, model_id: str, created: int) -> dict:
    """GET /v1/models/{name}: the Model object for the served id or an alias. Raises ApiError 404."""
    if name not in served_names(model_id):
        raise not_found(f"The model '{name}' does not exist.", code="model_not_found", param="model")
    return model_object(name, created)
