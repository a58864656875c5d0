"""Two daphne replicas on the production settings sharing PostgreSQL and Redis, reached as a load balancer
that ends TLS reaches them (plain HTTP with X-Forwarded-Proto: https): a response stored on one is read,
continued and deleted on the other, a batch made on one is reported on the other, and rate limits are shared."""
import os
import secrets
import subprocess
import sys

import httpx
import openai
import pytest

from inference.bench.live_server import ROOT, LiveServer
from tests.batch_checks import chat_lines, check_every_line_once, create_batch, wait_batch

from .conftest import deployment_env, postgres_database, redis_server_url

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PROXY = {"X-Forwarded-Proto": "https"}  # what the load balancer in front adds


@pytest.fixture(scope="module")
def replicas(smollm2_dir, tmp_path_factory):
    """(replica A, replica B, keys by tenant: "owner" unlimited, "limited" at 4 requests a minute)."""
    with postgres_database() as postgres_url:
        yield from _replicas(smollm2_dir, tmp_path_factory.mktemp("replicas"), postgres_url, redis_server_url())


def _replicas(smollm2_dir, tmp_path, postgres_url, redis_url):
    env = deployment_env(smollm2_dir, tmp_path / "files", DATABASE_URL=postgres_url, REDIS_URL=redis_url,
                         METRALE_CACHE_KEY_PREFIX=f"replicas-{secrets.token_hex(4)}",
                         DJANGO_SETTINGS_MODULE="metrale_site.settings_production",
                         DJANGO_SECRET_KEY=secrets.token_urlsafe(50), DJANGO_ALLOWED_HOSTS="127.0.0.1,localhost")
    servers = [LiveServer(env, tmp_path / "a")]
    try:
        def manage(*args):
            return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env={**os.environ, **env},
                                  check=True, capture_output=True, text=True).stdout.strip()

        manage("create_tenant", "owner")
        manage("create_tenant", "limited", "--rpm", "4", "--burst-rpm", "4")
        keys = {name: manage("create_api_key", name, "--name", "replicas") for name in ("owner", "limited")}
        servers.append(LiveServer(env, tmp_path / "b"))
        for server in servers:
            server.wait_ready()
        yield servers[0], servers[1], keys
    finally:
        for server in servers:
            server.stop()


def client(server, key):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=60, default_headers=PROXY)


def test_a_response_stored_on_one_replica_is_read_continued_and_deleted_on_the_other(replicas):
    a, b, keys = replicas
    on_a, on_b = client(a, keys["owner"]), client(b, keys["owner"])
    first = on_a.responses.create(model="smollm2-135m-instruct", input="Say hi.", max_output_tokens=4)
    read = on_b.responses.retrieve(first.id)
    assert (read.id, read.output_text, read.status) == (first.id, first.output_text, first.status)
    follow = on_b.responses.create(model="smollm2-135m-instruct", input="Again.", previous_response_id=first.id, max_output_tokens=4)
    assert follow.previous_response_id == first.id and follow.usage.input_tokens > first.usage.input_tokens
    assert on_a.responses.retrieve(follow.id).id == follow.id
    on_b.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        on_a.responses.retrieve(first.id)


def test_a_batch_made_on_one_replica_is_reported_on_the_other(replicas):
    a, b, keys = replicas
    rows = chat_lines(3)
    batch = create_batch(client(a, keys["owner"]), rows)
    on_b = client(b, keys["owner"])
    done = wait_batch(on_b, batch.id, timeout_s=300)
    check_every_line_once(on_b, done, rows, {})


def test_rate_limits_are_shared_by_the_replicas(replicas):
    a, b, keys = replicas
    headers = {"Authorization": f"Bearer {keys['limited']}", **PROXY}
    statuses = [httpx.get(server.url + "/v1/models", headers=headers, timeout=30).status_code
                for server in (a, b, a, b, a, b)]
    assert statuses[:4] == [200] * 4 and statuses[4:] == [429, 429]


def test_plain_http_without_the_balancers_header_is_sent_to_https_but_health_probes(replicas):
    a, _, keys = replicas
    plain = httpx.get(a.url + "/v1/models", headers={"Authorization": f"Bearer {keys['owner']}"}, timeout=30)
    assert plain.status_code == 301 and plain.headers["location"].startswith("https://")
    assert httpx.get(a.url + "/health", timeout=30).status_code == 200
    secure = httpx.get(a.url + "/v1/models", headers={"Authorization": f"Bearer {keys['owner']}", **PROXY},
                       timeout=30)
    assert secure.status_code == 200 and "max-age=31536000" in secure.headers["strict-transport-security"]
