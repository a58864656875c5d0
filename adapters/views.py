"""vLLM's runtime LoRA routes: POST /v1/load_lora_adapter and /v1/unload_lora_adapter (operators only, behind a flag).

Shapes from vLLM (`entrypoints/serve/lora`): load takes {lora_name, lora_path, load_inplace?},
unload {lora_name, lora_int_id?}; an adapter belongs to its base model: the chat model the body's
`model` names (Metrale's field; default: the default chat model); success is 200 with a plain-text body; a missing field or a
taken name is a 400, no adapter at the path or an unknown name a 404. The routes answer 404 as
unknown URLs unless METRALE_ALLOW_RUNTIME_LORA is on (vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING).
"""
from __future__ import annotations

from django.conf import settings
from django.http import HttpResponse

from inference.http.api import operator_endpoint
from inference.serving.errors import ApiError, bad_request, not_found
from inference.serving.json_body import parse_json_body
from inference.http.views import allow, hold_model
from inference.operations.registry import process_registry

from . import registry


def _body(request) -> dict:
    if not settings.METRALE.get("ALLOW_RUNTIME_LORA"):
        raise not_found(f"Unknown request URL: {request.method} {request.path}. Runtime LoRA loading is off "
                        "(METRALE_ALLOW_RUNTIME_LORA).", code="unknown_url")
    return parse_json_body(request.body)


def _string(body: dict, field: str) -> str:
    value = body.get(field)
    if value is None or value == "":
        raise bad_request(f"'{field}' is required.", param=field, code="missing_required_parameter")
    if not isinstance(value, str):
        raise bad_request(f"'{field}' must be a string.", param=field, code="invalid_type")
    return value


def _answer(refusal: registry.AdapterRefused, param: str) -> ApiError:
    if refusal.status == 404:
        return not_found(str(refusal), param=param, code="lora_adapter_not_found")
    return bad_request(str(refusal), param=param)


async def _base_model(body: dict):
    """A Hold on the chat model the adapter belongs to: the body's `model` (Metrale's field beside vLLM's;
    default: the default chat model), loaded first if needed. Raises ApiError (404 unknown model, 503)."""
    model = body.get("model") or ""
    if not isinstance(model, str):
        raise bad_request("'model' must be a string.", param="model", code="invalid_type")
    return await hold_model(process_registry(), model)


def _text(message: str) -> HttpResponse:
    return HttpResponse(message, content_type="text/plain; charset=utf-8")


@operator_endpoint
@allow("POST")
async def load_lora_adapter(request):
    """POST /v1/load_lora_adapter {lora_name, lora_path, load_inplace?}: answers once the weights are resident."""
    body = _body(request)
    name, path = _string(body, "lora_name"), _string(body, "lora_path")
    inplace = body.get("load_inplace", False)
    if not isinstance(inplace, bool):
        raise bad_request("'load_inplace' must be a boolean.", param="load_inplace", code="invalid_type")
    hold = await _base_model(body)
    try:
        await registry.load(hold.model, name, path, replace=inplace)
    except registry.AdapterRefused as refusal:
        raise _answer(refusal, "lora_path" if refusal.status == 404 else "lora_name") from None
    finally:
        hold.release()
    return _text(f"Success: LoRA adapter '{name}' added successfully.")


@operator_endpoint
@allow("POST")
async def unload_lora_adapter(request):
    """POST /v1/unload_lora_adapter {lora_name}: new requests 404 at once; its requests in flight finish."""
    body = _body(request)
    name = _string(body, "lora_name")
    hold = await _base_model(body)
    try:
        await registry.unload(hold.model, name)
    except registry.AdapterRefused as refusal:
        raise _answer(refusal, "lora_name") from None
    finally:
        hold.release()
    return _text(f"Success: LoRA adapter '{name}' removed successfully.")

