"""settings.MIDDLEWARE's list type: Django's own middlewares swapped for their async_middleware.py subclasses,
without importing them (the settings load before the apps)."""
from __future__ import annotations

# Django's middleware -> its subclass in async_middleware.py.
REPLACES = {
    "django.middleware.security.SecurityMiddleware": "AsyncSecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware": "AsyncSessionMiddleware",
    "django.middleware.common.CommonMiddleware": "AsyncCommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware": "AsyncCsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware": "AsyncAuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware": "AsyncMessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware": "AsyncXFrameOptionsMiddleware",
}
MODULE = "metrale_site.async_middleware"


class Middleware(list):
    """The dotted paths given, each of Django's middlewares in REPLACES swapped for its subclass; `name in`
    still answers True for a replaced Django path, so the system checks that look for Django's own names
    (security.W001-W003, and the deploy checks they gate: HSTS, nosniff, referrer and opener policies,
    X-Frame-Options) still see them."""

    def __init__(self, paths):
        super().__init__(f"{MODULE}.{REPLACES[p]}" if p in REPLACES else p for p in paths)

    def __contains__(self, path) -> bool:
        return super().__contains__(path) or (path in REPLACES and super().__contains__(f"{MODULE}.{REPLACES[path]}"))
