"""The engine thread dying in a live daphne: the client's stream ends with an error, the process logs why
and exits non-zero within seconds (so a supervisor restarts it), and nothing hangs."""
import time

import httpx
import pytest

from inference.bench.live_server import LiveServer
from inference.operations.runtime import ENGINE_DIED_EXIT_STATUS

pytestmark = pytest.mark.e2e


def test_the_process_exits_non_zero_within_seconds_when_the_engine_thread_dies(smollm2_dir, tmp_path):
    server = LiveServer({"METRALE_MODEL": str(smollm2_dir), "METRALE_KV_CACHE_BYTES": str(64 << 20),
                         "DJANGO_SETTINGS_MODULE": "tests.e2e.fault_settings"}, tmp_path)
    try:
        server.wait_ready()
        started = time.monotonic()
        body = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": True}
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=30) as r:
            text = r.read().decode()
        assert r.status_code == 200 and "injected engine-thread fault" in text  # an in-band error, not a hang
        assert server.proc.wait(timeout=15) == ENGINE_DIED_EXIT_STATUS
        assert time.monotonic() - started < 15
        log = server.log()
        assert "the engine thread's loop died" in log and "injected engine-thread fault" in log
        assert f"exiting with status {ENGINE_DIED_EXIT_STATUS}" in log
    finally:
        server.stop()
