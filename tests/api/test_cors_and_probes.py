"""CORS on the API routes (django-cors-headers: any origin by default, METRALE_CORS_ORIGINS narrows, never
the pages), the preflight of /v1/chat/completions, and the liveness probe beside /health."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from corsheaders.conf import conf as cors_conf

from inference.bench.live_server import ROOT

pytestmark = pytest.mark.django_db

PREFLIGHT = {"HTTP_ORIGIN": "https://app.example.com", "HTTP_ACCESS_CONTROL_REQUEST_METHOD": "POST",
             "HTTP_ACCESS_CONTROL_REQUEST_HEADERS": "authorization, content-type, x-stainless-os"}


def test_it_answers_the_chat_preflight_with_the_cors_headers(client):
    r = client.options("/v1/chat/completions", **PREFLIGHT)
    assert r.status_code in (200, 204)
    assert r["access-control-allow-origin"] == "*"
    assert "POST" in r["access-control-allow-methods"]
    allowed = {h.strip() for h in r["access-control-allow-headers"].split(",")}
    assert {"authorization", "content-type", "x-stainless-os"} <= allowed
    assert "access-control-allow-credentials" not in r  # keys, never this site's cookies


def test_it_adds_cors_headers_to_api_answers_and_errors(client, fake_rt, require_auth):
    r = client.get("/v1/models", HTTP_ORIGIN="https://app.example.com")
    assert r.status_code == 401  # no key: the error still carries the headers, so the app can read it
    assert r["access-control-allow-origin"] == "*"
    assert "x-request-id" in r["access-control-expose-headers"]


@pytest.mark.parametrize("path", ["/admin/login/", "/", "/playground"])
def test_it_never_makes_the_pages_cross_origin(client, path):
    r = client.get(path, HTTP_ORIGIN="https://app.example.com")
    assert "access-control-allow-origin" not in r
    r = client.options(path, **PREFLIGHT)
    assert "access-control-allow-origin" not in r


def test_it_narrows_to_the_configured_origins(client, settings, monkeypatch):
    settings.CORS_ALLOW_ALL_ORIGINS = False
    settings.CORS_ALLOWED_ORIGINS = ["https://app.example.com"]
    r = client.options("/v1/chat/completions", **PREFLIGHT)
    assert r["access-control-allow-origin"] == "https://app.example.com"
    r = client.options("/v1/chat/completions", **{**PREFLIGHT, "HTTP_ORIGIN": "https://evil.example"})
    assert "access-control-allow-origin" not in r


@pytest.mark.parametrize("value, expected", [("", (True, [])), (
    "https://a.example, https://b.example", (False, ["https://a.example", "https://b.example"]))])
def test_it_reads_the_origins_setting(value, expected):
    code = "from django.conf import settings as s; print(repr((s.CORS_ALLOW_ALL_ORIGINS, s.CORS_ALLOWED_ORIGINS)))"
    env = {**os.environ, "METRALE_CORS_ORIGINS": value, "DJANGO_SETTINGS_MODULE": "metrale_site.settings"}
    out = subprocess.run([sys.executable, "manage.py", "shell", "-c", code], cwd=ROOT, env=env, check=True,
                         capture_output=True, text=True).stdout
    assert out.strip().splitlines()[-1] == repr(expected)
    assert cors_conf.CORS_URLS_REGEX == r"^/(v1|api)(/.*)?$"


def test_it_is_live_while_the_model_loads(client, monkeypatch):
    assert client.get("/health").status_code == 503  # the test's registry: nothing loaded
    r = client.get("/health/live")
    assert r.status_code == 200 and r.json() == {"status": "live"}
    assert client.head("/health/live").status_code == 200
    assert client.post("/health/live").status_code == 405


def test_it_is_live_while_draining(monkeypatch):
    from metrale_site import drain

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"live"})

    monkeypatch.setattr(drain, "draining", lambda: True)
    sent = []

    async def send(message):
        sent.append(message)

    import asyncio

    gated = drain.gate(app)
    asyncio.run(gated({"type": "http", "path": "/health/live"}, None, send))
    asyncio.run(gated({"type": "http", "path": "/health"}, None, send))
    assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [200, 503]


ORIGIN = {"origin": "https://app.example.com"}


def cors_of(headers: dict) -> dict:
    return {k: v for k, v in headers.items() if k.startswith("access-control-") or k == "vary"}


def test_the_guards_own_answers_carry_the_same_cors_headers_as_djangos(client, fake_rt, settings):
    from .fake_engine import call

    settings.METRALE = {**settings.METRALE, "MAX_REQUEST_BYTES": 1000}
    too_large = call("POST", "/v1/chat/completions", raw=b" " * 1001, headers=ORIGIN)
    assert too_large.status == 413  # the guard's answer: Django never saw the request
    django_made = client.get("/v1/models", HTTP_ORIGIN=ORIGIN["origin"])
    expected = cors_of({k.lower(): v for k, v in django_made.headers.items()})
    assert expected["access-control-allow-origin"] == "*" and "x-request-id" in expected["access-control-expose-headers"]
    assert cors_of(too_large.headers) == expected
    unreadable = call("POST", "/v1/messages", raw=b"{}", headers={**ORIGIN, "content-length": "12x"})
    assert unreadable.status == 400 and cors_of(unreadable.headers) == expected
    settings.CORS_ALLOW_ALL_ORIGINS, settings.CORS_ALLOWED_ORIGINS = False, ["https://app.example.com"]
    narrowed = call("POST", "/v1/chat/completions", raw=b" " * 1001, headers=ORIGIN)
    assert narrowed.headers["access-control-allow-origin"] == "https://app.example.com"
    evil = call("POST", "/v1/chat/completions", raw=b" " * 1001, headers={"origin": "https://evil.example"})
    assert "access-control-allow-origin" not in evil.headers


def test_the_drain_503_carries_the_cors_headers_of_its_path(monkeypatch):
    import asyncio

    from metrale_site import drain

    async def app(scope, receive, send):
        raise AssertionError("a draining server runs nothing")

    monkeypatch.setattr(drain, "draining", lambda: True)
    sent = []

    async def send(message):
        sent.append(message)

    gated = drain.gate(app)
    for path in ("/v1/chat/completions", "/admin/"):
        asyncio.run(gated({"type": "http", "method": "POST", "path": path,
                           "headers": [(b"origin", b"https://app.example.com")]}, None, send))
    api, page = [dict((k.decode(), v.decode()) for k, v in m["headers"]) for m in sent
                 if m["type"] == "http.response.start"]
    assert api["access-control-allow-origin"] == "*" and "retry-after" in api["access-control-expose-headers"]
    assert "access-control-allow-origin" not in page  # the pages are never cross-origin
