"""Views of stored chat completions (list, get, update, messages, delete), scoped to the caller's tenant,
and `by_method`, which gives one URL a view per HTTP method, each through openai_endpoint.

Source: OpenAI API reference, "List Chat Completions", "Get chat completion", "Update chat completion",
"Get chat messages", "Delete chat completion". Another tenant's id is a 404 (inference.stored_objects).
"""
from __future__ import annotations

import re

from django.http import JsonResponse
from rest_framework import serializers

from . import stored_completions as stored
from .api import openai_endpoint
from .serving.errors import ApiError
from .serving.fields import MetadataField
from .serving.protocol import parse_json_body, validate
from .stored_objects import tenant_of

METADATA_FILTER = re.compile(r"metadata\[(.*)\]")


def by_method(**views):
    """One URL's view that hands each HTTP method (GET=..., POST=..., DELETE=...) to its own view;
    another method is a 405 in OpenAI's error shape with an Allow header.

    Each view must itself be an openai_endpoint view (auth, rate limits, errors), and so is the 405:
    the dispatcher is marked `openai_endpoint` (what system check metrale.W002 reads) only when every
    view it dispatches to is, so a method view that skips the wrapper is still caught.
    """
    allowed = ", ".join(views)

    @openai_endpoint
    async def not_allowed(request, *args, **kwargs):
        raise ApiError(405, f"{request.method} is not allowed on {request.path}; use {' or '.join(views)}.",
                       code="method_not_allowed", headers={"Allow": allowed})

    async def dispatch(request, *args, **kwargs):
        return await views.get(request.method, not_allowed)(request, *args, **kwargs)

    dispatch.openai_endpoint = all(getattr(v, "openai_endpoint", False) for v in views.values())
    dispatch.csrf_exempt = all(getattr(v, "csrf_exempt", False) for v in views.values())
    dispatch.method_views = views
    dispatch.__doc__ = " ".join(f"{method}: {v.__doc__}" for method, v in views.items())
    return dispatch


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
