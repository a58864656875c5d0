"""The site's URLs plus two probes of where a request's sync code and its request_finished run (tests set
ROOT_URLCONF to this): /probe/loop runs nothing off the event loop, /probe/thread runs a function through
sync_to_async, as the ORM does."""
import threading

from asgiref.sync import sync_to_async
from django.http import JsonResponse
from django.urls import path

from metrale_site.urls import urlpatterns as site_urlpatterns


async def loop_only(request):
    return JsonResponse({"thread": threading.get_ident()})


async def with_sync_code(request):
    return JsonResponse({"thread": await sync_to_async(threading.get_ident)()})


urlpatterns = [
    path("probe/loop", loop_only),
    path("probe/thread", with_sync_code),
    *site_urlpatterns,
]
