"""free_port under parallel test processes: each pytest-xdist worker hands out ports from a range of its own."""
import socket

import pytest

from inference.bench import live_server
from inference.bench.live_server import WORKER_PORT_BASE, WORKER_PORT_SPAN, free_port


@pytest.fixture
def worker(monkeypatch):
    """Act as xdist worker gw3 with a fresh cursor (the real worker's cursor is restored afterwards)."""
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    monkeypatch.setattr(live_server, "_worker_next", None)
    return range(WORKER_PORT_BASE + 3 * WORKER_PORT_SPAN, WORKER_PORT_BASE + 4 * WORKER_PORT_SPAN)


def test_a_worker_takes_ports_of_its_own_range_in_turn(worker):
    ports = [free_port() for _ in range(5)]
    assert all(p in worker for p in ports)
    assert len(set(ports)) == 5 and ports == sorted(ports)


def test_a_worker_skips_a_port_something_listens_on(worker):
    first = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", first + 1))
        taken.listen()
        assert free_port() not in (first, first + 1)


def test_outside_xdist_the_kernel_chooses(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # free right now: it binds
        assert s.getsockname() == ("127.0.0.1", port)
