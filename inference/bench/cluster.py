"""A cluster on one machine: replicas (daphne on the production settings, sharing PostgreSQL and Redis, each
publishing KV events) behind vllm-router. Used by `manage.py cluster`, `manage.py bench_router` and the
router tests (tests/services/test_router_cluster.py)."""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import httpx

from .live_server import MANAGE, ROOT, LiveServer, free_port, stop_process

# What the load balancer that ends TLS in front of the router adds (production settings redirect
# plain-HTTP API requests to HTTPS without it; the router passes a client's headers on).
PROXY = {"X-Forwarded-Proto": "https"}
POLICIES = ("kv_aware", "cache_aware", "round_robin", "power_of_two", "random")


def replica_env(database_url: str, redis_url: str, secret_key: str, **extra: str) -> dict[str, str]:
    """A replica's environment on the production settings: PostgreSQL, Redis (cache, rate limits, channel
    layer), the shared SECRET_KEY (it salts each tenant's prefix cache: replicas must agree), `extra` last."""
    return {"DJANGO_SETTINGS_MODULE": "metrale_site.settings_production", "DJANGO_SECRET_KEY": secret_key,
            "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost", "DATABASE_URL": database_url, "REDIS_URL": redis_url,
            **extra}


def manage(env: dict[str, str], *args: str, timeout_s: float = 300) -> str:
    """Run `manage.py ARGS` under `env` (added to this process's environment); its stdout. Raises
    CalledProcessError naming its stderr."""
    result = subprocess.run([sys.executable, *MANAGE, *args], cwd=ROOT, env={**os.environ, **env},
                            capture_output=True, text=True, timeout=timeout_s)
    if result.returncode:
        raise subprocess.CalledProcessError(result.returncode, args, result.stdout, result.stderr)
    return result.stdout


def _admin_url(database_url: str) -> str:
    return urlparse(database_url)._replace(path="/postgres").geturl().replace("postgres://", "postgresql://", 1)


def create_database(database_url: str) -> None:
    """Create the PostgreSQL database `database_url` names when it does not exist (through its server's `postgres`
    database). Raises psycopg.Error."""
    import psycopg

    name = urlparse(database_url).path.lstrip("/")
    with psycopg.connect(_admin_url(database_url), autocommit=True, connect_timeout=5) as con:
        if con.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None:
            con.execute(f'CREATE DATABASE "{name}"')


@contextlib.contextmanager
def scratch_database(server_url: str) -> Iterator[str]:
    """A new PostgreSQL database on the server of `server_url` (any database URL there) as a URL, dropped after."""
    import psycopg

    url = urlparse(server_url)._replace(path=f"/metrale_{secrets.token_hex(4)}").geturl()
    create_database(url)
    try:
        yield url
    finally:
        with psycopg.connect(_admin_url(url), autocommit=True, connect_timeout=5) as con:
            con.execute(f'DROP DATABASE IF EXISTS "{urlparse(url).path.lstrip("/")}" WITH (FORCE)')


# One `manage.py shell` run: migrate, then make each tenant (create_tenant's options) and one API key of it; prints
# {tenant: key} as JSON on its last line.
_PREPARE = """
import io, json
from django.core.management import call_command
call_command("migrate", "--noinput", verbosity=0)
keys = {}
for name, options in json.loads(%r).items():
    call_command("create_tenant", name, *options, stdout=io.StringIO())
    out = io.StringIO()
    call_command("create_api_key", name, "--name", "cluster", stdout=out)
    keys[name] = out.getvalue().strip()
print(json.dumps(keys))
"""


def prepare_database(env: dict[str, str], tenants: dict[str, list[str]]) -> dict[str, str]:
    """Migrate the database of `env` and make `tenants` (name -> create_tenant's options, e.g. ["--rpm", "4"]), in
    one Django start-up. Returns each tenant's new API key."""
    out = manage(env, "shell", "-c", _PREPARE % json.dumps(tenants))
    return json.loads(out.strip().splitlines()[-1])


class Replica:
    """One replica: daphne on `port` (default a free one) with its KV events on a PUB and a replay port of its
    own, restartable on the same ports (a router keeps its URL and event sources). detached: in a session of its
    own, so it outlives this process (manage.py cluster)."""

    def __init__(self, env: dict[str, str], workdir: Path, *, port: int | None = None, detached: bool = False):
        self.workdir = workdir
        self.detached = detached
        self.port = port or free_port()
        self.events_port, self.replay_port = free_port(), free_port()
        self.env = {**env, "METRALE_KV_EVENTS": json.dumps(
            {"endpoint": f"tcp://*:{self.events_port}", "replay_endpoint": f"tcp://*:{self.replay_port}"})}
        self.server: LiveServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Replica:
        """Start the process (the database migrated already); returns at once (wait_ready waits)."""
        self.server = LiveServer(self.env, self.workdir, port=self.port, migrate=False,
                                 preexec=os.setsid if self.detached else None)
        return self

    def wait_ready(self, timeout_s: float = 300) -> Replica:
        self.server.wait_ready(timeout_s)
        return self

    def signal(self, sig: int) -> None:
        self.server.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL: the process ends at once, mid-request (nothing when it has ended already)."""
        if self.server is not None and self.server.proc.poll() is None:
            self.signal(signal.SIGKILL)
            self.server.proc.wait()

    def stop(self) -> None:
        if self.server is not None and self.server.proc.poll() is None:
            self.server.stop()


def router_command() -> list[str]:
    """vllm-router's command: the console script beside this interpreter (its virtual environment), or on PATH.
    Raises FileNotFoundError naming the package when neither exists."""
    beside = Path(sys.executable).with_name("vllm-router")
    found = str(beside) if beside.is_file() else shutil.which("vllm-router")
    if found is None:
        raise FileNotFoundError("vllm-router is not installed (pip install vllm-router==0.1.17)")
    return [found]


class Router:
    """vllm-router (the PyPI package's binary) on `port` in front of `workers` (URLs) with `policy`.

    kv_aware finds each worker's KV event sources itself (/get_server_info, /kv_event_sources). Health checks
    every `health_interval_s` seconds, a worker marked down after `failures` failed checks in a row (the
    router's defaults are 60 s and 3). Its log goes to `log_path`; `host` is the address it listens on;
    detached: in a session of its own (it outlives this process)."""

    def __init__(self, workers: list[str], policy: str, log_path: Path, *, port: int | None = None,
                 host: str = "127.0.0.1", health_interval_s: int = 1, failures: int = 2,
                 extra: tuple[str, ...] = (), detached: bool = False):
        self.workers = list(workers)
        self.policy = policy
        self.port = port or free_port()
        self.log_path = log_path
        self._log = open(log_path, "a")
        argv = [*router_command(), "--host", host, "--port", str(self.port), "--policy", policy,
                "--worker-urls", *self.workers, "--prometheus-port", str(free_port()),
                "--worker-startup-check-interval", "1", "--health-check-interval-secs", str(health_interval_s),
                "--health-failure-threshold", str(failures), "--health-success-threshold", "1",
                "--health-check-timeout-secs", "2", "--log-level", "warning", *extra]
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=detached)
        # health()'s client, kept for every poll (a new httpx client builds an SSL context: ~50 ms of CPU)
        self._http = httpx.Client(timeout=5)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def health(self) -> dict[str, bool]:
        """Each worker URL -> whether the router takes it as healthy now (its /workers)."""
        body = self._http.get(self.url + "/workers").json()
        return {w["url"]: w["is_healthy"] for w in body["workers"]}

    def wait_ready(self, timeout_s: float = 300) -> Router:
        """Wait until every worker is healthy in the router. Raises RuntimeError with the log's tail."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm-router exited: {self.log()[-3000:]}")
            try:
                health = self.health()
                if len(health) == len(self.workers) and all(health.values()):
                    return self
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"vllm-router not ready in {timeout_s} s: {self.log()[-3000:]}")

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        stop_process(self.proc)
        self._http.close()
        self._log.close()
