"""Work for a (re)starting server: fail responses a dead process left unfinished, and purge
expired stored items periodically in-process when there is no Celery broker."""

from __future__ import annotations

import logging
import threading
import time

from django.conf import settings
from django.db import DatabaseError, close_old_connections

from . import store

log = logging.getLogger("metrale.responses")

_purger: threading.Thread | None = None
_lock = threading.Lock()


def on_runtime_starting(**_kwargs) -> None:
    """Receiver of inference.runtime.runtime_starting (sent from the model-loading thread).

    Marks failed the unfinished responses of the previous process (store.fail_unfinished),
    then, without CELERY_BROKER_URL, starts the purge thread (once per process). A database
    that is not migrated yet is logged, not raised: the server still starts.
    """
    try:
        store.fail_unfinished()
    except DatabaseError as exc:
        log.warning("could not check for unfinished responses: %s", exc)
    finally:
        close_old_connections()
    if not settings.CELERY_BROKER_URL:
        start_purge_thread()


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
