"""Bearer-key auth on every /v1/* route: the matrix of headers and key states, and auth off."""
import re
from datetime import timedelta

import pytest
from django.utils import timezone

from inference.operations.checks import guarded_routes
from inference.http.error_shapes import shape_for_path
from inference.serving.errors import ANTHROPIC
from inference.models import ApiKey, Tenant
from inference.tenancy import recent

pytestmark = pytest.mark.django_db

RATELIMIT_HEADERS = [f"x-ratelimit-{kind}-{axis}" for kind in ("limit", "remaining", "reset")
                     for axis in ("requests", "tokens")]


def v1_paths(operator: bool | None = None, ollama: bool = False):
    """A concrete path for every /v1/* (and /tokenize, /detokenize) route the site has (only the
    operator routes with operator=True, none of them with False); with `ollama`, Ollama's /api/* routes
    instead."""
    samples = {"int": "1", "uuid": "00000000-0000-0000-0000-000000000001"}
    paths = []
    for route, view in guarded_routes():
        if operator is not None and bool(getattr(view, "operator_endpoint", False)) != operator:
            continue
        if route.lstrip("^").startswith("api/") != ollama:
            continue
        path = "/" + route.lstrip("^").rstrip("$")
        paths.append(re.sub(r"<(?:(\w+):)?\w+>", lambda m: samples.get(m[1], "x1"), path))
    return paths


def call(client, path, authorization=None):
    headers = {"Authorization": authorization} if authorization is not None else {}
    if path == "/v1/models":
        return client.get(path, headers=headers)
    return client.post(path, data={}, content_type="application/json", headers=headers)


@pytest.fixture
def keys(make_tenant, make_key):
    tenant = make_tenant()
    _, good = make_key(tenant, name="good")
    _, revoked = make_key(tenant, name="revoked", revoked=True)
    _, expired = make_key(tenant, name="expired", expires_at=timezone.now() - timedelta(seconds=1))
    _, later = make_key(tenant, name="later", expires_at=timezone.now() + timedelta(days=1))
    _, inactive = make_key(make_tenant("gone"), name="inactive")
    Tenant.objects.filter(name="gone").update(active=False)
    return {"good": good, "revoked": revoked, "expired": expired, "later": later,
            "inactive": inactive}


CASES = [
    ("no header", None, "missing_api_key"),
    ("empty header", "", "missing_api_key"),
    ("basic scheme", "Basic dXNlcjpwYXNz", "missing_api_key"),
    ("bearer without token", "Bearer ", "missing_api_key"),
    ("two tokens", "Bearer a b", "missing_api_key"),
    ("unknown key", "Bearer mk-aaaaaaaaNOTAREALKEYxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", "invalid_api_key"),
    ("not our format", "Bearer sk-proj-abc", "invalid_api_key"),
    ("revoked key", "Bearer {revoked}", "invalid_api_key"),
    ("expired key", "Bearer {expired}", "invalid_api_key"),
    ("inactive tenant", "Bearer {inactive}", "invalid_api_key"),
    ("good prefix, wrong secret", "Bearer {good_prefix}wrongsecretwrongsecretwrongsecretwrongsec",
     "invalid_api_key"),
]


@pytest.mark.parametrize("path", v1_paths())
@pytest.mark.parametrize("case, authorization, code", CASES, ids=[c[0] for c in CASES])
def test_it_refuses_bad_credentials(client, require_auth, keys, path, case, authorization, code):
    if authorization is not None:
        authorization = authorization.format(good_prefix=keys["good"][:11], **keys)
    response = call(client, path, authorization)
    assert response.status_code == 401
    if shape_for_path(path) is ANTHROPIC:  # the route's own error shape (Anthropic's Messages routes)
        body = response.json()
        assert body == {"type": "error", "error": {"type": "authentication_error",
                                                   "message": body["error"]["message"]},
                        "request_id": response.headers["request-id"]}
        return
    assert response.json() == {"error": {"message": response.json()["error"]["message"],
                                         "type": "invalid_request_error", "param": None,
                                         "code": code}}


# Ollama's routes go through the same authenticate (the matrix above is its table); each is asked the two
# kinds of refusal, in Ollama's shape.
@pytest.mark.parametrize("path", v1_paths(ollama=True))
@pytest.mark.parametrize("case, authorization, code", [CASES[0], CASES[5]], ids=[CASES[0][0], CASES[5][0]])
def test_ollama_routes_refuse_bad_credentials_in_their_shape(client, require_auth, keys, path, case, authorization,
                                                            code):
    response = call(client, path, authorization)
    assert response.status_code == 401 and set(response.json()) == {"error"}
    assert "API key" in response.json()["error"]


# Model management on Ollama's routes needs an operator when auth is on (ollama_api.model_views._operator).
OLLAMA_OPERATOR_PATHS = {"/api/pull", "/api/copy", "/api/delete"}


@pytest.mark.parametrize("path", v1_paths(ollama=True))
def test_ollama_routes_serve_a_good_key(client, require_auth, keys, path):
    response = call(client, path, f"Bearer {keys['good']}")
    allowed = (401, 429) if path in OLLAMA_OPERATOR_PATHS else (401, 403, 429)
    assert response.status_code not in allowed, response.content
    if response.status_code == 403:  # an operator route: only an admin key, in Ollama's shape
        assert set(response.json()) == {"error"} and "admin key" in response.json()["error"]
    if response.status_code >= 500:
        assert "not supported by this server" in response.json()["error"], response.content
    for header in RATELIMIT_HEADERS:
        assert header in response.headers


@pytest.mark.parametrize("path", v1_paths(operator=True))
def test_operator_routes_refuse_a_good_key_that_is_not_an_admin_key(client, require_auth, keys, path):
    response = call(client, path, f"Bearer {keys['good']}")
    assert response.status_code == 403 and response.json()["error"]["code"] == "admin_key_required"


@pytest.mark.parametrize("path", v1_paths(operator=False))
@pytest.mark.parametrize("which", ["good", "later"])
def test_it_serves_a_good_key(client, require_auth, keys, path, which):
    response = call(client, path, f"Bearer {keys[which]}")
    assert response.status_code not in (401, 403, 429)
    # Past auth: the route's own answer, never a server error but "not implemented" or "not loaded" (the
    # in-process tests' registry refuses to load a model: model_load_failed).
    if response.status_code >= 500:
        assert response.json()["error"]["code"] in ("not_implemented", "model_load_failed"), response.content
    for header in RATELIMIT_HEADERS:
        assert header in response.headers
    if path == "/v1/models":
        assert response.status_code == 200


def test_every_route_is_covered():
    assert "/v1/models" in v1_paths(operator=False) and "/v1/load_lora_adapter" in v1_paths(operator=True)
    assert {"/api/chat", "/api/tags", "/api/pull", "/api/blobs/x1"} <= set(v1_paths(ollama=True))


def test_the_scheme_is_case_insensitive(client, require_auth, keys):
    assert call(client, "/v1/models", f"bearer {keys['good']}").status_code == 200


def test_health_stays_open(client, require_auth, fake_rt, monkeypatch):
    ready = client.get("/health")
    assert ready.status_code == 200
    assert ready.json()["status"] == "ready" and ready.json()["model"] == "smollm2-135m-instruct"
    from inference.operations.model_specs import CHAT, ModelSpec
    from inference.operations.registry import serving

    from .registries import registry_of

    with serving(registry_of(ModelSpec("smollm2-135m-instruct", fake_rt.model_path, CHAT))):
        loading = client.get("/health")
    assert loading.status_code == 503 and loading.json() == {"status": "loading"}


def test_with_auth_off_requests_run_as_the_default_tenant(client):
    response = client.get("/v1/models")
    assert response.status_code == 200
    assert response.headers["x-ratelimit-limit-requests"] == "unlimited"
    assert Tenant.objects.filter(name=Tenant.DEFAULT_NAME).exists()
    assert client.get("/v1/models", headers={"Authorization": "Bearer nonsense"}).status_code == 200


def test_last_used_is_written_at_most_once_a_minute(client, require_auth, keys):
    key = ApiKey.objects.get(name="good")
    assert key.last_used is None
    call(client, "/v1/models", f"Bearer {keys['good']}")
    first = ApiKey.objects.get(pk=key.pk).last_used
    assert first is not None
    call(client, "/v1/models", f"Bearer {keys['good']}")
    assert ApiKey.objects.get(pk=key.pk).last_used == first
    ApiKey.objects.filter(pk=key.pk).update(last_used=first - timedelta(minutes=2))
    recent.forget_all()  # a raw UPDATE reaches the remembered row within recent.TTL_S; no waiting here
    call(client, "/v1/models", f"Bearer {keys['good']}")
    assert ApiKey.objects.get(pk=key.pk).last_used > first


def test_the_key_is_stored_only_as_a_hash(keys):
    key = ApiKey.objects.get(name="good")
    assert keys["good"].startswith(key.prefix) and key.prefix.startswith("mk-")
    assert keys["good"] not in {key.key_hash, key.prefix, key.name}
    assert ApiKey.objects.get(pk=key.pk).new_key is None


def test_each_tenant_has_its_own_prefix_cache_salt(make_tenant):
    first, second = make_tenant("first"), make_tenant("second")
    assert first.prefix_cache_salt != second.prefix_cache_salt
    assert Tenant.objects.get(pk=first.pk).prefix_cache_salt == first.prefix_cache_salt


def test_every_guarded_route_goes_through_openai_endpoint():
    from inference.operations.checks import check_guarded_routes

    assert check_guarded_routes(None) == []
