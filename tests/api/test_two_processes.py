"""Two daphne processes on one database: they share one Redis budget (a debit in one is seen by
the other), and each owns its background responses (a second process leaves the first one's
alone while it lives, and takes them over once it dies).

Runs on the default SQLite file and on the production database, the real PostgreSQL on
127.0.0.1:5432 (a fresh database per run, dropped afterwards); the module's two tests share each
migrated database. Also drives the management commands (migrate on PostgreSQL, create_tenant,
create_api_key) and the official openai SDK against the live server."""
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from inference.bench.live_server import migrated_sqlite

from .conftest import REDIS_URL, redis_reachable

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
# The polls' client: a bare httpx.get builds a client, and with it an SSL context that loads the CA
# bundle, at every call (about 50 ms of CPU each, five times a second while a test waits).
HTTP = httpx.Client(timeout=10)


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
            HTTP.get(url + "/health", timeout=1.0)
            return
        except httpx.TransportError:
            time.sleep(0.2)
    raise AssertionError(f"daphne at {url} did not come up in {timeout_s} s")


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def database_env(tmp_path_factory, request):
    """The environment of server processes sharing one migrated database: the default SQLite
    file (a copy of one migrated once, live_server.migrated_sqlite), or a fresh PostgreSQL
    database that `manage.py migrate` brings up (dropped afterwards). The module's tests share it."""
    sqlite_path = tmp_path_factory.mktemp("db") / "db.sqlite3"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "metrale_site.settings",
           "METRALE_SQLITE_PATH": str(sqlite_path), "PYTHONUNBUFFERED": "1"}
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
    try:
        if db_name:
            manage(env, "migrate", "--noinput")
        else:
            migrated_sqlite(sqlite_path, env)
        yield env
    finally:
        if db_name:
            admin = postgres_admin()
            admin.execute(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')
            admin.close()


def start_daphne(env, **extra) -> tuple[str, subprocess.Popen]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
         "metrale_site.asgi:application"],
        cwd=ROOT, env={**env, **extra}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True)
    return f"http://127.0.0.1:{port}", process


def stop(processes):
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


@pytest.fixture
def two_servers(database_env):
    if not redis_reachable():
        pytest.skip(f"Redis is not reachable at {REDIS_URL}")
    prefix = f"metrale-test-{uuid.uuid4().hex}"
    env = {**database_env, "REDIS_URL": REDIS_URL, "METRALE_CACHE_KEY_PREFIX": prefix,
           "METRALE_LOAD_ON_START": "0", "METRALE_REQUIRE_AUTH": "1"}
    manage(env, "create_tenant", "acme", "--rpm", "3")
    key = manage(env, "create_api_key", "acme", "--name", "two-process test").strip()

    processes, urls = [], []
    try:
        for _ in range(2):
            url, process = start_daphne(env)
            processes.append(process)
            urls.append(url)
        for url, process in zip(urls, processes):
            wait_until_up(url, process)
        yield urls, key
    finally:
        stop(processes)
        import redis

        client = redis.Redis.from_url(REDIS_URL)
        keys = list(client.scan_iter(match=f"{prefix}:*"))
        if keys:
            client.delete(*keys)


def test_the_second_process_sees_the_first_ones_debits(two_servers):
    (first, second), key = two_servers
    auth = {"Authorization": f"Bearer {key}"}

    assert HTTP.get(first + "/v1/models").status_code == 401
    remaining = [HTTP.get(url + "/v1/models", headers=auth).headers["x-ratelimit-remaining-requests"]
                 for url in (first, first, second)]
    assert remaining == ["2", "1", "0"]  # the second process counted the first one's two

    denied = HTTP.get(second + "/v1/models", headers=auth)
    assert denied.status_code == 429
    assert denied.json()["error"]["param"] == "requests"
    assert int(denied.headers["retry-after"]) >= 1
    assert HTTP.get(first + "/v1/models", headers=auth).status_code == 429

    from openai import OpenAI, RateLimitError

    sdk = OpenAI(base_url=first + "/v1", api_key=key, max_retries=0)
    with pytest.raises(RateLimitError) as caught:
        sdk.models.list()
    assert caught.value.response.headers["x-ratelimit-limit-requests"] == "3"


def test_a_second_process_leaves_the_first_ones_responses_alone_until_it_dies(database_env,
                                                                             smollm2_blocks_dir):
    from responses_api.store import RESTART_MESSAGE
    from tests.stream_checks import check_responses_stream, sse_data

    env = {**database_env, "METRALE_HEARTBEAT_INTERVAL": "0.5", "METRALE_HEARTBEAT_GRACE": "3"}
    # The pulled model's GGUF blocks load as they are (the float32 folder's linears are quantized to
    # int8 at every load). The long response only has to be still decoding when the first process is
    # killed: one engine thread, not a team on every core, keeps it doing so (and loads the model
    # without a second thread spinning between the load's parallel regions, libgomp's wait).
    first, first_process = start_daphne(env, METRALE_MODEL=str(smollm2_blocks_dir),
                                        METRALE_KV_CACHE_BYTES=str(128 << 20), METRALE_NUM_THREADS="1")
    second = second_process = None
    try:
        wait_until_up(first, first_process, timeout_s=180)
        deadline = time.monotonic() + 180
        while HTTP.get(first + "/health").status_code != 200:
            assert time.monotonic() < deadline, "the model did not load"
            time.sleep(0.2)

        def create(max_output_tokens):
            return HTTP.post(first + "/v1/responses", timeout=30, json={
                "model": "smollm2-135m-instruct", "input": "Count from one to a thousand.", "background": True,
                "max_output_tokens": max_output_tokens, "ignore_eos": True}).json()["id"]

        finishing, running = create(40), create(2000)
        # The second process has no model to load; it starts, runs the restart rule and beats
        # (and sweeps) every half second all the same.
        second, second_process = start_daphne(env, METRALE_MODEL=str(ROOT / "no-such-model"))
        wait_until_up(second, second_process)
        while HTTP.get(second + "/health").json().get("status") != "failed":
            time.sleep(0.2)

        def status(rid):
            return HTTP.get(f"{second}/v1/responses/{rid}").json()["status"]

        deadline = time.monotonic() + 120
        while status(finishing) == "in_progress":
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert status(finishing) == "incomplete"  # it ran to max_output_tokens in the first
        assert status(running) == "in_progress"
        final = check_responses_stream(sse_data(HTTP.get(
            f"{second}/v1/responses/{finishing}", params={"stream": "true"}, timeout=30).text))
        assert final["incomplete_details"] == {"reason": "max_output_tokens"}

        first_process.kill()  # the first replica dies; the second takes its work over
        first_process.wait()
        deadline = time.monotonic() + 30
        while status(running) == "in_progress":
            assert time.monotonic() < deadline, "the second process did not take over"
            time.sleep(0.2)
        body = HTTP.get(f"{second}/v1/responses/{running}").json()
        assert body["status"] == "failed" and body["error"]["message"] == RESTART_MESSAGE
        final = check_responses_stream(sse_data(HTTP.get(
            f"{second}/v1/responses/{running}", params={"stream": "true"}, timeout=30).text))
        assert final == body and body["output"][0]["content"][0]["text"]
    finally:
        stop([p for p in (first_process, second_process) if p is not None])
