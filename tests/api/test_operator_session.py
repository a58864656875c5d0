"""A staff user's admin session on the /v1 routes (the playground's credential): it runs as the built-in
operators' tenant, passes Django's CSRF check or gets a 403, and never outranks a bearer key."""
from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from inference.tenancy.auth import OPERATORS_TENANT_NAME
from inference.models import Tenant
from inference.stored.completions import StoredChatCompletion

pytestmark = pytest.mark.django_db

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "store": True}


def session_client(*, staff=True, active=True) -> Client:
    """A test client enforcing CSRF (as a browser meets it), logged in as a new user."""
    user = get_user_model().objects.create_user("op", password="a-long-passphrase-9", is_staff=staff,
                                                is_active=active)
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def csrf_token(client: Client) -> str:
    client.get("/playground")  # the page sets the CSRF cookie it puts in its <meta>
    return client.cookies["csrftoken"].value


def post_chat(client, **headers):
    return client.post("/v1/chat/completions", CHAT, content_type="application/json", headers=headers)


def test_it_runs_a_staff_session_as_the_operators_tenant(fake_rt, require_auth):
    client = session_client()
    r = post_chat(client, **{"X-CSRFToken": csrf_token(client)})
    assert r.status_code == 200, r.content
    operators = Tenant.objects.get(name=OPERATORS_TENANT_NAME)
    assert StoredChatCompletion.objects.get(id=r.json()["id"]).tenant == operators


def test_it_refuses_a_session_call_without_the_csrf_token(fake_rt, require_auth):
    client = session_client()
    csrf_token(client)
    r = post_chat(client)
    assert r.status_code == 403
    assert r.json()["error"]["code"] == "csrf_failed"
    r = post_chat(client, **{"X-CSRFToken": "x" * 32})
    assert r.status_code == 403


def test_it_needs_no_csrf_token_to_read(fake_rt, require_auth):
    r = session_client().get("/v1/models")
    assert r.status_code == 200
    assert r.json()["data"][0]["id"] == "smollm2-135m-instruct"


@pytest.mark.parametrize("user", [{"staff": False}, {"active": False}])
def test_it_ignores_sessions_of_non_staff_or_inactive_users(fake_rt, require_auth, user):
    client = session_client(**user)
    r = post_chat(client, **{"X-CSRFToken": csrf_token(client)})
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "missing_api_key"


def test_a_bearer_key_outranks_the_session(fake_rt, require_auth, make_tenant, make_key):
    client = session_client()
    token = csrf_token(client)
    r = post_chat(client, **{"X-CSRFToken": token, "Authorization": "Bearer sk-nonsense"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    _, key = make_key(make_tenant("acme"))
    r = post_chat(client, Authorization=f"Bearer {key}")  # a key's call needs no CSRF token
    assert r.status_code == 200
    assert StoredChatCompletion.objects.get(id=r.json()["id"]).tenant.name == "acme"
