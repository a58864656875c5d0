"""Batches on a real broker: the API server stores and reports, `manage.py batch_worker` processes run them (on
Redis and on RabbitMQ, sharing PostgreSQL); a worker killed mid-batch is replaced and no line runs twice."""
import json

import openai
import pytest

from inference.bench.live_server import LiveServer
from tests.batch_checks import chat_lines, check_every_line_once, create_batch, wait_batch
from tests.faults.live import wait_for

from .conftest import Worker, deployment_env, pg_rows

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture
def deployment(smollm2_dir, tmp_path, postgres_url, redis_url, broker):
    """(API server, env, database URL) with CELERY_BROKER_URL set: the server runs no batch itself."""
    url, queue = broker
    env = deployment_env(smollm2_dir, tmp_path / "files", DATABASE_URL=postgres_url, REDIS_URL=redis_url,
                         CELERY_BROKER_URL=url, METRALE_BATCH_QUEUE=queue, METRALE_BATCH_VISIBILITY_TIMEOUT="10",
                         METRALE_CACHE_KEY_PREFIX=f"t-{queue}")
    server = LiveServer(env, tmp_path / "server")
    try:
        server.wait_ready()
        yield server, env, postgres_url
    finally:
        server.stop()


def written(db_url: str, batch_id: str) -> dict[str, str]:
    return {c: json.loads(d)["id"] for c, d in pg_rows(
        db_url, "select custom_id, data from batches_batchresult where batch_id = %s", batch_id)}


def test_a_worker_killed_mid_batch_is_replaced_and_no_line_runs_twice(deployment, tmp_path):
    """The server stores the batch and leaves it validating; a worker process takes it (its pid in the batch's
    owner), is killed after two lines, and a second worker finishes it with each line written once."""
    server, env, db_url = deployment
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0, timeout=60)
    rows = chat_lines(12, max_tokens=16)
    batch = create_batch(client, rows)
    assert wait_batch(client, batch.id, statuses=("validating",), timeout_s=5).status == "validating"
    first = Worker(env, tmp_path / "first.log")
    try:
        wait_for(lambda: len(written(db_url, batch.id)) >= 2, 300, "two lines written by the first worker")
        owner = pg_rows(db_url, "select worker from batches_batch where id = %s", batch.id)[0][0]
        assert f":{first.proc.pid}:" in owner  # the worker runs it, not the server
        first.kill()
        before = written(db_url, batch.id)
        assert len(before) < len(rows), "the batch finished before the kill: nothing was tested"
    finally:
        first.stop()
    second = Worker(env, tmp_path / "second.log")
    try:
        done = wait_batch(client, batch.id, timeout_s=400)
        check_every_line_once(client, done, rows, before)
        owner = pg_rows(db_url, "select worker from batches_batch where id = %s", batch.id)[0][0]
        assert f":{second.proc.pid}:" in owner
        assert "Traceback" not in second.log() and "Traceback" not in server.log()
    finally:
        second.stop()
