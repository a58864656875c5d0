"""Thin async views (filled in by the walking skeleton)."""
from django.http import JsonResponse

from .api import openai_endpoint


async def health(request):
    return JsonResponse({"status": "loading"}, status=503)


@openai_endpoint
async def list_models(request):
    return JsonResponse({"object": "list", "data": []})


@openai_endpoint(generates=True)
async def chat_completions(request):
    return JsonResponse({"error": {"message": "not ready", "type": "server_error", "param": None, "code": None}}, status=503)
