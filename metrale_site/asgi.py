"""ASGI entry point: a channels ProtocolTypeRouter whose `http` is Django's ASGI app inside the API's ASGI
guard (inference.middleware.ApiAsgiGuard: body size limit, JSON errors, every response ended).

Starting the server (daphne imports this module) also starts loading the model in
a background thread, so `/health` answers 503 "loading" until it is ready.
"""
import os
import sys

from channels.routing import ProtocolTypeRouter
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "metrale_site.settings")

django_asgi_app = get_asgi_application()

# The engine thread gives the GIL up around every torch op and kernel call and needs it back at
# once while this process's event loop serves the streams; CPython lets a waiting thread wait
# up to the switch interval (5 ms by default) before the holder must yield. At 0.5 ms, 32
# streams through HTTP gave 236 tok/s vs 229 (mean of 3 interleaved runs each; SmolLM2, 2 vCPUs).
sys.setswitchinterval(0.0005)

from django.conf import settings  # noqa: E402

from inference import runtime  # noqa: E402
from inference.middleware import ApiAsgiGuard  # noqa: E402

if settings.METRALE["LOAD_ON_START"]:
    runtime.start_loading()

application = ProtocolTypeRouter({"http": ApiAsgiGuard(django_asgi_app)})
