"""Every server follows the ServedModel row: when it names another folder or name, swap to it
(inference.operations.swap)."""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from django.conf import settings
from django.db import DatabaseError

from inference.operations import runtime, swap

from .models import ServedModel

log = logging.getLogger("metrale")
_started = False
_lock = threading.Lock()


def chosen_model() -> tuple[str, str | None] | None:
    """runtime.model_choice: (folder, name) of the ServedModel row, None without one (or no table)."""
    try:
        row = ServedModel.objects.filter(pk=1).first()
    except DatabaseError:
        return None
    return (row.path, row.name) if row is not None else None


def _differs(row: ServedModel, rt) -> bool:
    return rt is None or Path(row.path) != Path(rt.model_path) or row.name != rt.model_id


def follow_once(last_failed: tuple | None) -> tuple | None:
    """Swap when the row differs from what this process serves (not again for a request that failed
    here). Returns the (path, name, requested) of a failed attempt, else None."""
    row = ServedModel.objects.filter(pk=1).first()
    rt = runtime.current()
    if row is None or rt is None:
        return None
    if not _differs(row, rt):
        if row.state != "serving":  # already serving it (or another replica did the swap first)
            ServedModel.objects.filter(pk=1, requested=row.requested).update(
                state="serving", error="", fingerprint=rt.fingerprint)
        return None
    attempt = (row.path, row.name, row.requested)
    if attempt == last_failed:
        return last_failed
    ServedModel.objects.filter(pk=1).update(state="loading", error="")
    try:
        new = swap.swap_model(row.path, row.name)
    except Exception as exc:
        ServedModel.objects.filter(pk=1).update(state="failed", error=f"{type(exc).__name__}: {exc}")
        return attempt
    ServedModel.objects.filter(pk=1).update(state="serving", error="", fingerprint=new.fingerprint)
    return None


def _loop(interval_s: float) -> None:
    last_failed = None
    while True:
        time.sleep(interval_s)
        try:
            last_failed = follow_once(last_failed)
        except Exception:  # the database may be briefly away: try again at the next tick
            log.warning("following the served model setting failed", exc_info=True)


def start() -> None:
    """Start following the row in a daemon thread (once per process)."""
    global _started
    with _lock:
        if _started:
            return
        _started = True
    interval = settings.METRALE.get("SWAP_POLL_S") or 2.0
    threading.Thread(target=_loop, args=(interval,), name="metrale-swap-watch", daemon=True).start()
