"""`manage.py serve` live: a server process whose engine thread dies (it exits with status 70) or
that is killed is started again, SIGTERM is passed on and drains it, a port that is taken is
retried with a backoff, and --no-restart serves in the command's own process. Only the first
test loads a model: elsewhere the server process itself is what is under test."""
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from inference.bench.live_server import ROOT, LiveServer, free_port
from inference.operations.runtime import ENGINE_DIED_EXIT_STATUS

from .live import answering, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NO_MODEL = {"METRALE_LOAD_ON_START": "0"}


def children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_server_process_whose_engine_died_is_started_again(smollm2_blocks_dir, tmp_path):
    # tests/e2e/fault_settings.py: the engine thread dies at the first request it admits.
    # Each of the two server processes loads the model, and nothing more is asked of its engine: the
    # pulled model's GGUF blocks load as they are (the float32 folder's linears are quantized to int8 at
    # every load), and one engine thread loads them without a second one spinning between the load's
    # parallel regions (libgomp's wait); a few seconds of CPU less a load each.
    server = LiveServer({"METRALE_MODEL": str(smollm2_blocks_dir), "METRALE_KV_CACHE_BYTES": str(64 << 20),
                         "METRALE_NUM_THREADS": "1", "DJANGO_SETTINGS_MODULE": "tests.e2e.fault_settings"},
                        tmp_path, via_serve=True)
    try:
        server.wait_ready()
        (first,) = children(server.proc.pid)
        body = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        assert httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60).status_code >= 500
        wait_for(lambda: f"The server process {first} exited with status {ENGINE_DIED_EXIT_STATUS}"
                 in server.log(), 30, "the engine-death exit")
        server.wait_ready()  # a new server process, with a new engine
        assert children(server.proc.pid) != [first]
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=60) == 0
    finally:
        server.stop()


def test_a_killed_server_process_is_started_again_and_sigterm_drains_it(tmp_path):
    server = LiveServer(NO_MODEL, tmp_path, via_serve=True)
    try:
        wait_for(lambda: answering(server.url), 60, "the server")
        (first,) = children(server.proc.pid)
        os.kill(first, signal.SIGKILL)  # a crash: no drain, no exit status
        second = wait_for(lambda: [c for c in children(server.proc.pid) if c != first], 60,
                          "a new server process")[0]
        wait_for(lambda: answering(server.url), 60, "the new server process")
        assert f"The server process {first} exited with signal 9" in server.log()

        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=60) == 0
        assert gone(second)
        log = server.log()
        assert log.count("received SIGTERM") == 1 and "shut down after" in log
    finally:
        server.stop()


def test_a_taken_port_is_tried_again_with_a_backoff_until_it_is_free(tmp_path):
    port = free_port()
    taken = socket.socket()
    taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    taken.bind(("127.0.0.1", port))
    taken.listen()
    log = open(tmp_path / "serve.log", "w")
    env = {**os.environ, **NO_MODEL, "METRALE_SQLITE_PATH": str(tmp_path / "db.sqlite3")}
    serve = subprocess.Popen([sys.executable, "manage.py", "serve", "--port", str(port)], cwd=ROOT,
                             env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        text = lambda: (tmp_path / "serve.log").read_text()  # noqa: E731
        wait_for(lambda: text().count("exited with status 1") >= 2, 60, "two failed starts")
        assert "starting it again in 1 s" in text() and "starting it again in 2 s" in text()
        taken.close()
        wait_for(lambda: answering(f"http://127.0.0.1:{port}"), 60, "the server")
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=60) == 0
    finally:
        taken.close()
        if serve.poll() is None:
            serve.kill()
        log.close()


def test_no_restart_serves_in_the_commands_own_process(tmp_path):
    port = free_port()
    env = {**os.environ, **NO_MODEL, "METRALE_SQLITE_PATH": str(tmp_path / "db.sqlite3")}
    serve = subprocess.Popen([sys.executable, "manage.py", "serve", "--no-restart", "--port",
                              str(port)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: answering(f"http://127.0.0.1:{port}"), 60, "the server")
        assert children(serve.pid) == []
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=60) == 0
    finally:
        if serve.poll() is None:
            serve.kill()
