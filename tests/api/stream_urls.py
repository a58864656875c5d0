"""The site's URLs plus the test-only streaming endpoint (tests set ROOT_URLCONF to this)."""
from django.urls import path

from metrale_site.urls import urlpatterns as site_urlpatterns

from .stream_views import fake_stream, forgetful

urlpatterns = [
    path("v1/test/stream", fake_stream),
    path("v1/test/forgetful", forgetful),
    *site_urlpatterns,
]
