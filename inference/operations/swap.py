"""Model hot-swap, a registry operation: load another folder beside the default chat model, put it in its place, let the old one drain.

`swap_model(path, served_name)` (blocking; the adapters app's watcher calls it on a worker
thread when the operators' ServedModel setting changes) swaps the registry's default chat
model (operations/registry.ModelRegistry.install: the entry keeps its place, pin and
keep_alive under the new name); the other models are untouched:
1. When the new model fits in memory beside the old one (its weights, their int8 copies and
   its KV pool against MemAvailable), it loads while the old one keeps serving; else the old
   one stops taking requests (they wait up to SWAP_WAIT_S, then 503 model_not_loaded with
   Retry-After; /health "swapping"), drains, and is stopped first.
2. The new Runtime is installed: requests that start from then on run on it; requests
   already running keep the Runtime they took and finish on the old engine. Embedding models
   whose passes ran between the old engine's steps move to the new one.
3. The old engine thread is stopped once no request runs on it, and its memory goes.
A load that fails leaves the old model serving (or, after a drain-first stop, loads it
again) and `status()` says why. Every step is in `status()`, which /health reports.
"""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from . import runtime
from .model_specs import CHAT, ModelSpec
from .registry import process_registry

log = logging.getLogger("metrale")

_lock = threading.Lock()
_status: dict = {"state": "idle", "model": None, "path": None, "error": None, "since": None}
# Seconds a draining engine is given for its running requests before the drain gives up waiting.
DRAIN_TIMEOUT_S = 3600.0


def status() -> dict:
    """The last swap: state (idle, loading, draining, serving, failed), the model name and folder
    asked for, the error of a failed one, and since when (Unix seconds)."""
    return dict(_status)


def _set(**fields) -> None:
    _status.update(fields, since=time.time())


def estimated_bytes(path: str | Path, kv_cache_bytes: int | None) -> int:
    """Memory a model folder will take once served on CPU in float32 with int8 copies: its
    safetensors scaled to float32 (bytes per parameter from config.json's dtype) plus a quarter for
    the int8 copies, plus its KV pool."""
    from inference.engine.model_folder import ModelFolder

    folder = Path(path)
    stored = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    dtype = (ModelFolder.read(folder).model_config.torch_dtype or "float32").removeprefix("torch.")
    scale = 4 / {"float32": 4, "bfloat16": 2, "float16": 2}.get(dtype, 4)
    return int(stored * scale * 1.25) + (kv_cache_bytes or 0)


def fits_beside(path: str | Path, old) -> bool:
    """Whether `path` can load while `old` keeps its memory (estimated_bytes against MemAvailable,
    with a fifth kept free)."""
    from inference.engine.llm_engine import available_memory_bytes, resolve_device

    engine = old.engine.engine
    kv = engine.runner.kv_pool.nbytes
    need = estimated_bytes(path, kv)
    return need < 0.8 * available_memory_bytes(resolve_device(engine.config.device))


def drain_and_stop(rt, timeout_s: float = DRAIN_TIMEOUT_S) -> None:
    """Wait until no request runs on `rt`'s engine (up to timeout_s), then stop its thread."""
    deadline = time.monotonic() + timeout_s
    while not rt.engine.idle() and time.monotonic() < deadline:
        time.sleep(0.05)
    rt.engine.stop()
    log.info("the previous model %r stopped after draining", rt.model_id)


def swap_model(path: str, served_name: str | None = None, registry=None):
    """Serve the model folder `path` as `served_name` (default: the folder's name) in place of
    `registry`'s default chat model (default: the process's registry), without dropping a request
    (steps in the module doc). Returns the new Runtime (the current one when it already serves this
    folder under this name). Raises what loading raises; the old model then still serves."""
    registry = registry or process_registry()
    with _lock:
        entry = registry.default(CHAT)
        if entry is None:
            raise ValueError("this server has no chat model to swap (METRALE_MODELS)")
        old = entry.loaded.model if entry.loaded is not None else None
        name = served_name or Path(path).name
        if old is not None and Path(old.model_path) == Path(path) and old.model_id == name:
            return old
        spec = ModelSpec(name, Path(path), CHAT)
        _set(state="loading", model=name, path=str(path), error=None)
        beside = old is None or fits_beside(path, old)
        if not beside:
            _set(state="draining")
            entry.unavailable = f"the model is being swapped for {name!r}"
            drain_and_stop(old)
            _set(state="loading")
        try:
            loaded = registry.loader.load(spec, registry)
            runtime.runtime_ready.send_robust(sender=None, runtime=loaded.model, swap=True)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            log.exception("swapping to %s failed; the previous model keeps serving", path)
            _set(state="failed", error=error)
            if not beside:
                registry.install(entry, entry.spec, registry.loader.load(entry.spec, registry))
            raise
        new_entry = registry.install(entry, spec, loaded)
        new = loaded.model
        if old is not None:
            for _, service in registry.loaded_models("embedding"):
                runner = getattr(service, "runner", None)
                if runner is not None and getattr(runner, "host", None) is old.engine:
                    new.engine.attach_embeddings(runner)
        _set(state="serving")
        log.info("now serving %r from %s (%s) as the default chat model", new_entry.name, path, new.fingerprint)
        if beside and old is not None:
            threading.Thread(target=drain_and_stop, args=(old,), name="metrale-drain-old", daemon=True).start()
        return new
