"""settings_production: the services and hosts from the environment (the names settings.py uses), and a
`manage.py check --deploy` with nothing to report, TLS ending at the load balancer."""
import json
import os
import re
import secrets
import subprocess
import sys

from inference.bench.live_server import ROOT

ENV = {"DJANGO_SETTINGS_MODULE": "metrale_site.settings_production", "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
       "DATABASE_URL": "postgres://metrale:pw@db.internal:5433/metrale", "REDIS_URL": "redis://cache.internal:6379/2",
       "CELERY_BROKER_URL": "amqp://guest:guest@mq.internal:5672//", "DJANGO_ALLOWED_HOSTS": "api.example.com",
       "METRALE_LOAD_ON_START": "0"}


def run(*argv: str, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, **ENV, **env}
    for name in [k for k, v in full.items() if v is None]:
        del full[name]
    return subprocess.run([sys.executable, *argv], cwd=ROOT, env=full, capture_output=True, text=True, timeout=120)


def test_check_deploy_is_clean():
    done = run("manage.py", "check", "--deploy", "--fail-level", "WARNING")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues (0 silenced)." in done.stdout


def test_services_hosts_and_tls_come_from_the_environment():
    script = ("import django, json; django.setup(); from django.conf import settings as s; print(json.dumps({"
              "'db': s.DATABASES['default'], 'cache': s.CACHES['default']['LOCATION'], 'broker': s.CELERY_BROKER_URL,"
              "'eager': s.CELERY_TASK_ALWAYS_EAGER, 'hosts': s.ALLOWED_HOSTS, 'proxy': s.SECURE_PROXY_SSL_HEADER,"
              "'layer': s.CHANNEL_LAYERS['default']['CONFIG']['hosts'], 'auth': s.METRALE['REQUIRE_AUTH'],"
              "'debug': s.DEBUG, 'redirect': s.SECURE_SSL_REDIRECT, 'exempt': s.SECURE_REDIRECT_EXEMPT}, default=str))")
    done = run("-c", script)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["db"]["ENGINE"] == "django.db.backends.postgresql"
    assert (got["db"]["HOST"], got["db"]["PORT"], got["db"]["NAME"], got["db"]["USER"]) == (
        "db.internal", "5433", "metrale", "metrale")
    assert got["cache"] == "redis://cache.internal:6379/2"
    # The channel layer is settings.py's: its socket reads outlast channels-redis' 5 s BZPOPMIN (redis-py 8 gives up
    # a read after 5 s by default, which ended the replica agents' and the console's every wait).
    assert got["layer"] == [{"address": "redis://cache.internal:6379/2", "socket_timeout": 30}]
    assert got["broker"] == "amqp://guest:guest@mq.internal:5672//" and got["eager"] is False
    assert got["hosts"] == ["api.example.com"] and got["proxy"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    assert got["auth"] is True and got["debug"] is False and got["redirect"] is True
    # What a load balancer and a router call by themselves over plain HTTP (SecurityMiddleware matches the path
    # without its leading slash); everything else is sent to HTTPS.
    exempt = [re.compile(r) for r in got["exempt"]]
    for path in ("health", "health/live", "health_generate", "get_server_info", "server_info", "get_model_info",
                 "model_info", "kv_event_sources", "get_load", "flush_cache", "v1/chat/completions/render",
                 "v1/completions/render"):
        assert any(r.search(path) for r in exempt), path
    for path in ("v1/models", "v1/chat/completions", "healthz", "get_model_info/x", "admin/"):
        assert not any(r.search(path) for r in exempt), path


def test_without_a_secret_key_it_refuses_to_start():
    done = run("manage.py", "check", DJANGO_SECRET_KEY="")
    assert done.returncode != 0 and "DJANGO_SECRET_KEY must be set" in done.stderr
