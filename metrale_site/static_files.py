"""Static files (the admin's CSS and JavaScript, the console pages' scripts) served by WhiteNoise, async.

WhiteNoise's Django middleware is sync only; in this ASGI stack Django would run it, and with it
every request's view, through its one thread-sensitive executor (one blocking chat request at a
time). This subclass keeps WhiteNoise's file table, headers, compression and caching rules and
only makes the call async: a request under STATIC_URL is answered from the table, any other one
goes on down the stack without a thread hop.
"""
from __future__ import annotations

from asgiref.sync import markcoroutinefunction
from whitenoise.middleware import WhiteNoiseMiddleware


class AsyncWhiteNoiseMiddleware(WhiteNoiseMiddleware):
    """WhiteNoiseMiddleware as an async-only Django middleware (settings.MIDDLEWARE, after
    SecurityMiddleware as WhiteNoise's documentation places it). A file answer is WhiteNoise's own
    response (ETag, Cache-Control, gzip/brotli variants of collected files)."""

    async_capable = True
    sync_capable = False

    def __init__(self, get_response):
        super().__init__(get_response)
        markcoroutinefunction(self)

    async def __call__(self, request):
        if self.autorefresh:
            static_file = self.find_file(request.path_info)
        else:
            static_file = self.files.get(request.path_info)
        if static_file is not None:
            return self.serve(static_file, request)
        return await self.get_response(request)
