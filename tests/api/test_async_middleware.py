"""Django's own middlewares with their hooks inline on the event loop (metrale_site/async_middleware.py): an
API request makes no thread hop for them, and everything they do still happens (headers, CSRF refusals,
saved sessions); Django's system checks still find them."""
from unittest import mock

import pytest
from asgiref import sync
from django.conf import settings
from django.contrib.auth.models import User
from django.utils.module_loading import import_string

from metrale_site import async_middleware

from .asgi_client import AsgiRequest, serve


def ask(method: str, path: str, headers: dict | None = None, body: bytes = b"") -> AsgiRequest:
    async def go():
        req = await AsgiRequest(method, path, headers, body).start()
        req.body_read = await req.read_all()
        return req

    return serve(go)


def test_the_settings_list_djangos_names_and_load_the_subclasses():
    for name in ("django.middleware.security.SecurityMiddleware", "django.middleware.csrf.CsrfViewMiddleware",
                 "django.contrib.sessions.middleware.SessionMiddleware",
                 "django.middleware.clickjacking.XFrameOptionsMiddleware"):
        assert name in settings.MIDDLEWARE
    assert not any(p.startswith("django.") for p in settings.MIDDLEWARE)
    loaded = {import_string(p) for p in settings.MIDDLEWARE}
    assert {async_middleware.AsyncSecurityMiddleware, async_middleware.AsyncSessionMiddleware,
            async_middleware.AsyncCsrfViewMiddleware, async_middleware.AsyncMessageMiddleware} <= loaded
    assert not [m for m in loaded if m.__module__.startswith("django.")]


@pytest.mark.django_db
def test_an_api_request_makes_no_thread_hop_for_the_middlewares_and_keeps_their_headers():
    hops = []
    real = sync.SyncToAsync.__init__

    def counting(self, func, *args, **kwargs):
        hops.append(getattr(func, "__qualname__", repr(func)))
        real(self, func, *args, **kwargs)

    with mock.patch.object(sync.SyncToAsync, "__init__", counting):
        req = ask("GET", "/health/live")
    assert req.status == 200
    assert not [h for h in hops if "process_request" in h or "process_response" in h or "process_view" in h], hops
    assert req.headers["x-content-type-options"] == "nosniff"
    assert req.headers["x-frame-options"] == "DENY"
    assert req.headers["referrer-policy"] == "same-origin"


@pytest.mark.django_db
def test_csrf_still_refuses_an_admin_post_without_its_token():
    req = ask("POST", "/admin/login/", {"content-type": "application/x-www-form-urlencoded"},
              b"username=a&password=b")
    assert req.status == 403
    assert b"CSRF" in req.body_read


@pytest.mark.django_db
def test_a_login_saves_its_session_and_sets_the_cookie(client):
    """A modified session is saved (the response hook in the thread): logging in through the admin's form
    gives a session cookie that the next request is authenticated by."""
    User.objects.create_superuser("op", "op@example.com", "pw-123456")
    page = client.get("/admin/login/")
    token = page.cookies["csrftoken"].value
    done = client.post("/admin/login/?next=/admin/", {"username": "op", "password": "pw-123456",
                                                      "csrfmiddlewaretoken": token})
    assert done.status_code == 302 and settings.SESSION_COOKIE_NAME in done.cookies
    assert client.get("/admin/").status_code == 200


def test_the_hooks_that_may_reach_the_database_say_so():
    class Session:
        modified = False

    request = mock.Mock(session=Session(), _messages=mock.Mock(used=False, added_new=False))
    sessions = async_middleware.AsyncSessionMiddleware(lambda r: None)
    messages = async_middleware.AsyncMessageMiddleware(lambda r: None)
    assert not sessions.response_needs_thread(request, None)
    assert not messages.response_needs_thread(request, None)
    request.session.modified = True
    request._messages.added_new = True
    assert sessions.response_needs_thread(request, None)
    assert messages.response_needs_thread(request, None)


def _session_hooks(method: str, path: str, headers: dict | None = None) -> tuple[int, list[str]]:
    """(status, the session middlewares' hooks that ran) for one request through the ASGI app."""
    ran = []
    wrapped = [(cls, name) for cls in (async_middleware.AsyncSessionMiddleware, async_middleware.AsyncCsrfViewMiddleware,
                                       async_middleware.AsyncAuthenticationMiddleware,
                                       async_middleware.AsyncMessageMiddleware)
               for name in ("process_request", "process_response") if hasattr(cls, name)]
    patches = []
    for cls, name in wrapped:
        real = getattr(cls, name)

        def spy(self, *args, _real=real, _name=f"{cls.__name__}.{name}"):
            ran.append(_name)
            return _real(self, *args)
        patches.append(mock.patch.object(cls, name, spy))
    for p in patches:
        p.start()
    try:
        req = ask(method, path, headers)
    finally:
        for p in patches:
            p.stop()
    return req.status, ran


@pytest.mark.django_db
def test_an_api_request_without_a_session_cookie_passes_the_session_middlewares_by():
    status, ran = _session_hooks("GET", "/health/live")
    assert status == 200 and ran == []
    status, ran = _session_hooks("GET", "/admin/login/")  # a page: all of them, cookie or not
    assert status == 200 and "AsyncSessionMiddleware.process_request" in ran
    assert "AsyncMessageMiddleware.process_response" in ran


@pytest.mark.django_db
def test_a_staff_session_on_the_api_still_goes_through_them_and_authenticates(client, require_auth, fake_rt):
    user = User.objects.create_user("op", password="a-long-passphrase-9", is_staff=True)
    client.force_login(user)
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
    status, ran = _session_hooks("GET", "/v1/models", {"cookie": cookie})
    assert status == 200
    assert {"AsyncSessionMiddleware.process_request", "AsyncAuthenticationMiddleware.process_request",
            "AsyncCsrfViewMiddleware.process_request"} <= set(ran)
    status, ran = _session_hooks("GET", "/v1/models")
    assert status == 401 and ran == []
