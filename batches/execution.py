"""Who runs a batch, and where: the claim, the embedded runner thread, Celery dispatch, orphans taken over.

A batch is run by the process that claims it (Batch.worker = heartbeat.process_id()); a
process may claim a batch nobody owns, or one whose owner is gone (inference/operations/heartbeat.py:
stopped, silent past METRALE["HEARTBEAT_GRACE_S"], or a dead pid on this machine), so two
replicas never both run one. Without CELERY_BROKER_URL (the embedded default) the server's own
process runs its batches on a background thread, one at a time, on its engine; with a broker
the API server only stores and reports, and `manage.py batch_worker` processes (Celery, one
engine each) run batches.tasks.run_batch. After every heartbeat a process hands orphaned
batches on: to its own runner thread (embedded), or back to the queue (broker). With a broker a
batch is sent once its row is committed; if the broker cannot be reached then, the batch keeps
`queued_at` empty and is sent by the next process start or heartbeat that reaches it (enqueue).
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading

from django.conf import settings
from django.db import close_old_connections, transaction
from django.utils import timezone

from inference.operations import heartbeat
from inference.operations.registry import process_registry

from .models import Batch
from .store import ACTIVE

log = logging.getLogger("metrale.batches")


stopping = threading.Event()
"""Set when this process shuts down (metrale_site/drain.py): runs stop at once, their lines in
flight not written, and the batch is left to the next process that claims it."""


def stop_runs() -> None:
    """Stop this process's batch runs (see `stopping`); another process, or this server after its
    restart, takes their batches over once this one's heartbeat records its stop."""
    stopping.set()


def claim(batch_id: str) -> bool:
    """Make this process the batch's owner if it is unfinished and nobody live owns it; whether
    it now owns it."""
    me = heartbeat.process_id()
    with transaction.atomic():
        row = Batch.objects.select_for_update().filter(pk=batch_id, status__in=ACTIVE).first()
        if row is None:
            return False
        if row.worker and row.worker != me and row.worker in heartbeat.live_process_ids():
            return False
        if row.worker != me:
            Batch.objects.filter(pk=batch_id).update(worker=me)
    return True


def run_here(batch_id: str) -> str | None:
    """Claim and run the batch to its end on this process's models (each loaded when a line names it), from
    a thread with no event loop; its final status, or None when another live process owns it.
    A run that raises releases the batch (release) and raises again."""
    heartbeat.start()
    if not claim(batch_id):
        log.info("batch %s: owned by another live process (or ended); not run here", batch_id)
        return None
    from .runner import run_batch

    try:
        status = asyncio.run(run_batch(batch_id, process_registry()))
    except BaseException:
        release(batch_id)  # handed on again (embedded: at the next heartbeat; Celery: the task's retry)
        raise
    log.info("batch %s: %s", batch_id, status)
    return status


def release(batch_id: str) -> None:
    """Give up this process's claim on an unfinished batch (after its run failed)."""
    try:
        Batch.objects.filter(pk=batch_id, worker=heartbeat.process_id()).update(worker=None)
    except Exception:  # the database is away: the heartbeat's end hands it on instead
        log.exception("batch %s: releasing it failed", batch_id)


class EmbeddedRunner:
    """The server process's batch thread (no broker): runs the batches handed to it in turn."""

    def __init__(self):
        self._queue: queue.Queue[str] = queue.Queue()
        self._pending: set[str] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def submit(self, batch_id: str) -> None:
        """Queue a batch (once while it is queued or running), starting the thread if needed."""
        with self._lock:
            if batch_id in self._pending:
                return
            self._pending.add(batch_id)
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="metrale-batches", daemon=True)
                self._thread.start()
        self._queue.put(batch_id)

    def _serve(self) -> None:
        while True:
            batch_id = self._queue.get()
            try:
                run_here(batch_id)
            except Exception:
                log.exception("batch %s: the run failed; another heartbeat hands it on again", batch_id)
            finally:
                close_old_connections()
                with self._lock:
                    self._pending.discard(batch_id)


embedded = EmbeddedRunner()


def dispatch(batch_id: str) -> None:
    """Start the new batch once its row is committed: on a Celery worker with a broker (enqueue),
    else on this process's runner thread."""
    if settings.CELERY_BROKER_URL:
        transaction.on_commit(lambda: enqueue(batch_id))
    else:
        transaction.on_commit(lambda: embedded.submit(batch_id))


def enqueue(batch_id: str) -> bool:
    """Send an unfinished batch that nobody owns and that is not queued (`queued_at` empty) to the
    broker's queue (batches.tasks.run_batch); whether it was sent. The row is marked queued before
    the send, so of several processes only one sends it; a broker that cannot be reached (kombu's
    OperationalError once Celery's publish retries are spent, or any error sending) is logged, the
    mark taken back, and the batch left to the next hand_on_orphans. Never raises for the broker."""
    from .tasks import run_batch

    if not Batch.objects.filter(pk=batch_id, status__in=ACTIVE, worker=None, queued_at=None).update(
            queued_at=timezone.now()):
        return False
    try:
        run_batch.delay(batch_id)
    except Exception as exc:  # noqa: BLE001  (the broker is away: sent again after a later heartbeat)
        log.warning("batch %s: not queued, the broker is unreachable (%s); it is sent again later", batch_id, exc)
        Batch.objects.filter(pk=batch_id).update(queued_at=None)
        return False
    return True


def hand_on_orphans() -> int:
    """Unfinished batches whose owner is gone: run here (embedded) or sent to the queue again
    (broker; the owner and `queued_at` are cleared first, so it is sent once; a batch never queued,
    its broker unreachable when it was made, is sent too). Embedded, a batch nobody owns yet is
    taken too (the replica that made it may have died before claiming it). How many were handed on."""
    live = heartbeat.live_process_ids()
    broker = bool(settings.CELERY_BROKER_URL)
    rows = Batch.objects.filter(status__in=ACTIVE).values_list("id", "worker", "queued_at")
    handed = 0
    for pk, worker, queued_at in rows:
        if worker in live:
            continue
        if not broker:
            embedded.submit(pk)
            handed += 1
        elif worker is not None:
            if Batch.objects.filter(pk=pk, worker=worker).update(worker=None, queued_at=None):
                handed += enqueue(pk)
        elif queued_at is None:
            handed += enqueue(pk)
    return handed
