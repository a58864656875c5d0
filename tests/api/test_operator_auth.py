"""Operator routes (api.operator_endpoint): only admin keys or a staff session, CSRF-checked for
sessions; `create_api_key --admin` and the admin's checkbox make admin keys."""
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client

from inference.models import ApiKey

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.api.operator_urls")]

URL = "/v1/test/operator"


def bearer(key):
    return {"HTTP_AUTHORIZATION": f"Bearer {key}"}


def test_it_accepts_an_admin_key_and_refuses_other_keys(client, make_tenant, make_key):
    tenant = make_tenant("ops")
    admin, admin_key = make_key(tenant, is_admin=True)
    _, plain_key = make_key(tenant)
    ok = client.post(URL, **bearer(admin_key))
    assert ok.status_code == 200 and ok.json() == {"operator": f"key:{admin.prefix}"}
    refused = client.get(URL, **bearer(plain_key))
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "admin_key_required"
    assert client.get(URL, **bearer("mk-nosuchkey" + "x" * 43)).json()["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize("require_auth", [False, True])
def test_it_needs_a_key_or_a_session_even_with_auth_off(client, settings, require_auth):
    settings.METRALE = {**settings.METRALE, "REQUIRE_AUTH": require_auth}
    response = client.get(URL)
    assert response.status_code == 401 and response.json()["error"]["code"] == "missing_api_key"


def test_a_revoked_admin_key_is_refused(client, make_tenant, make_key):
    _, key = make_key(make_tenant("ops"), is_admin=True, revoked=True)
    assert client.get(URL, **bearer(key)).status_code == 401


def test_a_staff_session_passes_with_csrf_and_a_user_session_does_not():
    users = get_user_model().objects
    staff = Client(enforce_csrf_checks=True)
    staff.force_login(users.create_user("op", password="x-long-passphrase-1", is_staff=True))
    assert staff.get(URL).json() == {"operator": "user:op"}
    refused = staff.post(URL)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "csrf_failed"
    staff.get("/admin/")  # sets the csrftoken cookie
    token = staff.cookies["csrftoken"].value
    assert staff.post(URL, HTTP_X_CSRFTOKEN=token).json() == {"operator": "user:op"}

    visitor = Client()
    visitor.force_login(users.create_user("someone", password="x-long-passphrase-2"))
    assert visitor.get(URL).status_code == 401


def test_create_api_key_admin_makes_an_admin_key(make_tenant):
    make_tenant("ops")
    out, err = StringIO(), StringIO()
    call_command("create_api_key", "ops", "--admin", stdout=out, stderr=err)
    assert ApiKey.objects.get().is_admin and "admin key" in err.getvalue()
    call_command("create_api_key", "ops", stdout=out, stderr=err)
    assert ApiKey.objects.filter(is_admin=False).count() == 1


def test_the_admin_has_the_admin_checkbox(admin_client, make_tenant):
    tenant = make_tenant("ops")
    page = admin_client.get("/admin/inference/apikey/add/").content.decode()
    assert 'name="is_admin"' in page
    admin_client.post("/admin/inference/apikey/add/", {"tenant": tenant.pk, "name": "ops",
                                                        "is_admin": "on"})
    assert ApiKey.objects.get(name="ops").is_admin
