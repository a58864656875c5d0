"""Batches on a real broker: the API server stores and reports, `manage.py batch_worker` processes run them (on
Redis and on RabbitMQ, sharing PostgreSQL); a worker killed mid-batch is replaced and no line runs twice."""
import json

import openai
import psycopg
import pytest

from inference.bench.live_server import LiveServer
from tests.batch_checks import chat_lines, check_every_line_once, create_batch, wait_batch
from tests.faults.live import wait_for

from .conftest import Worker, deployment_env, pg_rows

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture
def deployment(smollm2_blocks_dir, tmp_path, postgres_url, redis_url, broker):
    """(API server, env, database URL) with CELERY_BROKER_URL set: the server runs no batch itself, so it
    does not load the model at start (the workers, started with `env`, do)."""
    url, queue = broker
    # What is under test is which worker runs which line, not how fast: the pulled model's GGUF blocks load as
    # they are (the float32 folder's linears are quantized to int8 at every load), and one engine thread loads
    # them and runs the lines without a second one spinning between parallel regions (libgomp's wait); a few
    # seconds of CPU less a worker.
    env = deployment_env(smollm2_blocks_dir, tmp_path / "files", DATABASE_URL=postgres_url, REDIS_URL=redis_url,
                         CELERY_BROKER_URL=url, METRALE_BATCH_QUEUE=queue, METRALE_BATCH_VISIBILITY_TIMEOUT="10",
                         METRALE_CACHE_KEY_PREFIX=f"t-{queue}", METRALE_NUM_THREADS="1")
    server = LiveServer({**env, "METRALE_LOAD_ON_START": "0"}, tmp_path / "server")
    try:
        server.wait_ready(path="/health/live")  # /health says "idle" until a request loads the model
        yield server, env, postgres_url
    finally:
        server.stop()


def written(db_url: str, batch_id: str, con=None) -> dict[str, str]:
    """custom_id -> the id of its result line, for each line of the batch written so far (on `con`, an
    autocommit connection to the database, when given)."""
    sql = "select custom_id, data from batches_batchresult where batch_id = %s"
    rows = con.execute(sql, (batch_id,)).fetchall() if con is not None else pg_rows(db_url, sql, batch_id)
    return {c: json.loads(d)["id"] for c, d in rows}


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
        # One connection for the polls, ten a second while the worker loads its model (not a new one each).
        with psycopg.connect(db_url.replace("postgres://", "postgresql://"), autocommit=True) as con:
            wait_for(lambda: len(written(db_url, batch.id, con)) >= 2, 300,
                     "two lines written by the first worker")
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
