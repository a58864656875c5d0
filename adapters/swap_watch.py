"""Every server follows the ServedModel row: when it names another folder or name, swap its default chat model
to it (inference.operations.swap).

Precedence (README "Models"): the configuration (METRALE_MODELS, or METRALE_MODEL) says which models a
server serves; an operator's swap (the row) replaces the default chat model only on servers whose
configured default is the one the swap replaced (`ServedModel.configured`, written with the swap). A
server started with another default serves its configuration and logs, once, that it ignores the row.
The operators' per-model pin and keep_alive (ModelSetting rows) apply over the configuration's
(model_settings_sync)."""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from django.conf import settings
from django.db import DatabaseError

from inference.operations import swap
from inference.operations.model_specs import CHAT, configured_specs
from inference.operations.registry import process_registry

from .models import ServedModel

log = logging.getLogger("metrale")
_started = False
_lock = threading.Lock()


_ignored: set = set()
# Seconds between two reports of an unchanged model state (run_model_commands).
REPORT_EVERY_S = 60.0


def configured_default() -> str:
    """The source of this server's configured default chat model ("" without one): what a swap replaces."""
    spec = next((s for s in configured_specs() if s.kind == CHAT), None)
    return spec.source if spec is not None else ""


def applies(row: ServedModel) -> bool:
    """Whether the row's swap applies to this server (module doc); logs once when it does not."""
    mine = configured_default()
    if row.configured == mine:
        return True
    key = (row.pk, row.path, row.configured, mine)
    if key not in _ignored:
        _ignored.add(key)
        log.warning("the operators' swap to %s (%s) replaced the configured default %s; this server is configured "
                    "with %s, so its configuration wins and the swap is ignored here", row.name, row.path,
                    row.configured or "(unrecorded)", mine)
    return False


def chosen_model() -> tuple[str, str | None] | None:
    """(folder, name) of the ServedModel row when it applies to this server, else None (or no table)."""
    try:
        row = ServedModel.objects.filter(pk=1).first()
    except DatabaseError:
        return None
    return (row.path, row.name) if row is not None and applies(row) else None


def _differs(row: ServedModel, rt) -> bool:
    return rt is None or Path(row.path) != Path(rt.model_path) or row.name != rt.model_id


def follow_once(last_failed: tuple | None, registry=None) -> tuple | None:
    """Swap `registry`'s default chat model (default: the process's) when the row applies here and differs
    from what it serves (not again for a request that failed here). Returns the (path, name, requested) of a
    failed attempt, else None."""
    registry = registry or process_registry()
    row = ServedModel.objects.filter(pk=1).first()
    rt = registry.runtime()
    if row is None or rt is None or not applies(row):
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
        new = swap.swap_model(row.path, row.name, registry)
    except Exception as exc:
        ServedModel.objects.filter(pk=1).update(state="failed", error=f"{type(exc).__name__}: {exc}")
        return attempt
    ServedModel.objects.filter(pk=1).update(state="serving", error="", fingerprint=new.fingerprint)
    return None


def run_model_commands(registry=None) -> list[tuple[str, str]]:
    """Run the load / unload commands `manage.py models` left in ModelSetting rows on `registry`'s models
    (default: the process's), clear them, then report every configured model's state into its row.
    Returns the (name, command) pairs run."""
    from django.utils import timezone

    from .models import ModelSetting

    registry = registry or process_registry()
    done = []
    for row in ModelSetting.objects.exclude(command="").filter(name__in=list(registry.entries)):
        if row.command == "load":
            registry.load(row.name)
        elif row.command == "unload":
            registry.unload(row.name, force=True)
        ModelSetting.objects.filter(pk=row.pk, command=row.command).update(command="")
        done.append((row.name, row.command))
    now = timezone.now()
    rows = {row.name: row for row in ModelSetting.objects.filter(name__in=list(registry.entries))}
    for state in registry.states():
        seen = (state["state"], state["error"] or "", state["resident_bytes"])
        row = rows.get(state["id"])
        if row is not None and (row.state, row.error, row.resident_bytes) == seen and row.reported is not None \
                and (now - row.reported).total_seconds() < REPORT_EVERY_S:
            continue  # written only when it changed, or to say this server still reports
        ModelSetting.objects.update_or_create(name=state["id"], defaults={
            "state": seen[0], "error": seen[1], "resident_bytes": seen[2], "reported": now})
    return done


def _loop(interval_s: float) -> None:
    last_failed = None
    while True:
        time.sleep(interval_s)
        try:
            last_failed = follow_once(last_failed)
            run_model_commands()
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
