"""Two daphne processes sharing one Redis budget: a debit in one is seen by the other.

Runs on the default SQLite file and on the production database, the real PostgreSQL on
127.0.0.1:5432 (a fresh database per run, dropped afterwards). Also drives the management commands
(migrate, create_tenant, create_api_key) and the official openai SDK against the live server."""
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from .conftest import REDIS_URL, redis_reachable

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def postgres_admin():
    """An autocommit connection to the PostgreSQL server, or None when it is not reachable."""
    try:
        import psycopg

        return psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=2)
    except Exception:
        return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def manage(env, *args) -> str:
    result = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def wait_until_up(url: str, process: subprocess.Popen, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read()
        try:
            httpx.get(url + "/health", timeout=1.0)
            return
        except httpx.TransportError:
            time.sleep(0.2)
    raise AssertionError(f"daphne at {url} did not come up in {timeout_s} s")


@pytest.fixture(params=["sqlite", "postgresql"])
def two_servers(tmp_path, request):
    if not redis_reachable():
        pytest.skip(f"Redis is not reachable at {REDIS_URL}")
    prefix = f"metrale-test-{uuid.uuid4().hex}"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "metrale_site.settings",
           "METRALE_SQLITE_PATH": str(tmp_path / "db.sqlite3"), "REDIS_URL": REDIS_URL,
           "METRALE_CACHE_KEY_PREFIX": prefix, "METRALE_LOAD_ON_START": "0",
           "METRALE_REQUIRE_AUTH": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("DATABASE_URL", None)
    db_name = None
    if request.param == "postgresql":
        admin = postgres_admin()
        if admin is None:
            pytest.skip(f"PostgreSQL is not reachable at {POSTGRES_URL}")
        db_name = f"metrale_test_{uuid.uuid4().hex[:12]}"
        admin.execute(f'CREATE DATABASE "{db_name}"')
        admin.close()
        env["DATABASE_URL"] = f"postgresql://postgres@127.0.0.1:5432/{db_name}"
    manage(env, "migrate", "--noinput")
    manage(env, "create_tenant", "acme", "--rpm", "3")
    key = manage(env, "create_api_key", "acme", "--name", "two-process test").strip()

    processes, urls = [], []
    try:
        for _ in range(2):
            port = free_port()
            processes.append(subprocess.Popen(
                [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                 "metrale_site.asgi:application"],
                cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
            urls.append(f"http://127.0.0.1:{port}")
        for url, process in zip(urls, processes):
            wait_until_up(url, process)
        yield urls, key
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
        import redis

        client = redis.Redis.from_url(REDIS_URL)
        keys = list(client.scan_iter(match=f"{prefix}:*"))
        if keys:
            client.delete(*keys)
        if db_name:
            admin = postgres_admin()
            admin.execute(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')
            admin.close()


def test_the_second_process_sees_the_first_ones_debits(two_servers):
    (first, second), key = two_servers
    auth = {"Authorization": f"Bearer {key}"}

    assert httpx.get(first + "/v1/models").status_code == 401
    remaining = [httpx.get(url + "/v1/models", headers=auth).headers["x-ratelimit-remaining-requests"]
                 for url in (first, first, second)]
    assert remaining == ["2", "1", "0"]  # the second process counted the first one's two

    denied = httpx.get(second + "/v1/models", headers=auth)
    assert denied.status_code == 429
    assert denied.json()["error"]["param"] == "requests"
    assert int(denied.headers["retry-after"]) >= 1
    assert httpx.get(first + "/v1/models", headers=auth).status_code == 429

    from openai import OpenAI, RateLimitError

    sdk = OpenAI(base_url=first + "/v1", api_key=key, max_retries=0)
    with pytest.raises(RateLimitError) as caught:
        sdk.models.list()
    assert caught.value.response.headers["x-ratelimit-limit-requests"] == "3"
