"""Model hot-swap, a registry operation: load another folder in the default chat model's place, under the registry's load lock and memory budget, and let the old one drain.

`swap_model(path, served_name)` (blocking; the adapters app's watcher calls it on a worker
thread when the operators' ServedModel setting changes) swaps the registry's default chat
model (operations/registry.ModelRegistry.install: the entry keeps its place, pin and
keep_alive under the new name); the other models are untouched. The whole swap holds the
registry's load lock (`ModelRegistry.exclusive`), so no on-demand load runs beside it, and makes
room as a load does (`ModelRegistry.room_for_swap`):
1. When the new model fits beside the old one (the memory budget, once idle models are unloaded
   least recently used first, and the loader's fits_beside: its weights and KV pool against
   MemAvailable), it loads while the old one keeps serving; when it fits only in the old one's
   place, the old one stops taking requests (they wait up to SWAP_WAIT_S, then 503
   model_not_loaded with Retry-After; /health "swapping"), drains, and is stopped first; when it
   fits neither way, the swap is refused (ModelLoadFailed naming the model and the budget, or
   ModelBudgetBusy) and nothing changes.
2. The new Runtime is installed: requests that start from then on run on it; requests
   already running keep the Runtime they took and finish on the old engine. Embedding models
   whose passes ran between the old engine's steps move to the new one.
3. The old engine is stopped once no request runs on it (`ModelRegistry.retire`; its bytes count
   against the budget until then), and its memory goes.
A load that fails leaves the old model serving (or, after a drain-first stop, loads it
again) and the registry's `swap_status` says why. Every step is there, and /health reports it.
"""
from __future__ import annotations

import logging
from pathlib import Path

from . import runtime
from .model_specs import CHAT, EMBEDDING, ModelSpec
from .registry import ModelLoadFailed, process_registry

log = logging.getLogger("metrale")

# Seconds a draining engine is given for its running requests before the drain gives up waiting.
DRAIN_TIMEOUT_S = 3600.0


def status(registry=None) -> dict:
    """The last swap of `registry` (default: the process's): state (idle, loading, draining, serving,
    failed), the model name and folder asked for, the error of a failed one, and since when (Unix seconds)."""
    return dict((registry or process_registry()).swap_status)


def swap_model(path: str, served_name: str | None = None, registry=None):
    """Serve the model folder `path` as `served_name` (default: the folder's name) in place of
    `registry`'s default chat model (default: the process's registry), without dropping a request
    (steps in the module doc). Returns the new Runtime (the current one when it already serves this
    folder under this name). Raises ValueError (no chat model configured), ModelLoadFailed /
    ModelBudgetBusy (it cannot fit: nothing changed), or what loading raises (the old model then
    still serves)."""
    registry = registry or process_registry()
    with registry.exclusive():
        entry = registry.default(CHAT)
        if entry is None:
            raise ValueError("this server has no chat model to swap (METRALE_MODELS)")
        old = entry.loaded
        name = served_name or Path(path).name
        if old is not None and Path(old.model.model_path) == Path(path) and old.model.model_id == name:
            return old.model
        spec = ModelSpec(name, Path(path), CHAT)
        registry.set_swap_status(state="loading", model=name, path=str(path), error=None)
        try:
            beside = registry.room_for_swap(entry, spec)
        except ModelLoadFailed as exc:
            registry.set_swap_status(state="failed", error=exc.cause)
            log.error("swapping to %s refused; %s keeps serving: %s", path, entry.name, exc)
            raise
        if not beside:
            registry.set_swap_status(state="draining")
            registry.drain(entry, f"the model is being swapped for {name!r}", DRAIN_TIMEOUT_S)
            registry.set_swap_status(state="loading")
        try:
            loaded = registry.loader.load(spec, registry)
            runtime.runtime_ready.send_robust(sender=None, runtime=loaded.model, swap=True)
        except Exception as exc:
            log.exception("swapping to %s failed; the previous model keeps serving", path)
            registry.set_swap_status(state="failed", error=f"{type(exc).__name__}: {exc}")
            if not beside:
                _reload(registry, entry)
            raise
        new_entry = registry.install(entry, spec, loaded)
        if old is not None:
            for _, service in registry.loaded_models(EMBEDDING):
                runner = getattr(service, "runner", None)
                if runner is not None and getattr(runner, "host", None) is old.model.engine:
                    loaded.model.engine.attach_embeddings(runner)
            if beside:
                registry.retire(old, entry.name, DRAIN_TIMEOUT_S)
        registry.set_swap_status(state="serving")
        log.info("now serving %r from %s (%s) as the default chat model", new_entry.name, path,
                 loaded.model.fingerprint)
        return loaded.model


def _reload(registry, entry) -> None:
    """After a drain-first swap whose load failed: the previous model loaded again in its place, or left
    unloaded (the next request naming it loads it) when that fails too."""
    try:
        registry.install(entry, entry.spec, registry.loader.load(entry.spec, registry))
    except Exception:
        log.exception("loading the previous model %s again failed; its next request loads it", entry.name)
        registry.install(entry, entry.spec, None)
