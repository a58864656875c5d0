"""Views of stored chat completions (list, get, update, messages, delete), scoped to the caller's tenant
(their URLs hand each HTTP method to its view with api.by_method).

Source: OpenAI API reference, "List Chat Completions", "Get chat completion", "Update chat completion",
"Get chat messages", "Delete chat completion". Another tenant's id is a 404 (inference.stored.objects).
"""
from __future__ import annotations

import re

from django.http import JsonResponse
from rest_framework import serializers

from . import completions as stored
from ..http.api import openai_endpoint
from ..serving.fields import MetadataField
from ..serving.protocol import parse_json_body, validate
from .objects import tenant_of

METADATA_FILTER = re.compile(r"metadata\[(.*)\]")


class PageQuery(serializers.Serializer):
    """`after`, `limit` (1-100, default 20) and `order` (asc or desc, default asc) of a list query."""

    after = serializers.CharField(required=False, default=None, max_length=200)
    limit = serializers.IntegerField(required=False, default=20, min_value=1, max_value=100)
    order = serializers.ChoiceField(choices=("asc", "desc"), required=False, default="asc")


class ListQuery(PageQuery):
    """The List Chat Completions query: a page, and the `model` filter."""

    model = serializers.CharField(required=False, default=None, max_length=200)


class MetadataBody(serializers.Serializer):
    """`metadata`, required and nullable (null clears it): the Update chat completion body, and the
    list query's metadata filter."""

    metadata = MetadataField(required=True, allow_null=True)


def metadata_filter(query) -> dict[str, str]:
    """The `metadata[key]=value` pairs of a list query (OpenAI's limits: at most 16, keys up to 64
    characters, values up to 512). Raises ApiError 400 naming `metadata`."""
    pairs = {m[1]: value for name, value in query.items() if (m := METADATA_FILTER.fullmatch(name))}
    return validate(MetadataBody, {"metadata": pairs})["metadata"]


@openai_endpoint
async def list_completions(request):
    """GET /v1/chat/completions: a page of the tenant's stored completions (model, metadata[k]=v, after,
    limit, order)."""
    query = validate(ListQuery, request.GET.dict())
    page = await stored.list_chat_completions(
        tenant_of(request), model=query["model"], metadata=metadata_filter(request.GET), after=query["after"],
        limit=query["limit"], order=query["order"])
    return JsonResponse(page)


@openai_endpoint
async def retrieve(request, completion_id: str):
    """GET /v1/chat/completions/{id}: a completion made with `store: true`."""
    return JsonResponse(await stored.get_chat_completion(tenant_of(request), completion_id))


@openai_endpoint
async def update(request, completion_id: str):
    """POST /v1/chat/completions/{id}: replace its metadata."""
    body = validate(MetadataBody, parse_json_body(request.body))
    return JsonResponse(await stored.update_chat_completion(tenant_of(request), completion_id,
                                                            body["metadata"] or {}))


@openai_endpoint
async def delete(request, completion_id: str):
    """DELETE /v1/chat/completions/{id}: delete it."""
    return JsonResponse(await stored.delete_chat_completion(tenant_of(request), completion_id))


@openai_endpoint
async def list_messages(request, completion_id: str):
    """GET /v1/chat/completions/{id}/messages: a page of its request messages (after, limit, order)."""
    query = validate(PageQuery, request.GET.dict())
    page = await stored.list_chat_messages(tenant_of(request), completion_id, after=query["after"],
                                           limit=query["limit"], order=query["order"])
    return JsonResponse(page)
