"""The operators' admin: every page opens, lists, filters and searches; keys show once; only
staff get in."""
import re

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.test import Client

from inference.tenancy import apikeys
from inference.tenancy.auth import Principal
from inference.models import ApiKey, RateLimitContext
from inference.tenancy.ratelimit import acquire
from inference.serving.errors import ApiError

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client(client):
    """A staff user (not a superuser) with every permission on the inference models."""
    from django.contrib.auth.models import Permission

    user = get_user_model().objects.create_user("operator", password="a-long-passphrase-9",
                                                is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="inference"))
    client.force_login(user)
    return client


@pytest.fixture
def data(make_tenant, make_key):
    acme = make_tenant("acme", requests_per_minute=5, tokens_per_minute=1000,
                       max_concurrent_requests=2)
    globex = make_tenant("globex")
    key, _ = make_key(acme, name="ci runner")
    make_key(globex, name="notebook", revoked=True)
    RateLimitContext.objects.create(tenant=acme, api_key=key, requests_per_minute=1)
    return acme, globex, key


PAGES = ["tenant", "apikey", "ratelimitcontext"]


@pytest.mark.parametrize("model", PAGES)
def test_each_changelist_opens_filters_and_searches(staff_client, data, model):
    url = f"/admin/inference/{model}/"
    assert staff_client.get(url).status_code == 200
    assert staff_client.get(url, {"q": "acme"}).status_code == 200
    assert staff_client.get(url + "add/").status_code == 200


def test_the_tenant_list_searches_and_filters(staff_client, data):
    page = staff_client.get("/admin/inference/tenant/", {"q": "glob"}).content.decode()
    assert "globex" in page and "acme" not in page
    page = staff_client.get("/admin/inference/tenant/", {"active__exact": "1"}).content.decode()
    assert "globex" in page and "acme" in page


def test_the_key_list_searches_by_prefix_and_filters_revoked(staff_client, data):
    _, _, key = data
    page = staff_client.get("/admin/inference/apikey/", {"q": key.prefix}).content.decode()
    assert "ci runner" in page and "notebook" not in page
    page = staff_client.get("/admin/inference/apikey/", {"revoked__exact": "1"}).content.decode()
    assert "notebook" in page and "ci runner" not in page


def test_the_rate_limit_list_shows_live_usage(staff_client, data, frozen_clock):
    acme, _, key = data
    principal = Principal(acme, None, acme.prefix_cache_salt)
    async_to_sync(acquire)(principal, reserve_tokens=300)
    with pytest.raises(ApiError):
        async_to_sync(acquire)(principal, reserve_tokens=800)  # a denial (tokens)
    response = staff_client.get("/admin/inference/ratelimitcontext/", {"q": "acme"})
    assert response.status_code == 200
    row = response.context["cl"].result_list.get(api_key=None)
    admin = response.context["cl"].model_admin
    assert admin.requests_remaining(row) == 4
    assert admin.tokens_remaining(row) == 700
    assert admin.in_flight(row) == 1
    assert admin.denials_last_hour(row) == 1
    assert admin.resets_in(row) != "0s"
    page = response.content.decode()
    assert "denials (1 h)" in page.lower()
    filtered = staff_client.get("/admin/inference/ratelimitcontext/", {"api_key__isempty": "0"})
    assert list(filtered.context["cl"].result_list) == [key.rate_limit]
    change = staff_client.get(f"/admin/inference/ratelimitcontext/{row.pk}/change/")
    assert "in flight 1" in change.content.decode()


def test_creating_a_key_inline_shows_it_once(staff_client, data):
    acme, _, _ = data
    url = f"/admin/inference/tenant/{acme.pk}/change/"
    form = {
        "name": "acme", "active": "on",
        "api_keys-TOTAL_FORMS": "2", "api_keys-INITIAL_FORMS": "1",
        "api_keys-MIN_NUM_FORMS": "0", "api_keys-MAX_NUM_FORMS": "1000",
        "api_keys-0-id": str(acme.api_keys.get().pk), "api_keys-0-tenant": str(acme.pk),
        "api_keys-0-name": "ci runner",
        "api_keys-1-tenant": str(acme.pk), "api_keys-1-name": "new laptop",
        "rate_limits-TOTAL_FORMS": "0", "rate_limits-INITIAL_FORMS": "0",
        "rate_limits-MIN_NUM_FORMS": "0", "rate_limits-MAX_NUM_FORMS": "1000",
    }
    # The tenant-wide and the key's contexts exist; the inline lists them as initial forms.
    contexts = list(acme.rate_limits.order_by("pk"))
    form["rate_limits-TOTAL_FORMS"] = form["rate_limits-INITIAL_FORMS"] = str(len(contexts))
    for i, context in enumerate(contexts):
        form.update({
            f"rate_limits-{i}-id": str(context.pk), f"rate_limits-{i}-tenant": str(acme.pk),
            f"rate_limits-{i}-api_key": str(context.api_key_id or ""),
            f"rate_limits-{i}-requests_per_minute": str(context.requests_per_minute),
            f"rate_limits-{i}-tokens_per_minute": str(context.tokens_per_minute),
            f"rate_limits-{i}-max_concurrent_requests": str(context.max_concurrent_requests),
            f"rate_limits-{i}-max_tokens_per_request": str(context.max_tokens_per_request),
        })
    response = staff_client.post(url, form, follow=True)
    assert response.status_code == 200, response.context["adminform"].errors
    shown = re.findall(r"mk-[A-Za-z0-9_-]{50,}", response.content.decode())
    assert len(shown) == 1
    new = ApiKey.objects.get(name="new laptop")
    assert shown[0].startswith(new.prefix) and apikeys.key_matches(shown[0], new.key_hash)
    again = staff_client.get(url).content.decode()
    assert shown[0] not in again and new.prefix in again


def test_creating_a_key_on_its_own_page_shows_it_once(staff_client, data):
    acme, _, _ = data
    response = staff_client.post("/admin/inference/apikey/add/",
                                 {"tenant": acme.pk, "name": "batch job"}, follow=True)
    shown = re.findall(r"mk-[A-Za-z0-9_-]{50,}", response.content.decode())
    assert len(shown) == 1
    assert apikeys.key_matches(shown[0], ApiKey.objects.get(name="batch job").key_hash)


def test_revoke_is_an_action(staff_client, data, settings):
    _, _, key = data
    response = staff_client.post("/admin/inference/apikey/",
                                 {"action": "revoke", "_selected_action": [key.pk]}, follow=True)
    assert response.status_code == 200
    key.refresh_from_db()
    assert key.revoked and key.revoked_at is not None


def test_a_non_staff_user_is_sent_to_login(client, data):
    user = get_user_model().objects.create_user("customer", password="a-long-passphrase-9")
    client.force_login(user)
    for model in PAGES:
        response = client.get(f"/admin/inference/{model}/")
        assert response.status_code == 302
        assert response.url.startswith("/admin/login/")


def test_an_anonymous_visitor_is_sent_to_login(client):
    response = client.get("/admin/inference/tenant/")
    assert response.status_code == 302 and response.url.startswith("/admin/login/")


def test_login_needs_a_csrf_token():
    get_user_model().objects.create_user("operator", password="a-long-passphrase-9",
                                         is_staff=True)
    client = Client(enforce_csrf_checks=True)
    response = client.post("/admin/login/", {"username": "operator",
                                             "password": "a-long-passphrase-9"})
    assert response.status_code == 403


def test_password_validators_are_on():
    with pytest.raises(ValidationError):
        validate_password("123")
    with pytest.raises(ValidationError):
        validate_password("password")
