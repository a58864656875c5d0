"""manage.py cluster start | stop: replicas on the production settings behind vllm-router, and a batch worker (`make cluster`).

`start` checks PostgreSQL (DATABASE_URL, default postgresql://postgres@127.0.0.1:5432/metrale_cluster, created when
missing) and Redis (REDIS_URL, default redis://127.0.0.1:6379/0) and names whichever is not running; migrates and
collects the static files under the production settings; makes a tenant "cluster" and its API key the first time;
then starts, each in a session of its own so they outlive the command: `--replicas` daphne replicas on the ports
after `--port`, each publishing its KV events (METRALE_KV_EVENTS), `manage.py batch_worker` (batches queued on Redis
db 1, or CELERY_BROKER_URL), and vllm-router on `--port` with `--policy` (kv_aware). It returns once the router has
every replica healthy. Plain HTTP on this machine: the HTTPS redirect and secure cookies are off. What it started
is in <data dir>/cluster/pids.json, the logs beside it; `stop` ends them (the router first, then the replicas
drain, then the worker).
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

from django.core.management.base import BaseCommand, CommandError

from inference.bench.cluster import Replica, Router, create_database, manage, replica_env, router_command
from inference.bench.live_server import MANAGE, ROOT
from metrale_site.paths import data_dir

DEFAULT_DATABASE = "postgresql://postgres@127.0.0.1:5432/metrale_cluster"
DEFAULT_REDIS = "redis://127.0.0.1:6379/0"
STOP_WAIT_S = 45  # the replicas' drain (METRALE_SHUTDOWN_GRACE, 15 s) and the worker's current line


def reachable(url: str, default_port: int) -> bool:
    """Whether something accepts TCP connections at `url`'s host and port."""
    parsed = urlparse(url)
    try:
        with socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or default_port), timeout=2):
            return True
    except OSError:
        return False


def missing_services(database_url: str, redis_url: str) -> list[str]:
    """One line per service the cluster needs that is not running (empty when both are)."""
    missing = []
    for name, url, port, setting in (("PostgreSQL", database_url, 5432, "DATABASE_URL"),
                                     ("Redis", redis_url, 6379, "REDIS_URL")):
        if not reachable(url, port):
            parsed = urlparse(url)
            missing.append(f"{name} is not running at {parsed.hostname}:{parsed.port or port} ({setting}={url}): "
                           f"start it, or set {setting} to one that runs.")
    return missing


def alive(pid: int, marker: str) -> bool:
    """Whether process `pid` runs and is the one we started (its command line holds `marker`)."""
    try:
        return marker in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False


class Command(BaseCommand):
    help = "Start (or stop) replicas on the production settings behind vllm-router, with a batch worker."

    def add_arguments(self, parser):
        parser.add_argument("action", choices=("start", "stop"))
        parser.add_argument("--replicas", type=int, default=2, help="replicas to start (default 2)")
        parser.add_argument("--host", default="127.0.0.1", help="the router's address (default 127.0.0.1)")
        parser.add_argument("--port", type=int, default=8000, help="the router's port; replicas take the next ones")
        parser.add_argument("--policy", default="kv_aware", help="vllm-router's --policy (default kv_aware)")
        parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL") or DEFAULT_DATABASE)
        parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL") or DEFAULT_REDIS)

    def handle(self, *args, action, **options):
        logging.getLogger("httpx").setLevel(logging.WARNING)  # the readiness polls are not news
        folder = data_dir() / "cluster"
        folder.mkdir(parents=True, exist_ok=True)
        if action == "stop":
            return self.stop(folder)
        return self.start(folder, **options)

    # --- start ---

    def start(self, folder: Path, *, replicas, host, port, policy, database_url, redis_url, **_):
        if replicas < 1:
            raise CommandError("--replicas must be at least 1")
        problems = missing_services(database_url, redis_url)
        try:
            router_command()
        except FileNotFoundError as exc:
            problems.append(f"{exc}.")
        if problems:
            raise CommandError("the cluster cannot start:\n  " + "\n  ".join(problems))
        if self.running(folder):
            raise CommandError(f"a cluster is running already ({folder / 'pids.json'}); `make cluster-stop` first")
        create_database(database_url)
        redis = urlparse(redis_url)
        env = replica_env(database_url, redis_url, self.secret_key(folder),
                          CELERY_BROKER_URL=os.environ.get("CELERY_BROKER_URL")
                          or f"redis://{redis.hostname}:{redis.port or 6379}/1",
                          METRALE_CACHE_KEY_PREFIX="metrale-cluster", DJANGO_SECURE_SSL_REDIRECT="0",
                          DJANGO_SECURE_COOKIES="0", PYTHONUNBUFFERED="1")
        self.stdout.write(f"Migrating {database_url} and collecting the static files ...")
        manage(env, "migrate", "--noinput", "-v", "0")
        manage(env, "collectstatic", "--noinput", "-v", "0")
        key = self.api_key(folder, env)
        started = [Replica(env, folder / f"replica-{i + 1}", port=port + 1 + i, detached=True).start()
                   for i in range(replicas)]
        worker_log = open(folder / "worker.log", "a")
        worker = subprocess.Popen([sys.executable, *MANAGE, "batch_worker", "--loglevel", "INFO"], cwd=ROOT,
                                  env={**os.environ, **env, "METRALE_KV_EVENTS": '{"publisher": "null"}'},
                                  stdout=worker_log, stderr=subprocess.STDOUT, start_new_session=True)
        router = Router([r.url for r in started], policy, folder / "router.log", port=port, host=host,
                        health_interval_s=5, detached=True)
        (folder / "pids.json").write_text(json.dumps({
            "router": router.proc.pid, "replicas": [r.server.proc.pid for r in started], "worker": worker.pid}))
        self.stdout.write(f"Starting {replicas} replicas, a batch worker and vllm-router ({policy}) ...")
        try:
            for replica in started:
                replica.wait_ready(600)
            router.wait_ready(120)
        except RuntimeError as exc:
            self.stop(folder)
            raise CommandError(f"the cluster did not start: {exc}") from exc
        self.stdout.write(self.style.SUCCESS(
            f"vllm-router ({policy}) on http://{host}:{port} in front of {', '.join(r.url for r in started)}; "
            f"a batch worker; PostgreSQL {database_url}, Redis {redis_url}."))
        self.stdout.write(f"API key of tenant \"cluster\": {key}")
        self.stdout.write(f"Logs in {folder}; `make cluster-stop` ends it.")

    def secret_key(self, folder: Path) -> str:
        """The replicas' shared SECRET_KEY, made once and kept in the cluster folder (tenants' prefix-cache salts and
        sessions stay valid across restarts)."""
        path = folder / "secret_key"
        if not path.is_file():
            path.write_text(secrets.token_urlsafe(50))
            path.chmod(0o600)
        return path.read_text().strip()

    def api_key(self, folder: Path, env: dict[str, str]) -> str:
        """The API key of tenant "cluster", made the first time (kept, 0600, in the cluster folder)."""
        path = folder / "api_key"
        if not path.is_file():
            manage(env, "create_tenant", "cluster")
            path.write_text(manage(env, "create_api_key", "cluster", "--name", "make cluster").strip())
            path.chmod(0o600)
        return path.read_text().strip()

    # --- stop ---

    def running(self, folder: Path) -> dict | None:
        path = folder / "pids.json"
        if not path.is_file():
            return None
        pids = json.loads(path.read_text())
        live = {"router": [p for p in [pids["router"]] if alive(p, "router")],
                "replicas": [p for p in pids["replicas"] if alive(p, "daphne")],
                "worker": [p for p in [pids["worker"]] if alive(p, "batch_worker")]}
        return live if any(live.values()) else None

    def stop(self, folder: Path) -> None:
        live = self.running(folder)
        if live is None:
            (folder / "pids.json").unlink(missing_ok=True)
            self.stdout.write("No cluster is running.")
            return
        markers = {"router": "router", "replicas": "daphne", "worker": "batch_worker"}
        started = [(pid, markers[group]) for group in ("router", "replicas", "worker") for pid in live[group]]
        for pid, _ in started:  # routing first, then the drains
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT_S
        while time.monotonic() < deadline and any(alive(pid, marker) for pid, marker in started):
            time.sleep(0.2)
        for pid, marker in started:
            if alive(pid, marker):
                os.kill(pid, signal.SIGKILL)
        (folder / "pids.json").unlink(missing_ok=True)
        self.stdout.write(f"Stopped the router, {len(live['replicas'])} replicas and the batch worker.")
