"""The real services of a deployment for the tests of this folder: a fresh PostgreSQL database, Redis, RabbitMQ.

Each fixture skips its test, saying which service is absent, only when that service cannot be
reached; what it makes (a database, queues, cache keys) is named uniquely and removed afterwards.
"""
from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from inference.bench.live_server import ROOT

PG = ("127.0.0.1", 5432)
REDIS = ("127.0.0.1", 6379)
RABBITMQ = ("127.0.0.1", 5672)


def reachable(address: tuple[str, int]) -> bool:
    try:
        with socket.create_connection(address, timeout=1):
            return True
    except OSError:
        return False


def need(address: tuple[str, int], name: str) -> None:
    if not reachable(address):
        pytest.skip(f"{name} is not running on {address[0]}:{address[1]}")


@contextlib.contextmanager
def postgres_database():
    """A new, empty PostgreSQL database (user postgres, trust auth) as a URL, dropped afterwards."""
    need(PG, "PostgreSQL")
    import psycopg

    name = f"metrale_t_{secrets.token_hex(4)}"
    with psycopg.connect(host=PG[0], port=PG[1], user="postgres", dbname="postgres", autocommit=True) as con:
        con.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgres://postgres@{PG[0]}:{PG[1]}/{name}"
    finally:
        with psycopg.connect(host=PG[0], port=PG[1], user="postgres", dbname="postgres", autocommit=True) as con:
            con.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def postgres_url():
    with postgres_database() as url:
        yield url


def redis_server_url() -> str:
    """The Redis URL (db 0); skips the test when Redis is not running."""
    need(REDIS, "Redis")
    return f"redis://{REDIS[0]}:{REDIS[1]}/0"


@pytest.fixture
def redis_url():
    return redis_server_url()


BROKERS = {"redis": (REDIS, "Redis", f"redis://{REDIS[0]}:{REDIS[1]}/1"),
           "rabbitmq": (RABBITMQ, "RabbitMQ", f"amqp://guest:guest@{RABBITMQ[0]}:{RABBITMQ[1]}//")}


@pytest.fixture(params=list(BROKERS))
def broker(request):
    """(broker URL, a queue name of this test's own) on Redis, then on RabbitMQ; the queue is deleted after."""
    address, name, url = BROKERS[request.param]
    need(address, name)
    queue = f"batches-test-{secrets.token_hex(4)}"
    yield url, queue
    from kombu import Connection, Queue

    with Connection(url) as con:
        try:
            Queue(queue, channel=con.default_channel).delete()
        except Exception:  # noqa: BLE001  (never declared: nothing to delete)
            pass


def deployment_env(smollm2_dir: Path, files: Path, **extra: str) -> dict[str, str]:
    """A replica's environment: SmolLM2 with a small KV pool, files in `files`, fast heartbeats."""
    return {"METRALE_MODEL": str(smollm2_dir), "METRALE_KV_CACHE_BYTES": str(64 << 20),
            "METRALE_FILES_DIR": str(files), "METRALE_HEARTBEAT_INTERVAL": "1", **extra}


class Worker:
    """`manage.py batch_worker` as a process of its own (log in `log_path`)."""

    def __init__(self, env: dict[str, str], log_path: Path):
        self.log_path = log_path
        self._log = open(log_path, "a")
        self.proc = subprocess.Popen([sys.executable, "manage.py", "batch_worker", "--loglevel", "INFO"], cwd=ROOT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1", **env}, stdout=self._log,
                                     stderr=subprocess.STDOUT)

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()


def pg_rows(url: str, sql: str, *args) -> list[tuple]:
    """Rows of a query on the test's PostgreSQL database."""
    import psycopg

    with psycopg.connect(url.replace("postgres://", "postgresql://"), autocommit=True) as con:
        return con.execute(sql, args).fetchall()
