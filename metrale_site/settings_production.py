"""Production settings: the defaults plus auth required, DEBUG off, a real SECRET_KEY, and HTTPS at the load balancer.

settings.py reads the services from the environment under the same names: `DATABASE_URL`
(PostgreSQL), `REDIS_URL` (the cache: shared rate limits; and the channel layer, settings.py's one
CHANNEL_LAYERS: its reads outlast channels-redis' blocking waits),
`CELERY_BROKER_URL` (Redis or RabbitMQ: batches run on `manage.py batch_worker`),
`DJANGO_ALLOWED_HOSTS` and `DJANGO_SECRET_KEY`. TLS ends at the load balancer, which sets
`X-Forwarded-Proto` (SECURE_PROXY_SSL_HEADER trusts it); plain-HTTP requests without it are
redirected to HTTPS, but /health and /health/live (the balancer's probes) and what a router in front
(vllm-router, sglang-router) calls by itself: /get_server_info, /server_info, /get_model_info,
/model_info, /kv_event_sources, /get_load, /health_generate, /flush_cache and the render routes, which it
sends without the client's X-Forwarded-Proto (inference/http/worker_views.py). `manage.py check
--deploy` is clean with these settings. Run with DJANGO_SETTINGS_MODULE=metrale_site.settings_production.
"""
from django.core.exceptions import ImproperlyConfigured

from .env import envbool, envint, envlist, envstr
from .settings import *  # noqa: F401,F403
from .settings import METRALE, STORAGES

DEBUG = envbool("DJANGO_DEBUG", False)

SECRET_KEY = envstr("DJANGO_SECRET_KEY")
if not SECRET_KEY:
    raise ImproperlyConfigured("DJANGO_SECRET_KEY must be set in production (it salts the "
                               "prefix cache per tenant and signs admin sessions).")

# Only the files `collectstatic` gathered, under content-hashed names with gzip/brotli copies.
STORAGES = {**STORAGES, "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"}}
WHITENOISE_USE_FINDERS = False

METRALE["REQUIRE_AUTH"] = envbool("METRALE_REQUIRE_AUTH", True)

# HTTPS is terminated by the load balancer in front; only it may reach the replicas.
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = envbool("DJANGO_SECURE_SSL_REDIRECT", True)
SECURE_REDIRECT_EXEMPT = [r"^health(/live|_generate)?$",
                          r"^((get_)?server_info|(get_)?model_info|kv_event_sources|get_load|flush_cache)$",
                          r"^v1/(chat/)?completions/render$"]
SECURE_HSTS_SECONDS = envint("DJANGO_HSTS_SECONDS", 31_536_000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = envbool("DJANGO_HSTS_INCLUDE_SUBDOMAINS", True)
SECURE_HSTS_PRELOAD = envbool("DJANGO_HSTS_PRELOAD", True)
CSRF_TRUSTED_ORIGINS = envlist("DJANGO_CSRF_TRUSTED_ORIGINS")

# Admin cookies only over HTTPS; set DJANGO_SECURE_COOKIES=0 to reach the admin over plain HTTP
# (e.g. on 127.0.0.1 through an SSH tunnel).
SESSION_COOKIE_SECURE = envbool("DJANGO_SECURE_COOKIES", True)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
