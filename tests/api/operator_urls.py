"""The site's URLs plus a test-only operator route (tests set ROOT_URLCONF to this)."""
from django.http import JsonResponse
from django.urls import path

from inference.http.api import operator_endpoint
from metrale_site.urls import urlpatterns as site_urlpatterns


@operator_endpoint
async def whoami(request):
    """GET or POST: the operator calling (auth.Operator.name)."""
    return JsonResponse({"operator": request.operator.name})


urlpatterns = [path("v1/test/operator", whoami), *site_urlpatterns]
