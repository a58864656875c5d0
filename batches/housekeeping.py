"""The batches app's periodic work: hand on orphaned batches after each heartbeat, and purge expired files and batches."""
from __future__ import annotations

import logging
import time

from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone

from inference.operations import heartbeat

from . import execution, store
from .models import Batch

log = logging.getLogger("metrale.batches")

_last_purge = 0.0


def on_runtime_starting(**_kwargs) -> None:
    """Receiver of inference.operations.runtime.runtime_starting: start this process's heartbeat, then hand on
    the batches a process that is gone left unfinished (embedded: run here; with a broker: queued
    again, with those never queued)."""
    try:
        heartbeat.start()
        execution.hand_on_orphans()
    except DatabaseError as exc:
        log.warning("could not look for unfinished batches: %s", exc)


def on_process_beat(**_kwargs) -> None:
    """Receiver of inference.operations.heartbeat.process_beat: hand on orphaned batches; every
    METRALE["PURGE_INTERVAL_S"], purge expired files and batches."""
    global _last_purge
    execution.hand_on_orphans()
    if time.monotonic() - _last_purge >= settings.METRALE["PURGE_INTERVAL_S"]:
        _last_purge = time.monotonic()
        purge_expired()


def purge_expired() -> dict:
    """Delete stored files (with their content) and finished batches past their expires_at."""
    now = timezone.now()
    files = store.expired_files(now)
    _, deleted = Batch.objects.expired(now).exclude(status__in=store.ACTIVE).delete()
    return {"files": files, "batches": deleted.get("batches.Batch", 0)}
