"""The front door (/) and the playground page, rendered in-process: what they say about the served model
and this server's routes, for auth on and off."""
from __future__ import annotations

import threading

import pytest

pytestmark = pytest.mark.django_db
# What a browser asks for (a client probing for Ollama asks for anything else and gets "Ollama is running").
BROWSER = {"HTTP_ACCEPT": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}


def test_the_front_door_shows_the_model_its_state_and_the_routes(client, fake_rt):
    r = client.get("/", **BROWSER)
    assert r.status_code == 200 and r["content-type"].startswith("text/html")
    html = r.content.decode()
    assert "smollm2-135m-instruct" in html
    assert 'id="state">ready<' in html
    for route in ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/models/{model_id}",
                  "/health/live", "/metrics", "/api/chat", "/api/tags"):
        assert f"<code>{route}</code>" in html
    assert "not_implemented" not in html and "/v1/moderations" not in html  # 501s are not served routes
    assert 'base_url="http://testserver/v1"' in html  # the address this page was reached at
    assert "curl http://testserver/v1/chat/completions" in html
    for link in ('href="/playground"', 'href="/admin/"', 'href="/metrics"'):
        assert link in html


def test_the_front_door_says_when_keys_are_needed(client, fake_rt, require_auth):
    html = client.get("/", **BROWSER).content.decode()
    assert 'api_key="YOUR_KEY"' in html and "Authorization: Bearer $METRALE_API_KEY" in html


def test_the_front_door_shows_a_loading_model(client, no_model_loading):
    gate = threading.Event()
    no_model_loading.loader.gate = gate
    no_model_loading.load(no_model_loading.default().name)  # a load under way until the gate opens
    try:
        r = client.get("/", **BROWSER)
    finally:
        gate.set()
    assert r.status_code == 200
    assert 'id="state">loading<' in r.content.decode()


def test_the_pages_take_only_get_and_head(client, fake_rt):
    assert client.head("/").status_code == 200
    assert client.post("/").status_code == 405
    assert client.post("/playground").status_code == 405


def test_the_playground_asks_a_visitor_for_a_key_only_when_needed(client, fake_rt, settings):
    assert 'id="api-key"' not in client.get("/playground").content.decode()
    settings.METRALE = {**settings.METRALE, "REQUIRE_AUTH": True}
    html = client.get("/playground").content.decode()
    assert 'id="api-key"' in html and 'name="csrf-token"' in html


def test_the_dashboard_page_is_for_staff_only(client, fake_rt):
    from django.contrib.auth import get_user_model

    r = client.get("/admin/dashboard/")
    assert r.status_code == 302 and r["Location"].startswith("/admin/login/")
    users = get_user_model().objects
    client.force_login(users.create_user("visitor", password="a-long-passphrase-9"))
    assert client.get("/admin/dashboard/").status_code == 302
    client.force_login(users.create_user("op", password="a-long-passphrase-9", is_staff=True))
    r = client.get("/admin/dashboard/")
    assert r.status_code == 200
    html = r.content.decode()
    assert 'data-websocket-path="/ws/admin/dashboard/"' in html and "console/dashboard.js" in html
    assert 'href="/admin/dashboard/">Dashboard</a>' in client.get("/admin/").content.decode()  # linked from the admin
