"""The rate limiter's clock: wall-clock seconds, one function so tests can move time."""
import time


def now() -> float:
    """Seconds since the epoch. Wall time (not monotonic) because several processes, and the
    Redis scripts they run, must agree on it."""
    return time.time()
