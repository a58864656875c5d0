"""LiveServer.wait_ready (inference/bench/live_server.py), which every live test and bench starts servers with: a
server whose model cannot load is reported at once with the load's own error, not after the whole timeout with a
log tail of readiness polls."""
import time

import pytest

from inference.bench.live_server import LiveServer


def test_a_failed_load_ends_the_wait_at_once_naming_its_cause(tmp_path):
    server = LiveServer({"METRALE_MODEL": str(tmp_path / "missing-model")}, tmp_path / "server")
    try:
        started = time.monotonic()
        with pytest.raises(RuntimeError) as raised:
            server.wait_ready(timeout_s=120)
        assert time.monotonic() - started < 60
        message = str(raised.value)
        assert message.startswith("server's load failed (503 ")
        assert f"the model folder {tmp_path / 'missing-model'} does not exist" in message
        assert "Traceback" in message  # the registry's logged error, kept in the tail
        assert '"GET /health' not in message and "Service Unavailable: /health" not in message
        assert '"GET /health' in server.log()  # the polls happened; only the tail leaves them out
    finally:
        server.stop()
