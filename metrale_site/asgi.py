"""ASGI entry point: a channels ProtocolTypeRouter whose `http` is Django's ASGI app.

Starting the server (daphne imports this module) also starts loading the model in
a background thread, so `/health` answers 503 "loading" until it is ready.
"""
import os

from channels.routing import ProtocolTypeRouter
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "metrale_site.settings")

django_asgi_app = get_asgi_application()

from django.conf import settings  # noqa: E402

from inference import runtime  # noqa: E402

if settings.METRALE["LOAD_ON_START"]:
    runtime.start_loading()

application = ProtocolTypeRouter({"http": django_asgi_app})
