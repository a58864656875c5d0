"""GET /metrics: the Prometheus text exposition of inference.operations.metrics (vLLM's series and Metrale's own)."""
from __future__ import annotations

from django.conf import settings
from django.http import HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from prometheus_client import REGISTRY
from prometheus_client.exposition import choose_encoder

from . import metrics  # noqa: F401  (registers the engine collector)
from ..http.api import error_response
from ..tenancy.auth import authenticate_operator
from ..serving.errors import ApiError


@csrf_exempt  # it changes nothing: another method gets its 405 in JSON, not the CSRF page
async def metrics_view(request):
    """GET /metrics: every registered series in Prometheus' text format (OpenMetrics when the
    scraper's Accept asks for it: prometheus_client.exposition.choose_encoder). With
    METRALE["METRICS_AUTH"] only an admin key or a staff session may scrape (401/403 in OpenAI's
    error shape otherwise). Reads plain counters only: no database query, no engine wait."""
    if request.method not in ("GET", "HEAD"):
        error = ApiError(405, f"{request.method} is not allowed on /metrics; use GET.", code="method_not_allowed",
                         headers={"Allow": "GET, HEAD"})
        return JsonResponse(error.body(), status=405, headers=error.headers)
    if settings.METRALE["METRICS_AUTH"]:
        try:
            await authenticate_operator(request)
        except ApiError as error:
            return error_response(error)
    # The format the scraper asks for in Accept (OpenMetrics, or the text format Prometheus reads by default).
    encode, content_type = choose_encoder(request.headers.get("Accept", ""))
    return HttpResponse(encode(REGISTRY), content_type=content_type)
