"""Server processes and their heartbeats: which process owns unfinished work, and which are gone.

Every serving process (one of several replicas, or the same server after a restart) has a
ServerProcess row that a daemon thread beats every METRALE["HEARTBEAT_INTERVAL_S"] seconds.
Work a process owns (a background response's `worker`) may be taken over only once that
process is gone (`live_process_ids` leaves it out):
- it stopped cleanly (`stopped_at`),
- its last beat is older than METRALE["HEARTBEAT_GRACE_S"], or
- it ran in this pid namespace and its pid no longer runs there (a restart on the same machine:
  known at once, without waiting for the grace period).
An id that has no row (a process from before this table, or one pruned long ago) is gone too.
Ids are host:pid:random, so a restarted container whose server is pid 1 again gets a new one.
Beats are written and judged by the database's clock, so replicas' clocks may disagree.
"""
from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import DatabaseError, connection, models
from django.db.models.functions import Now
from django.dispatch import Signal

log = logging.getLogger("metrale")

# Rows of processes gone this long are deleted (the admin keeps a day of history).
PRUNE_AFTER = timedelta(days=1)

process_beat = Signal()
"""Sent from the heartbeat thread after each beat: apps take over the work of processes that
are gone here (responses_api fails their unfinished responses)."""


class ServerProcess(models.Model):
    """One server process: where it runs, when it started, and its last heartbeat."""

    id = models.CharField(primary_key=True, max_length=200, editable=False,
                          help_text="host:pid:random, as recorded on the work it owns.")
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    pid_namespace = models.CharField(
        max_length=100, blank=True,
        help_text="Boot id and pid namespace (Linux): processes in the same one can check each "
                  "other's pids. Empty where unknown.")
    started_at = models.DateTimeField()
    last_beat_at = models.DateTimeField(db_index=True)
    stopped_at = models.DateTimeField(null=True, blank=True, help_text="Set on a clean shutdown.")

    class Meta:
        app_label = "inference"
        ordering = ["-started_at"]
        verbose_name = "server process"
        verbose_name_plural = "server processes"

    def __str__(self):
        return self.id


def pid_namespace() -> str:
    """This process's pid namespace as "<boot id>/<namespace>" (Linux), or "" where unknown."""
    try:
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot_id}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return ""


_identity: tuple[int, str] | None = None  # (pid, id): a forked child gets an id of its own


def process_id() -> str:
    """This process's id (host:pid:8 random hex digits), the same for the process's lifetime."""
    global _identity
    if _identity is None or _identity[0] != os.getpid():
        _identity = (os.getpid(), f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}")
    return _identity[1]


def _pid_runs(pid: int) -> bool:
    """Whether `pid` is a running (not zombie) process in this pid namespace."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def live_process_ids() -> set[str]:
    """Ids of the processes that may still be running the work they own (see the module doc),
    this one always included."""
    grace = timedelta(seconds=settings.METRALE["HEARTBEAT_GRACE_S"])
    me, namespace = process_id(), pid_namespace()
    live = {me}
    rows = ServerProcess.objects.filter(stopped_at__isnull=True, last_beat_at__gte=Now() - grace)
    for pk, pid, ns in rows.values_list("id", "pid", "pid_namespace"):
        if namespace and ns == namespace and pk != me and (pid == os.getpid() or not _pid_runs(pid)):
            continue  # an earlier process of this machine, or one whose pid is now ours
        live.add(pk)
    return live


def beat() -> None:
    """Record that this process is alive (its row is created on the first beat, or again if it
    was deleted meanwhile)."""
    me = process_id()
    if not ServerProcess.objects.filter(pk=me).update(last_beat_at=Now(), stopped_at=None):
        ServerProcess.objects.update_or_create(
            pk=me, defaults={"host": socket.gethostname(), "pid": os.getpid(),
                             "pid_namespace": pid_namespace(), "started_at": Now(),
                             "last_beat_at": Now(), "stopped_at": None})


def prune() -> int:
    """Delete the rows of processes gone for PRUNE_AFTER; returns how many."""
    deleted, _ = ServerProcess.objects.filter(last_beat_at__lt=Now() - PRUNE_AFTER).delete()
    return deleted


_thread: threading.Thread | None = None
_stop = threading.Event()
_lock = threading.Lock()


def start() -> None:
    """Beat now (so the row exists before this process takes any work), then every
    METRALE["HEARTBEAT_INTERVAL_S"] seconds from a daemon thread, sending `process_beat` after
    each. Idempotent. Raises DatabaseError when the first beat cannot be written."""
    global _thread
    with _lock:
        if _thread is not None:
            return
        beat()
        _stop.clear()
        _thread = threading.Thread(target=_beat_forever, name="metrale-heartbeat", daemon=True)
        _thread.start()


def stop() -> None:
    """End the heartbeat and record a clean stop (other processes may then take over at once
    whatever this one still owns). Safe to call when it was never started."""
    global _thread
    with _lock:
        thread, _thread = _thread, None
    if thread is None:
        return
    _stop.set()
    thread.join(timeout=10)
    try:
        ServerProcess.objects.filter(pk=process_id()).update(stopped_at=Now())
    except DatabaseError as exc:
        log.warning("could not record this process's stop: %s", exc)


def _beat_forever() -> None:
    while not _stop.wait(settings.METRALE["HEARTBEAT_INTERVAL_S"]):
        try:
            beat()
        except DatabaseError as exc:  # the database is away: beat again next time
            log.warning("heartbeat not recorded: %s", exc)
            connection.close()
            continue
        for receiver, result in process_beat.send_robust(sender=None):
            if isinstance(result, Exception):
                log.warning("after a heartbeat, %s failed: %s", receiver.__qualname__, result)
                connection.close()
    connection.close()
