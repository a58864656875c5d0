"""Thin async views (filled in by the walking skeleton)."""
from django.http import JsonResponse


async def health(request):
    return JsonResponse({"status": "loading"}, status=503)


async def list_models(request):
    return JsonResponse({"object": "list", "data": []})


async def chat_completions(request):
    return JsonResponse({"error": {"message": "not ready", "type": "server_error", "param": None, "code": None}}, status=503)
