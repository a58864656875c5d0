"""Static files through WhiteNoise (metrale_site/static_files.py): the admin's CSS in the default
configuration, and in the production one only what `collectstatic` gathered, hashed and compressed."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from inference.bench.live_server import ROOT
from metrale_site.static_files import AsyncWhiteNoiseMiddleware

pytestmark = pytest.mark.django_db


def test_it_serves_the_admin_stylesheet(client):
    r = client.get("/static/admin/css/base.css")
    assert r.status_code == 200
    assert r["content-type"].startswith("text/css")
    assert b"DJANGO Admin styles" in b"".join(r.streaming_content)


def test_it_serves_the_console_stylesheet_and_404s_the_rest(client):
    assert client.get("/static/console/console.css").status_code == 200
    assert client.get("/static/admin/css/no-such-file.css").status_code == 404


def test_it_is_an_async_middleware():
    assert AsyncWhiteNoiseMiddleware.async_capable and not AsyncWhiteNoiseMiddleware.sync_capable


def _manage(env, *args):
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, check=True,
                          capture_output=True, text=True).stdout


PRODUCTION_CHECK = """
from django.test import Client
from django.templatetags.static import static
url = static("admin/css/base.css")
https = {"x-forwarded-proto": "https"}  # as the load balancer in front says (settings_production)
plain = Client().get(url, headers=https)
gz = Client().get(url, headers={**https, "accept-encoding": "gzip"})
print(__import__("json").dumps({"url": url, "status": plain.status_code, "gz": gz.get("content-encoding"),
                                "cache": plain.get("cache-control")}))
"""


def test_it_serves_only_collected_hashed_files_in_production(tmp_path):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "metrale_site.settings_production",
           "DJANGO_SECRET_KEY": "static-files-test", "DJANGO_STATIC_ROOT": str(tmp_path / "static"),
           "METRALE_SQLITE_PATH": str(tmp_path / "db.sqlite3"), "METRALE_LOAD_ON_START": "0"}
    first = _manage(env, "collectstatic", "--noinput")
    again = _manage(env, "collectstatic", "--noinput")  # idempotent: nothing new the second time
    assert "static files copied" in first and "0 static files copied" in again
    assert (tmp_path / "static" / "staticfiles.json").is_file()
    answer = json.loads(_manage(env, "shell", "-c", PRODUCTION_CHECK).strip().splitlines()[-1])
    assert answer["url"] != "/static/admin/css/base.css" and answer["url"].endswith(".css")  # hashed name
    assert answer["status"] == 200
    assert answer["gz"] in ("gzip", "br")
    assert "immutable" in answer["cache"]  # hashed names are cached for good
