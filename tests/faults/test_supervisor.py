"""`manage.py serve`'s supervisor in-process, with small Python children standing in for the
server process: restarts with a backoff, SIGTERM passed on, a child that will not stop killed."""
import signal
import sys
import threading
import time
from io import StringIO

import pytest

from inference.management.commands import serve
from inference.management.commands.serve import Supervisor


def child(code: str) -> list[str]:
    return [sys.executable, "-c", code]


@pytest.fixture
def supervise(monkeypatch):
    """supervise(argv, stop_after_s=None, fast_backoff=True) -> (exit status, the log, the
    backoff delays): runs a Supervisor in this thread (each backoff cut to 10 ms unless
    fast_backoff is False); a timer signals it (as SIGTERM would) after stop_after_s."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    delays: list[float] = []

    def run(argv, stop_after_s=None, fast_backoff=True):
        log = StringIO()
        sup = Supervisor(argv, log)
        real_sleep = sup._sleep
        monkeypatch.setattr(sup, "_sleep", lambda s: (delays.append(s),
                                                      real_sleep(0.01 if fast_backoff else s)))
        if stop_after_s is not None:
            threading.Timer(stop_after_s, sup._on_signal, (signal.SIGTERM, None)).start()
        return sup.run(), log.getvalue(), delays

    yield run
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


def test_a_dying_server_process_is_started_again_with_a_doubling_backoff(supervise, tmp_path):
    starts = tmp_path / "starts"
    # Dies at once the first four times, then serves until it is told to stop.
    code = (f"import pathlib, time; p = pathlib.Path({str(starts)!r}); "
            "p.write_text(p.read_text() + 'x' if p.exists() else 'x'); "
            "n = len(p.read_text()); import signal, sys; "
            "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); "
            "raise SystemExit(3) if n <= 4 else time.sleep(60)")
    status, log, delays = supervise(child(code), stop_after_s=2.0)
    assert starts.read_text() == "xxxxx"
    assert delays == [1.0, 2.0, 4.0, 8.0]
    assert log.count("exited with status 3") == 4
    assert status == 0


def test_sigterm_is_passed_on_and_a_drained_child_ends_the_command_with_0(supervise):
    code = ("import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); "
            "time.sleep(60)")
    started = time.monotonic()
    status, log, delays = supervise(child(code), stop_after_s=1.0)
    assert status == 0 and delays == [] and log == ""
    assert time.monotonic() - started < 10


def test_a_child_that_does_not_stop_is_killed_and_the_command_fails(supervise, monkeypatch,
                                                                    settings):
    monkeypatch.setattr(serve, "KILL_MARGIN_S", 0.5)
    monkeypatch.setattr("metrale_site.drain.SETTLE_S", 0.0)
    settings.METRALE = {**settings.METRALE, "SHUTDOWN_GRACE_S": 0.5}
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    started = time.monotonic()
    status, log, _ = supervise(child(code), stop_after_s=1.0)
    assert status == 1 and "did not stop; killing it" in log
    assert time.monotonic() - started < 10


def test_a_child_that_exits_0_of_its_own_accord_is_not_started_again(supervise):
    status, log, delays = supervise(child("pass"))
    assert (status, log, delays) == (0, "", [])


def test_a_stop_during_the_backoff_ends_the_command_at_once(supervise, monkeypatch):
    monkeypatch.setattr(serve, "RESTART_BACKOFF_S", 60.0)
    started = time.monotonic()
    sup_status, log, _ = supervise(child("raise SystemExit(5)"), stop_after_s=1.0,
                                   fast_backoff=False)
    assert sup_status == 0 and "exited with status 5" in log
    assert time.monotonic() - started < 5


def test_the_backoff_starts_over_after_a_process_that_ran_a_while(supervise, monkeypatch):
    monkeypatch.setattr(serve, "STABLE_AFTER_S", 0.0)  # every process counts as long-lived
    _, _, delays = supervise(child("raise SystemExit(2)"), stop_after_s=1.0)
    assert len(delays) >= 3 and set(delays) == {1.0}
