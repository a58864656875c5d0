"""Production settings, the system checks, and the helpers with rules of their own."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.http import JsonResponse
from django.urls import path

from inference.tenancy.auth import bearer_token
from inference.operations.checks import check_guarded_routes, check_rate_limit_cache
from inference.tenancy.ratelimiting.headers import format_duration
from inference.tenancy.ratelimiting.limits import Limits, default_limits

ROOT = Path(__file__).resolve().parents[2]


def settings_of(module: str, **env) -> subprocess.CompletedProcess:
    """Load `module` in a fresh interpreter, with no auth, secret or service variables set but
    `env`; prints REQUIRE_AUTH, DEBUG, the cache backend and the database engine."""
    code = ("import django; django.setup(); from django.conf import settings as s; "
            "print(s.METRALE['REQUIRE_AUTH'], s.DEBUG, s.CACHES['default']['BACKEND'], "
            "s.DATABASES['default']['ENGINE'])")
    environment = {k: v for k, v in os.environ.items()
                   if k not in ("DJANGO_SECRET_KEY", "METRALE_REQUIRE_AUTH", "REDIS_URL",
                                "DATABASE_URL", "DJANGO_DEBUG")}
    environment.update(DJANGO_SETTINGS_MODULE=module, **env)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=environment,
                          capture_output=True, text=True, timeout=60)


def test_the_default_settings_need_no_service_and_no_key():
    result = settings_of("metrale_site.settings")
    assert result.stdout.split() == ["False", "False",
                                     "django.core.cache.backends.locmem.LocMemCache",
                                     "django.db.backends.sqlite3"], result.stderr


def test_production_settings_require_auth_and_a_secret_key():
    assert "DJANGO_SECRET_KEY must be set" in settings_of("metrale_site.settings_production").stderr
    result = settings_of("metrale_site.settings_production", DJANGO_SECRET_KEY="s3cret",
                         REDIS_URL="redis://127.0.0.1:6379/0")
    assert result.stdout.split() == ["True", "False", "django_redis.cache.RedisCache",
                                     "django.db.backends.sqlite3"], result.stderr


def test_local_memory_needs_no_warning():
    assert check_rate_limit_cache(None) == []


def test_a_cache_without_atomic_debits_is_warned_about(settings, tmp_path):
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
                                   "LOCATION": str(tmp_path)}}
    assert [w.id for w in check_rate_limit_cache(None)] == ["metrale.W001"]


# This module doubles as a URLconf with one /v1 view that skips openai_endpoint.
urlpatterns = [path("v1/naked", lambda request: JsonResponse({}))]


def test_an_unguarded_v1_view_is_warned_about(settings):
    settings.ROOT_URLCONF = "tests.api.test_settings_and_checks"
    warnings = check_guarded_routes(None)
    assert [w.id for w in warnings] == ["metrale.W002"]
    assert "v1/naked" in warnings[0].msg


def test_negative_default_limits_are_a_configuration_error(settings):
    from django.core.exceptions import ImproperlyConfigured

    settings.METRALE = {**settings.METRALE, "RATE_LIMITS": {"RPM": -1}}
    with pytest.raises(ImproperlyConfigured):
        default_limits()


def test_a_burst_defaults_to_the_rate():
    assert Limits(requests_per_minute=3).request_capacity == 3
    assert Limits(requests_per_minute=3, burst_requests=10).request_capacity == 10
    assert Limits(tokens_per_minute=600).token_rate_s == 10


@pytest.mark.parametrize("seconds, text", [
    (0, "0s"), (0.0201, "21ms"), (1, "1s"), (1.2, "2s"), (59.5, "1m0s"), (60, "1m0s"),
    (360, "6m0s"), (3600, "1h0m0s"),
])
def test_reset_times_read_like_openais(seconds, text):
    assert format_duration(seconds) == text


@pytest.mark.parametrize("header, token", [
    (None, None), ("", None), ("Bearer", None), ("Bearer  ", None), ("Token abc", None),
    ("Bearer abc", "abc"), ("bearer abc", "abc"), ("BEARER  abc ", "abc"), ("Bearer a b", None),
])
def test_bearer_token(header, token):
    assert bearer_token(header) == token


def test_an_unknown_parser_setting_is_a_system_check_error(settings):
    from inference.operations.checks import check_parser_settings

    assert check_parser_settings(None) == []
    settings.METRALE = {**settings.METRALE, "TOOL_CALL_PARSER": "hermes", "REASONING_PARSER": "none"}
    assert check_parser_settings(None) == []
    settings.METRALE = {**settings.METRALE, "TOOL_CALL_PARSER": "xml9"}
    [error] = check_parser_settings(None)
    assert error.id == "metrale.E001" and "xml9" in error.msg and "hermes" in error.msg


def test_a_bad_engine_setting_is_an_error_with_an_id_and_a_missing_model_folder_only_a_warning(
        settings, tmp_path):
    from inference.operations.checks import check_engine_settings

    settings.METRALE = {**settings.METRALE, "DTYPE": "float64"}
    [error] = check_engine_settings(None)
    assert error.id == "metrale.E002" and error.is_serious() and "float64" in error.msg
    settings.METRALE = {**settings.METRALE, "DTYPE": None, "MODEL": str(tmp_path / "not-pulled-yet")}
    warnings = check_engine_settings(None)
    assert warnings and {w.id for w in warnings} == {"metrale.W003"}
    assert not any(w.is_serious() for w in warnings)


def test_migrate_runs_on_a_fresh_machine_whose_model_is_not_pulled_yet(tmp_path):
    env = {**os.environ, "METRALE_MODEL": str(tmp_path / "nothing-here"),
           "METRALE_SQLITE_PATH": str(tmp_path / "db.sqlite3")}
    result = subprocess.run([sys.executable, "manage.py", "migrate", "--noinput"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "metrale.W003" in result.stderr or "metrale.W003" in result.stdout


def test_the_engine_config_is_built_from_the_settings_in_one_place(settings):
    from inference.engine.config import ConfigError, EngineConfig
    from inference.operations.runtime import engine_config

    settings.METRALE = {**settings.METRALE, "MAX_NUM_SEQS": 7, "WEIGHTS": None}
    config = engine_config()
    assert config.max_num_seqs == 7
    assert config.weights == EngineConfig.__dataclass_fields__["weights"].default == "auto"
    assert config.model_path == str(settings.METRALE["MODEL"])
    assert config.logprobs_mode == "raw_logprobs"  # vLLM's default
    settings.METRALE = {**settings.METRALE, "LOGPROBS_MODE": "processed_logprobs"}
    assert engine_config().logprobs_mode == "processed_logprobs"
    settings.METRALE = {**settings.METRALE, "LOGPROBS_MODE": "processed"}
    with pytest.raises(ConfigError, match="logprobs_mode must be one of raw_logprobs, processed_logprobs"):
        engine_config()
