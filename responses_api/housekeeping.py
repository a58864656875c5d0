"""Work for a (re)starting server: start this process's heartbeat, fail the responses of
processes that are gone (at start and after every heartbeat, so a replica's death is noticed by
the others), and purge expired stored items periodically in-process when there is no Celery
broker."""

from __future__ import annotations

import logging
import threading
import time

from django.conf import settings
from django.db import DatabaseError, close_old_connections

from inference.operations import heartbeat

from . import store

log = logging.getLogger("metrale.responses")

_purger: threading.Thread | None = None
_lock = threading.Lock()


def on_runtime_starting(**_kwargs) -> None:
    """Receiver of inference.operations.runtime.runtime_starting (sent from the model-loading thread).

    Starts this process's heartbeat (its row exists before it takes any work), marks failed the
    unfinished responses of processes that are gone (store.fail_unfinished), then, without
    CELERY_BROKER_URL, starts the purge thread (once per process). A database that is not
    migrated yet is logged, not raised: the server still starts.
    """
    try:
        heartbeat.start()
        store.fail_unfinished()
    except DatabaseError as exc:
        log.warning("could not check for unfinished responses: %s", exc)
    if not settings.CELERY_BROKER_URL:
        start_purge_thread()


def on_process_beat(**_kwargs) -> None:
    """Receiver of inference.operations.heartbeat.process_beat (sent from the heartbeat thread): fail the
    unfinished responses of processes that are gone, and forget processes gone for a day."""
    store.fail_unfinished()
    heartbeat.prune()


def start_purge_thread() -> None:
    """Run tasks.purge_expired every METRALE["PURGE_INTERVAL_S"] seconds in a daemon thread."""
    global _purger
    with _lock:
        if _purger is None:
            _purger = threading.Thread(target=_purge_forever, name="metrale-purge", daemon=True)
            _purger.start()


def _purge_forever() -> None:
    from .tasks import purge_expired

    while True:
        time.sleep(settings.METRALE["PURGE_INTERVAL_S"])
        try:
            counts = purge_expired()
            if any(counts.values()):
                log.info("purged expired stored items: %s", counts)
        except Exception:
            log.exception("purging expired stored items failed")
        finally:
            close_old_connections()
