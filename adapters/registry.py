"""This process's served LoRA adapters: load and unload through the engine, the runtime's names, the Adapter rows.

One place for every way an adapter comes and goes (startup settings, the runtime routes, the
admin): the engine's slot first, then the name requests may use (`Runtime.adapters`), then
the Adapter row. Unloading goes the other way: the name stops routing first, then the
engine frees the slot once the requests in flight on it end. Errors are AdapterRefused with
the HTTP status vLLM's routes answer (404 no such adapter, 400 does not fit or name taken).
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db.models import F

from inference.serving.fingerprint import folder_digest
from inference.serving.model_names import ServedAdapter, served_names

from .models import Adapter

log = logging.getLogger("metrale")

FLUSH_INTERVAL_S = 30.0
_flush_lock = threading.Lock()
_flushing = threading.Event()  # the flush thread runs (one per process)


class AdapterRefused(Exception):
    """A load or unload that cannot be done: `status` 400 or 404 and a message for the operator."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def check_name(rt, name: str) -> None:
    """An adapter name must be non-empty, without ':' (the `base:adapter` syntax) and not a served
    model name. Raises AdapterRefused(400)."""
    if not name or ":" in name or name != name.strip():
        raise AdapterRefused(400, f"{name!r} is not a usable adapter name (non-empty, no ':', no outer blanks)")
    if name in served_names(rt.model_id):
        raise AdapterRefused(400, f"{name!r} is the served model's name")


def _refusal(exc: Exception) -> AdapterRefused:
    from inference.engine.lora import LoraError, LoraNotFound

    if isinstance(exc, LoraNotFound):
        return AdapterRefused(404, str(exc))
    if isinstance(exc, (LoraError, ValueError)):
        return AdapterRefused(400, str(exc))
    raise exc


def _record(name: str, path: str, loaded: bool, error: str = "") -> frozenset[str] | None:
    row, _ = Adapter.objects.update_or_create(name=name, defaults={"path": path, "loaded": loaded, "error": error})
    return row.allowed_salts()


def _served_entry(name: str, path: str, allowed) -> ServedAdapter:
    return ServedAdapter(name, path, int(time.time()), folder_digest(path), allowed)


async def load(rt, name: str, path: str, *, replace: bool = False) -> ServedAdapter:
    """Load the PEFT folder `path` as adapter `name` (with `replace`, vLLM's load_inplace: the old
    version's requests finish on it); returns once its weights are resident. Raises
    AdapterRefused (404: no adapter there; 400: bad name, taken name, does not fit, no slot)."""
    from inference.engine.lora_control import load_lora

    check_name(rt, name)
    if name in rt.adapters and not replace:
        raise AdapterRefused(400, f"the adapter {name!r} is already loaded (load_inplace: true reloads it)")
    try:
        await load_lora(rt.engine, name, path, replace)
    except Exception as exc:
        refusal = _refusal(exc)
        await sync_to_async(_record_failure)(name, path, str(refusal))
        raise refusal from exc
    allowed = await sync_to_async(_record)(name, path, True)
    entry = await asyncio.to_thread(_served_entry, name, path, allowed)
    rt.adapters[name] = entry
    log.info("LoRA adapter %r loaded from %s", name, path)
    return entry


def _record_failure(name: str, path: str, error: str) -> None:
    Adapter.objects.filter(name=name).update(error=error) or Adapter.objects.create(
        name=name, path=path, loaded=False, error=error)


async def unload(rt, name: str) -> None:
    """Stop routing `name`, then free its engine slot once its requests in flight end (for good:
    a reload takes a fresh slot). Raises AdapterRefused(404) for a name that is not loaded."""
    from inference.engine.lora_control import unload_lora

    if rt.adapters.pop(name, None) is None:
        raise AdapterRefused(404, f"the adapter {name!r} is not loaded")
    try:
        await unload_lora(rt.engine, name)
    except KeyError:
        pass  # the engine had already dropped it
    await sync_to_async(flush_served)(rt)
    await sync_to_async(Adapter.objects.filter(name=name).update)(loaded=False)
    log.info("LoRA adapter %r unloaded", name)


def flush_served(rt) -> None:
    """Add the requests counted since the last flush (Runtime.adapter_requests) to the Adapter rows
    (F() updates, so replicas add up); counts a failed update could not write wait for the next."""
    if rt is None:
        return
    with _flush_lock:
        counts = rt.adapter_requests
        for name in list(counts):
            n = counts.pop(name, 0)
            try:
                Adapter.objects.filter(name=name).update(requests_served=F("requests_served") + n)
            except Exception:
                counts[name] += n
                raise


def flush_all(registry) -> None:
    """flush_served for every loaded chat model of `registry` (operations/registry.ModelRegistry)."""
    from inference.operations.model_specs import CHAT

    for _, rt in registry.loaded_models(CHAT):
        flush_served(rt)


def refresh_allow_list(rt, row: Adapter) -> None:
    """After an operator edits a row's tenants: the served entry takes the new allow-list."""
    entry = rt.adapters.get(row.name) if rt is not None else None
    if entry is not None:
        rt.adapters[row.name] = ServedAdapter(entry.name, entry.path, entry.created, entry.digest, row.allowed_salts())


def startup_adapters() -> dict[str, str]:
    """name -> path of METRALE_LORA_ADAPTERS (name=path items), then of the rows marked loaded.
    Raises ValueError for an item that is not name=path."""
    out = {}
    for item in settings.METRALE.get("LORA_ADAPTERS") or []:
        name, sep, path = item.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise ValueError(f"METRALE_LORA_ADAPTERS item {item!r} is not name=path")
        out[name.strip()] = path.strip()
    for row in Adapter.objects.filter(loaded=True):
        out.setdefault(row.name, row.path)
    return out


def load_startup_adapters(sender=None, runtime=None, swap=False, **kwargs) -> None:
    """runtime_ready's receiver (the loading thread): load every startup adapter of the default chat model
    (or of the model a swap puts in its place) before it is served. One that fails is logged and its row
    says why; the others and the base still serve."""
    from inference.engine.lora_control import install, read_adapter

    from inference.operations.runtime import served_model_name

    rt = runtime
    # Startup adapters belong to the default chat model (or the model a swap puts in its place).
    adapters = startup_adapters() if swap or rt.model_id == served_model_name() else {}
    for name, path in adapters.items():
        try:
            check_name(rt, name)
            install(rt.engine, read_adapter(rt.engine, name, path)).result()
        except Exception as exc:
            refusal = exc if isinstance(exc, AdapterRefused) else _refusal(exc)
            log.error("LoRA adapter %r (%s) not loaded: %s", name, path, refusal)
            _record_failure(name, path, str(refusal))
            Adapter.objects.filter(name=name).update(loaded=False)
            continue
        rt.adapters[name] = _served_entry(name, path, _record(name, path, True))
        log.info("LoRA adapter %r loaded from %s", name, path)


def start_watchers_at_start(sender=None, registry=None, **kwargs) -> None:
    """runtime_starting's receiver: start_watchers() when a server starts its registry."""
    if registry is not None:
        start_watchers()


def start_watchers() -> None:
    """Start, once per process, the request-count flush and the served-model watcher (adapters.swap_watch:
    the operators' swap and `manage.py models`' commands). Called when the server starts its registry
    (start_watchers_at_start, a runtime_starting receiver)."""
    if not _flushing.is_set():
        _flushing.set()
        threading.Thread(target=_flush_loop, name="metrale-adapter-counts", daemon=True).start()
    from . import swap_watch

    swap_watch.start()


def _flush_loop() -> None:
    from inference.operations.registry import process_registry

    while True:
        time.sleep(FLUSH_INTERVAL_S)
        try:
            flush_all(process_registry())
        except Exception:  # the database may be briefly away; the counts wait for the next flush
            log.warning("flushing adapter request counts failed", exc_info=True)
