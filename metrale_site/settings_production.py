"""Production settings: the defaults plus auth required, DEBUG off and a real SECRET_KEY.

`DATABASE_URL` (PostgreSQL) and `REDIS_URL` (shared rate limits) are read by settings.py.
Run with DJANGO_SETTINGS_MODULE=metrale_site.settings_production.
"""
from django.core.exceptions import ImproperlyConfigured

from .env import envbool, envstr
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

# Admin cookies only over HTTPS; set DJANGO_SECURE_COOKIES=0 to reach the admin over plain HTTP
# (e.g. on 127.0.0.1 through an SSH tunnel).
SESSION_COOKIE_SECURE = envbool("DJANGO_SECURE_COOKIES", True)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
