"""Runtime LoRA on the real SmolLM2 engine in-process: vLLM's load/unload routes, selection by `model`,
/v1/models cards, unknown names, the tenant allow-list and the Adapter rows."""
import json

import pytest

from adapters.models import Adapter
from tests.engine.tiny_adapters import make_tiny_adapter


pytestmark = pytest.mark.slow
BASE = "smollm2-135m-instruct"


@pytest.fixture(scope="session")
def smollm2_adapters(smollm2_dir, tmp_path_factory):
    """Two random rank-8 q/v adapters of SmolLM2 (PEFT's default targets)."""
    root = tmp_path_factory.mktemp("smol_lora")
    return {name: str(make_tiny_adapter(smollm2_dir, root / name, seed=seed, r=8, alpha=16,
                                        target_modules=["q_proj", "v_proj"]))
            for name, seed in (("sql", 1), ("poet", 2))}


class _Answer:
    def __init__(self, response):
        self.status = response.status_code
        self.text = response.content.decode()
        self._response = response

    def json(self):
        return self._response.json()


_client = None


@pytest.fixture(autouse=True)
def api(client):
    """Django's test client (its requests share the test's database connection)."""
    global _client
    _client = client
    yield client
    _client = None


def call(method, path, body=None, headers=None, raw=None):
    data = raw if raw is not None else (json.dumps(body) if body is not None else "")
    extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in (headers or {}).items()}
    return _Answer(_client.generic(method, path, data, content_type="application/json", **extra))


@pytest.fixture
def lora_rt(real_rt, settings):
    from inference.operations.runtime import fingerprint_settings
    from inference.serving.fingerprint import model_fingerprint

    settings.METRALE = {**settings.METRALE, "ALLOW_RUNTIME_LORA": True}
    real_rt.fingerprint = model_fingerprint(real_rt.model_path, fingerprint_settings(real_rt.engine.engine.config))
    yield real_rt
    for name in list(real_rt.engine.engine.loras.by_name):  # the engine is shared by the session's tests
        real_rt.engine.call(lambda llm, n=name: llm.remove_lora(n)).result()


@pytest.fixture
def admin_headers(make_tenant, make_key):
    _, key = make_key(make_tenant("ops"), is_admin=True)
    return {"authorization": f"Bearer {key}"}


def chat(model, headers=None, **kw):
    return call("POST", "/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": "Hi"}],
                                                 "max_tokens": 8, "temperature": 0, **kw}, headers)


def load(headers, name, path, **kw):
    return call("POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path, **kw}, headers)


def unload(headers, name):
    return call("POST", "/v1/unload_lora_adapter", {"lora_name": name}, headers)


def test_load_list_chat_unload_404_and_reload(lora_rt, admin_headers, smollm2_adapters):
    base = chat(BASE).json()
    ok = load(admin_headers, "sql", smollm2_adapters["sql"])
    assert ok.status == 200 and ok.text == "Success: LoRA adapter 'sql' added successfully."
    cards = {c["id"]: c for c in call("GET", "/v1/models").json()["data"]}
    assert cards["sql"]["parent"] == BASE and cards["sql"]["root"] == smollm2_adapters["sql"]
    assert cards[BASE]["parent"] is None and cards[BASE]["root"]
    assert call("GET", "/v1/models/sql").json()["parent"] == BASE
    tuned = chat("sql").json()
    assert tuned["model"] == "sql"
    assert tuned["choices"][0]["message"] != base["choices"][0]["message"]
    assert tuned["system_fingerprint"].startswith("fp_") and tuned["system_fingerprint"] != base["system_fingerprint"]
    slotted = chat(f"{BASE}:sql").json()  # metrale's base:adapter syntax
    assert slotted["choices"][0]["message"] == tuned["choices"][0]["message"]
    assert unload(admin_headers, "sql").status == 200
    gone = chat("sql")
    assert gone.status == 404 and gone.json()["error"]["code"] == "model_not_found"
    assert "sql" not in {c["id"] for c in call("GET", "/v1/models").json()["data"]}
    assert unload(admin_headers, "sql").status == 404
    slots = lora_rt.engine.engine.loras
    for _ in range(3):
        assert load(admin_headers, "sql", smollm2_adapters["sql"]).status == 200
        assert chat("sql").json()["choices"][0]["message"] == tuned["choices"][0]["message"]
        assert unload(admin_headers, "sql").status == 200
        assert all(a is None for a in slots.slots)  # no slot kept by an unload
    row = Adapter.objects.get(name="sql")
    assert not row.loaded and row.path == smollm2_adapters["sql"]


def test_load_refusals_in_vllms_shapes(lora_rt, admin_headers, smollm2_adapters, make_tenant, make_key, tmp_path):
    assert load(admin_headers, "sql", smollm2_adapters["sql"]).status == 200
    taken = load(admin_headers, "sql", smollm2_adapters["poet"])
    assert taken.status == 400 and "already loaded" in taken.json()["error"]["message"]
    assert load(admin_headers, "sql", smollm2_adapters["poet"], load_inplace=True).status == 200
    assert call("GET", "/v1/models/sql").json()["root"] == smollm2_adapters["poet"]
    missing = call("POST", "/v1/load_lora_adapter", {"lora_name": "x"}, admin_headers)
    assert missing.status == 400 and missing.json()["error"]["param"] == "lora_path"
    nowhere = load(admin_headers, "x", str(tmp_path / "none"))
    assert nowhere.status == 404 and nowhere.json()["error"]["code"] == "lora_adapter_not_found"
    assert Adapter.objects.get(name="x").error
    assert load(admin_headers, BASE, smollm2_adapters["sql"]).status == 400
    assert load(admin_headers, "a:b", smollm2_adapters["sql"]).status == 400
    assert load(admin_headers, "y", smollm2_adapters["sql"], load_inplace="yes").status == 400
    _, plain = make_key(make_tenant("user"))
    assert load({"authorization": f"Bearer {plain}"}, "z", smollm2_adapters["sql"]).status == 403
    assert call("POST", "/v1/load_lora_adapter", {"lora_name": "z", "lora_path": "p"}).status == 401
    assert call("POST", "/v1/load_lora_adapter", raw=b"{", headers=admin_headers).status == 400


def test_the_routes_do_not_exist_unless_runtime_lora_is_on(real_rt, settings, admin_headers, smollm2_adapters):
    settings.METRALE = {**settings.METRALE, "ALLOW_RUNTIME_LORA": False}
    off = load(admin_headers, "sql", smollm2_adapters["sql"])
    assert off.status == 404 and off.json()["error"]["code"] == "unknown_url"
    assert unload(admin_headers, "sql").status == 404


def test_unknown_names_are_404_unless_accept_any_is_on(lora_rt, settings):
    unknown = chat("gpt-4o")
    assert unknown.status == 404 and unknown.json()["error"]["code"] == "model_not_found"
    assert unknown.json()["error"]["param"] == "model"
    settings.METRALE = {**settings.METRALE, "ACCEPT_ANY_MODEL_NAME": True}
    assert chat("gpt-4o").json()["model"] == BASE


def test_an_adapter_limited_to_some_tenants_is_a_404_for_the_others(lora_rt, admin_headers, smollm2_adapters,
                                                                 make_tenant, make_key, settings):
    from adapters import registry

    settings.METRALE = {**settings.METRALE, "REQUIRE_AUTH": True}
    allowed, other = make_tenant("allowed"), make_tenant("other")
    headers = {t.name: {"authorization": f"Bearer {make_key(t)[1]}"} for t in (allowed, other)}
    assert load(admin_headers, "poet", smollm2_adapters["poet"]).status == 200
    row = Adapter.objects.get(name="poet")
    row.tenants.add(allowed)
    registry.refresh_allow_list(lora_rt, row)
    assert chat("poet", headers["allowed"]).status == 200
    assert chat("poet", headers["other"]).status == 404
    listed = {c["id"] for c in call("GET", "/v1/models", headers=headers["other"]).json()["data"]}
    assert listed == {BASE}
    registry.flush_served(lora_rt)
    assert Adapter.objects.get(name="poet").requests_served == 1


def test_startup_adapters_load_before_the_server_is_ready(lora_rt, settings, smollm2_adapters, tmp_path):
    from adapters import registry

    settings.METRALE = {**settings.METRALE, "LORA_ADAPTERS": [f"poet={smollm2_adapters['poet']}",
                                                              f"broken={tmp_path / 'none'}"]}
    Adapter.objects.create(name="sql", path=smollm2_adapters["sql"], loaded=True)  # loaded at run time before
    registry.load_startup_adapters(runtime=lora_rt, swap=True)
    assert sorted(lora_rt.adapters) == ["poet", "sql"]
    assert chat("poet").json()["model"] == "poet"
    broken = Adapter.objects.get(name="broken")
    assert not broken.loaded and "no adapter folder" in broken.error
    settings.METRALE = {**settings.METRALE, "LORA_ADAPTERS": ["no-path"]}
    with pytest.raises(ValueError, match="name=path"):
        registry.startup_adapters()


def test_serve_refuses_a_lora_flag_that_is_not_name_equals_path():
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="NAME=PATH"):
        call_command("serve", "--lora", "just-a-path")
