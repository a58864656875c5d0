"""Start and stop a daphne server process for benchmarks and end-to-end tests."""
from __future__ import annotations

import atexit
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
# Django's commands: manage.py in a checkout; for an installed package (ROOT is site-packages) the `metrale`
# command's module and its `manage` passthrough.
MANAGE = ["manage.py"] if (ROOT / "manage.py").is_file() else ["-m", "metrale_site.cli", "manage"]


# Parallel test processes (pytest-xdist's workers gw0, gw1, ...) each take ports from a range of their
# own, below Linux's ephemeral range (32768-60999): a port one process found free and handed to its server
# is then never handed out by another process before that server binds it (with bind(0), two processes
# can get the same port, and a server's /health poll could reach the other's server).
WORKER_PORT_BASE = 20000
WORKER_PORT_SPAN = 500
_worker_ports = threading.Lock()
_worker_next: int | None = None


def _xdist_worker() -> int | None:
    """The index of this pytest-xdist worker (PYTEST_XDIST_WORKER=gwN), None outside xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else None


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def stop_process(proc: subprocess.Popen, grace_s: float = 10) -> None:
    """End `proc`: SIGTERM, then SIGKILL if it has not exited within `grace_s` seconds; waits for it (so no
    zombie is left). A process that has exited already is only reaped."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now: the kernel's choice, or under pytest-xdist the next
    free one of this worker's range (WORKER_PORT_BASE + index * WORKER_PORT_SPAN, WORKER_PORT_SPAN ports,
    taken in turn). Raises RuntimeError when a worker's whole range is taken."""
    global _worker_next
    worker = _xdist_worker()
    if worker is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    base = WORKER_PORT_BASE + worker * WORKER_PORT_SPAN
    with _worker_ports:
        start = _worker_next if _worker_next is not None else 0
        for step in range(WORKER_PORT_SPAN):
            offset = (start + step) % WORKER_PORT_SPAN
            if _bindable(base + offset):
                _worker_next = offset + 1
                return base + offset
    raise RuntimeError(f"no free port in {base}-{base + WORKER_PORT_SPAN - 1}")


_template_lock = threading.Lock()
_template_db: Path | None = None


def migrated_sqlite(db: Path, env: dict[str, str]) -> None:
    """Give the new SQLite file `db` every migration: a copy (SQLite's online backup) of one database this
    process migrated once with `manage.py migrate` under `env`, so each server after the first skips the
    migrate command (seconds of Django start-up and DDL each)."""
    global _template_db
    with _template_lock:
        if _template_db is None:
            folder = Path(tempfile.mkdtemp(prefix="metrale-migrated-"))
            atexit.register(shutil.rmtree, folder, True)
            template = folder / "db.sqlite3"
            subprocess.run([sys.executable, *MANAGE, "migrate", "--noinput", "-v", "0"], cwd=ROOT,
                           env={**env, "METRALE_SQLITE_PATH": str(template)}, check=True)
            _template_db = template
    source, target = sqlite3.connect(_template_db), sqlite3.connect(db)
    try:
        source.backup(target)
    finally:
        source.close()
        target.close()


class LiveServer:
    """A daphne process on a free port with its own SQLite file; output goes to `log_path`.

    env: extra environment variables (METRALE_MODEL, METRALE_DTYPE, ...). A server started again
    with the same workdir uses the same database (a restart) and appends to the same log.
    via_serve: run `manage.py serve` (daphne in a server process it restarts) instead of daphne.
    preexec: called in the child before it runs Python (e.g. to set its CPU affinity or cgroup).
    port: the port to listen on (default: a free one). migrate: bring a DATABASE_URL database up to date
    first (False: the caller migrated it).
    """

    def __init__(self, env: dict[str, str], workdir: Path, *, via_serve: bool = False, preexec=None,
                 port: int | None = None, migrate: bool = True):
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "server.log"
        self.db = workdir / "db.sqlite3"
        full_env = {**os.environ, "METRALE_SQLITE_PATH": str(self.db), "PYTHONUNBUFFERED": "1", **env}
        if "DATABASE_URL" not in full_env and not Path(full_env["METRALE_SQLITE_PATH"]).exists():
            migrated_sqlite(Path(full_env["METRALE_SQLITE_PATH"]), full_env)
        elif migrate:  # another database, or this one again (a restart): migrate brings it up to date
            subprocess.run([sys.executable, *MANAGE, "migrate", "--noinput", "-v", "0"], cwd=ROOT,
                           env=full_env, check=True)
        self._log = open(self.log_path, "a")
        if via_serve:
            argv = [*MANAGE, "serve", "--host", "127.0.0.1", "--port", str(self.port)]
        else:
            argv = ["-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port), "metrale_site.asgi:application"]
        self.proc = subprocess.Popen([sys.executable, *argv], cwd=ROOT, env=full_env, stdout=self._log,
                                     stderr=subprocess.STDOUT, preexec_fn=preexec)

    def wait_ready(self, timeout_s: float = 180, path: str = "/health") -> None:
        """Poll `path` until 200: /health, the default model loaded; /health/live, the process answers HTTP (a
        server that loads no model at start). Raises RuntimeError (with the last answer and the log's tail, the
        polls' own lines left out) if the server dies, reports its load failed (/health's {"status": "failed"}:
        no later poll would answer 200), or times out.

        The polls share one httpx.Client: a bare httpx.get builds a client, and with it an SSL context
        that loads the CA bundle, at every call (about 50 ms of CPU each, five times a second for as
        long as a model loads)."""
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        with httpx.Client(timeout=2) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"server exited: {self.log_tail()}")
                try:
                    answer = client.get(self.url + path)
                except httpx.HTTPError as exc:
                    last = f"{type(exc).__name__}: {exc}"
                else:
                    if answer.status_code == 200:
                        return
                    last = f"{answer.status_code} {answer.text[:1000]}"
                    if answer.status_code == 503 and '"status": "failed"' in answer.text:
                        raise RuntimeError(f"server's load failed ({last}): {self.log_tail()}")
                time.sleep(0.2)
        raise RuntimeError(f"server not ready in {timeout_s}s (last answer: {last}): {self.log_tail()}")

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text()

    def log_tail(self, chars: int = 4000) -> str:
        """The last `chars` characters of the log without the readiness polls' lines (daphne's access line and
        Django's record of each 503 /health, which would fill the tail while a model loads)."""
        lines = [line for line in self.log().splitlines()
                 if not (line.endswith(("/health", "/health/live")) or '"GET /health' in line)]
        return "\n".join(lines)[-chars:]

    def stop(self) -> None:
        stop_process(self.proc)
        self._log.close()

    def __enter__(self):
        self.wait_ready()
        return self

    def __exit__(self, *exc):
        self.stop()
