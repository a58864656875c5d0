"""Run a torch-heavy call on a short-lived thread so that the calling thread never starts an OpenMP pool.

libgomp keeps a worker pool for each live thread that has run a parallel region; with
more pooled threads than CPUs, every thread's parallel regions wake their workers
through the OS instead of spinning (see AsyncEngine). The bench's main thread outlives
the engine it measures, so its own torch work (the copy-bandwidth probe, transformers
`generate`) runs here: the pool goes away when the thread ends.
"""
from __future__ import annotations

import threading
from typing import Callable, TypeVar

T = TypeVar("T")


def in_own_thread(fn: Callable[..., T], *args, **kwargs) -> T:
    """fn(*args, **kwargs) on a new thread, waited for; returns its result or raises its exception."""
    box: dict = {}

    def body():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # re-raised in the caller
            box["error"] = exc

    thread = threading.Thread(target=body, name="metrale-bench-call")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]
