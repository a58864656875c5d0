"""manage.py create_tenant, create_api_key, revoke_api_key, and serve's own argument handling."""
import os
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from inference.tenancy import apikeys
from inference.models import ApiKey, RateLimitContext, Tenant

pytestmark = pytest.mark.django_db


def run(*args) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_create_tenant_sets_its_limits():
    run("create_tenant", "acme", "--rpm", "60", "--tpm", "10000", "--concurrency", "4")
    context = RateLimitContext.objects.get(tenant__name="acme", api_key=None)
    assert (context.requests_per_minute, context.tokens_per_minute,
            context.max_concurrent_requests) == (60, 10000, 4)
    with pytest.raises(CommandError, match="already exists"):
        run("create_tenant", "acme")
    with pytest.raises(CommandError, match=">= 0"):
        run("create_tenant", "other", "--rpm", "-1")


def test_create_tenant_defaults_to_the_server_limits(settings):
    settings.METRALE = {**settings.METRALE, "RATE_LIMITS": {"RPM": 7}}
    run("create_tenant", "acme")
    assert RateLimitContext.objects.get(tenant__name="acme").requests_per_minute == 7


def test_create_api_key_prints_the_key_once():
    run("create_tenant", "acme")
    out, err = run("create_api_key", "acme", "--name", "laptop", "--expires", "30d")
    key = out.strip()
    stored = ApiKey.objects.get(name="laptop")
    assert apikeys.key_matches(key, stored.key_hash)
    assert stored.prefix in err and key not in err
    assert abs(stored.expires_at - (timezone.now() + timedelta(days=30))) < timedelta(minutes=1)


@pytest.mark.parametrize("text, expected", [
    ("2030-01-02", "2030-01-02T00:00:00+00:00"),
    ("2030-01-02T03:04:05", "2030-01-02T03:04:05+00:00"),
    ("2030-01-02T03:04:05+02:00", "2030-01-02T01:04:05+00:00"),
])
def test_create_api_key_reads_dates(text, expected):
    Tenant.objects.create(name="acme")
    run("create_api_key", "acme", "--expires", text)
    assert ApiKey.objects.get().expires_at.isoformat() == expected


@pytest.mark.parametrize("args, message", [
    (["nobody"], "No tenant"),
    (["acme", "--expires", "soon"], "not 30d"),
    (["acme", "--expires", "2030-13-45"], "not 30d"),
])
def test_create_api_key_refuses_bad_input(args, message):
    Tenant.objects.create(name="acme")
    with pytest.raises(CommandError, match=message):
        run("create_api_key", *args)


def test_revoke_api_key_by_prefix_or_whole_key():
    tenant = Tenant.objects.create(name="acme")
    first, second = ApiKey.objects.create(tenant=tenant), ApiKey.objects.create(tenant=tenant)
    run("revoke_api_key", first.prefix)
    run("revoke_api_key", second.new_key)
    assert all(key.revoked and key.revoked_at for key in ApiKey.objects.all())
    out, _ = run("revoke_api_key", first.prefix)
    assert "already revoked" in out
    with pytest.raises(CommandError, match="No API key"):
        run("revoke_api_key", "mk-zzzzzzzz")


def test_serve_refuses_an_unknown_parser_before_starting(monkeypatch):
    monkeypatch.setattr(os, "execve", lambda *a: pytest.fail("started a server with an unknown parser"))
    with pytest.raises(CommandError, match="xml9"):
        call_command("serve", "--tool-call-parser", "xml9")


def test_serve_hands_parser_flags_to_a_fresh_process_as_settings_not_by_mutating_them(monkeypatch, settings):
    started = []

    def execve(path, argv, env):
        started.append((argv, env))
        raise SystemExit(0)

    before = dict(settings.METRALE)
    monkeypatch.setattr(os, "execve", execve)
    with pytest.raises(SystemExit):
        call_command("serve", "--tool-call-parser", "hermes", "--reasoning-parser", "none", "--port", "8123")
    [(argv, env)] = started
    assert (env["METRALE_TOOL_CALL_PARSER"], env["METRALE_REASONING_PARSER"]) == ("hermes", "none")
    assert argv[-5:] == ["serve", "--host", "127.0.0.1", "--port", "8123"] and "--tool-call-parser" not in argv
    assert settings.METRALE == before


def test_bench_skip_lora_leaves_the_lora_section_out(monkeypatch, settings, smollm2_dir):
    from inference.management.commands import bench

    settings.METRALE = {**settings.METRALE, "MODEL": str(smollm2_dir), "KV_CACHE_BYTES": 16 << 20}
    ran = []
    monkeypatch.setattr(bench.Command, "_lora", lambda self, *args: ran.append("lora"))
    monkeypatch.setattr(bench.Command, "_report", lambda self, *args: ran.append("report"))
    monkeypatch.setattr(bench, "copy_bandwidth_gb_s", lambda: 1.0)  # not what this test measures
    quick = ["--dtypes", "float32", "--skip-decode", "--skip-offline", "--skip-http", "--skip-hf"]
    call_command("bench", *quick, "--skip-lora", stdout=StringIO())
    assert ran == ["report"]
    call_command("bench", *quick, stdout=StringIO())
    assert ran == ["report", "report", "lora"]
    with pytest.raises(CommandError, match="nothing to run"):
        call_command("bench", "--lora-only", "--skip-lora", stdout=StringIO())


@pytest.mark.parametrize("require_auth, admin, noted", [(False, False, "check no key"), (False, True, "operator routes"),
                                                         (True, False, None)])
def test_create_api_key_says_when_nothing_checks_the_key(settings, require_auth, admin, noted):
    settings.METRALE = {**settings.METRALE, "REQUIRE_AUTH": require_auth}
    run("create_tenant", "acme")
    out, err = run("create_api_key", "acme", *(["--admin"] if admin else []))
    stored = ApiKey.objects.get()
    assert stored.is_admin == admin and apikeys.key_matches(out.strip(), stored.key_hash)
    if noted is None:
        assert "METRALE_REQUIRE_AUTH" not in err
    else:
        assert "METRALE_REQUIRE_AUTH is off" in err and noted in err


def test_serve_request_log_without_a_path_writes_into_the_data_directory(monkeypatch, settings):
    started = []

    def execve(path, argv, env):
        started.append(env)
        raise SystemExit(0)

    monkeypatch.setattr(os, "execve", execve)
    with pytest.raises(SystemExit):
        call_command("serve", "--request-log", "--port", "8123")
    assert started[0]["METRALE_REQUEST_LOG"] == str(settings.DATA_DIR / "requests.jsonl")


def test_serve_starts_its_server_processes_the_way_this_one_started(monkeypatch, tmp_path):
    from inference.management.commands.serve import entry_command

    script = tmp_path / "metrale"
    script.write_text("")
    monkeypatch.setattr("sys.argv", [str(script), "serve"])
    assert entry_command() == [str(script)]
    package = tmp_path / "pkg"  # a package's module run by -m: its folder must not go on sys.path
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text("")
    monkeypatch.setattr("sys.argv", [str(package / "__main__.py"), "serve"])
    assert entry_command() == ["-m", "metrale_site.cli", "manage"]
