"""The process's engine and tokenizer, created from settings.METRALE when the server starts or on first use.

Never at import time, in AppConfig.ready() or during migrate: `start_loading()`
is called by metrale_site/asgi.py, and `get_runtime()` loads on first use.
"""
from __future__ import annotations

import logging
import os
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.dispatch import Signal

from inference.engine.config import EngineConfig
from inference.engine.model_folder import ModelFolder
from inference.serving.fingerprint import combine_fingerprint, model_fingerprint

log = logging.getLogger("metrale")


@dataclass(slots=True)
class Runtime:
    """The loaded model: the engine thread, its tokenizer, the id the API reports, and its folder."""

    engine: object  # inference.engine.async_engine.AsyncEngine
    tokenizer: object  # inference.engine.tokenizer.Tokenizer
    model_id: str
    model_path: Path
    created: int
    # The LoRA adapters requests may name (serving.model_names.ServedAdapter by name); the adapters
    # app keeps it in step with the engine's slots.
    adapters: dict = field(default_factory=dict)
    # system_fingerprint of the base model: a digest of its folder and the engine settings.
    fingerprint: str = ""
    # Requests per adapter name not yet added to the adapters app's rows (its flush_served).
    adapter_requests: Counter = field(default_factory=Counter)
    # The embedding model served beside this one (METRALE_EMBEDDING_MODEL), or None.
    embeddings: "EmbeddingService | None" = None

    def fingerprint_of(self, adapter: str | None) -> str | None:
        """The system_fingerprint of a response by the base model (None) or by adapter `adapter`."""
        if not self.fingerprint:
            return None
        found = self.adapters.get(adapter) if adapter else None
        if found is None or not found.digest:
            return self.fingerprint
        return combine_fingerprint(self.fingerprint, found.digest)

    @property
    def folder(self) -> ModelFolder:
        """The model folder's JSON files, read once per process (sampling defaults, model_type)."""
        return ModelFolder.read(self.model_path)


@dataclass(slots=True)
class EmbeddingService:
    """The embedding model beside the chat model: its served name, folder, load time, the engine's
    EmbeddingModel and the EmbeddingRunner whose units the chat engine's thread runs."""

    name: str
    path: Path
    created: int
    model: object  # inference.engine.embedding_model.EmbeddingModel
    runner: object  # inference.engine.embedding_runner.EmbeddingRunner

    @property
    def dimensions(self) -> int:
        return self.model.dimensions

    @property
    def max_input_tokens(self) -> int:
        return self.model.max_input_tokens

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        return self.model.tokenize(texts)

    def truncate(self, ids: list[int], limit: int, from_text: bool) -> list[int]:
        return self.model.truncate(ids, limit, from_text)


_embeddings: EmbeddingService | None = None
_embeddings_lock = threading.Lock()


def embedding_folder(value: str) -> Path:
    """METRALE_EMBEDDING_MODEL as a folder: a path, or a model name pulled to METRALE_HOME/models."""
    path = Path(value).expanduser()
    if not path.exists() and "/" not in value:
        path = Path(settings.METRALE_HOME) / "models" / value
    return path


def embedding_service() -> EmbeddingService | None:
    """The process's embedding model (loaded once, kept across chat-model swaps), None when
    METRALE_EMBEDDING_MODEL is unset. Raises what EmbeddingModel raises (ConfigError, OSError)."""
    global _embeddings
    value = settings.METRALE.get("EMBEDDING_MODEL")
    if not value:
        return None
    with _embeddings_lock:
        if _embeddings is None:
            import time

            from inference.engine.embedding_model import EmbeddingModel
            from inference.engine.embedding_runner import EmbeddingRunner

            path = embedding_folder(value)
            model = EmbeddingModel(path, settings.METRALE.get("EMBEDDING_WEIGHTS") or "auto")
            runner = EmbeddingRunner(model, share=settings.METRALE.get("EMBEDDING_SHARE") or 0.35)
            _embeddings = EmbeddingService(path.name, path, int(time.time()), model, runner)
            enc = model.encoder
            log.info("embedding model ready: %s beside the chat model (%d dimensions, up to %d tokens an input; "
                     "linears %s%s)", path.name, model.dimensions, model.max_input_tokens, enc.weights,
                     ", compiled steps" if enc.compiled_steps() else "")
        return _embeddings


# METRALE settings -> EngineConfig fields. A setting left unset (None) takes EngineConfig's own
# default, so each engine setting has exactly one default: the dataclass's.
ENGINE_SETTINGS = {
    "MODEL": "model_path", "DTYPE": "dtype", "DEVICE": "device", "BLOCK_SIZE": "block_size",
    "MAX_NUM_SEQS": "max_num_seqs", "MAX_NUM_BATCHED_TOKENS": "max_num_batched_tokens",
    "MAX_MODEL_LEN": "max_model_len", "KV_CACHE_BYTES": "kv_cache_bytes", "KV_CACHE_FRACTION": "kv_cache_fraction",
    "KV_CACHE_DTYPE": "kv_cache_dtype", "ENABLE_PREFIX_CACHING": "enable_prefix_caching",
    "WEIGHTS": "weights", "PREFILL_WEIGHTS": "prefill_weights", "NUM_THREADS": "num_threads",
    "ADAPTIVE_THREADS": "adaptive_threads",
    "STEP_LOG": "step_log", "MAX_WAITING_REQUESTS": "max_waiting_requests",
    "MAX_LORAS": "max_loras", "MAX_LORA_RANK": "max_lora_rank",
    "SPECULATIVE": "speculative", "SPECULATIVE_DRAFT_TOKENS": "speculative_draft_tokens",
    "SPECULATIVE_NGRAM_MAX": "speculative_ngram_max", "SPECULATIVE_NGRAM_MIN": "speculative_ngram_min",
    "SPECULATIVE_MAX_BATCH": "speculative_max_batch",
    "BATCH_MAX_NUM_SEQS": "batch_max_num_seqs", "BATCH_PREFILL_CHUNK": "batch_prefill_chunk",
}


def engine_config(metrale: dict | None = None) -> EngineConfig:
    """The EngineConfig the server runs with, built from METRALE settings (the one place).

    Raises ConfigError (inference.engine.config) for a value the engine cannot use."""
    m = settings.METRALE if metrale is None else metrale
    values = {field: m[key] for key, field in ENGINE_SETTINGS.items() if m.get(key) is not None}
    values["model_path"] = str(values["model_path"])
    return EngineConfig(**values)


_lock = threading.Lock()
_runtime: Runtime | None = None
_error: str | None = None
_thread: threading.Thread | None = None

runtime_starting = Signal()
"""Sent once per process from the loading thread, before the model loads: apps do their
restart work here (responses_api fails the responses a dead process left unfinished)."""

runtime_ready = Signal()
"""Sent from the loading thread with `runtime=` the loaded Runtime, before it is served (/health
answers "loading" until the receivers return): the adapters app loads the startup adapters here.
`swap=True` when it is the new model of a swap (inference.operations.swap), not the process's first."""


def served_model_name() -> str:
    """The model id reported by /v1/models: METRALE_SERVED_MODEL_NAME, else the folder's name."""
    return settings.METRALE["SERVED_MODEL_NAME"] or Path(settings.METRALE["MODEL"]).name


# Set by the adapters app: () -> (folder, served name or None) of the model the operators chose
# (the ServedModel row every replica follows), or None to serve METRALE_MODEL.
model_choice: Callable[[], tuple[str, str | None] | None] | None = None


def load_runtime(model_path: str | None = None, served_name: str | None = None) -> Runtime:
    """A new Runtime (engine thread, tokenizer, fingerprint) for `model_path` (default: the operators'
    choice, else METRALE_MODEL) under `served_name` (default: METRALE_SERVED_MODEL_NAME for the
    configured folder, else the folder's name), with the other engine settings from METRALE.
    Raises what the engine raises for a folder it cannot load (ConfigError, OSError, ...)."""
    import time

    from inference.engine.async_engine import AsyncEngine
    from inference.engine.tokenizer import Tokenizer

    if model_path is None and model_choice is not None:
        model_path, served_name = model_choice() or (None, None)
    config = engine_config()
    if model_path is not None and Path(model_path) != Path(config.model_path):
        config.model_path = str(model_path)
        served_name = served_name or Path(model_path).name
    path = Path(config.model_path)
    tokenizer = Tokenizer.from_folder(path)
    fp = model_fingerprint(path, fingerprint_settings(config))
    engine = AsyncEngine(config=config, on_fatal=_engine_died)
    embeddings = embedding_service()
    if embeddings is not None:
        engine.attach_embeddings(embeddings.runner)
    return Runtime(engine, tokenizer, served_name or served_model_name(), path, int(time.time()), fingerprint=fp,
                   embeddings=embeddings)


_unavailable: str | None = None


def set_unavailable(reason: str | None) -> None:
    """While no model is installed on purpose (a swap that drains the old model first), why; None after."""
    global _unavailable
    _unavailable = reason


def install(rt: Runtime | None) -> None:
    """Serve `rt` from now on: every request that starts after this call gets it (the swap's switch;
    requests already running keep the Runtime they took). None: no model until the next install."""
    global _runtime
    _runtime = rt


def _load() -> Runtime:
    return load_runtime()


# The engine settings that change what a model answers (so they are part of system_fingerprint).
FINGERPRINT_SETTINGS = ("dtype", "device", "kv_cache_dtype", "weights", "prefill_weights", "max_model_len")


def fingerprint_settings(config: EngineConfig) -> dict:
    """The settings of `config` that system_fingerprint covers (FINGERPRINT_SETTINGS)."""
    return {name: getattr(config, name) for name in FINGERPRINT_SETTINGS}


# The exit status when the engine thread dies: EX_SOFTWARE (sysexits.h), an internal software error.
ENGINE_DIED_EXIT_STATUS = 70


def _engine_died(exc: BaseException) -> None:
    """AsyncEngine's on_fatal: its loop died and every request has ended with Failed; log why and
    end the process with ENGINE_DIED_EXIT_STATUS so that a supervisor starts a fresh one."""
    log.critical("the engine thread died (%s: %s); exiting with status %d so the server is restarted",
                 type(exc).__name__, exc, ENGINE_DIED_EXIT_STATUS)
    logging.shutdown()
    # os._exit, not sys.exit: this runs on the engine thread, where SystemExit would end that thread
    # alone and leave a server that accepts requests it can never answer; and not a signal to the
    # main thread: daphne's graceful shutdown would wait on streams that the dead engine never ends.
    os._exit(ENGINE_DIED_EXIT_STATUS)


def _send_from_this_thread(signal: Signal, **kwargs) -> None:
    """Send `signal` to its receivers, then close the database connections they opened on this
    thread (the loading thread owns them; a receiver never closes a connection it was handed, which
    may be a caller's inside its transaction)."""
    from django.db import connections

    try:
        signal.send_robust(sender=None, **kwargs)
    finally:
        connections.close_all()


def _load_guarded() -> None:
    global _runtime, _error
    _send_from_this_thread(runtime_starting)
    try:
        rt = _load()
    except Exception as exc:  # reported by /health and every request
        log.exception("loading the model failed")
        _error = f"{type(exc).__name__}: {exc}"
        return
    _send_from_this_thread(runtime_ready, runtime=rt)
    _runtime = rt


class ModelStateFilter(logging.Filter):
    """Drops django.request's record of a 503 answered while the model loads or a swap drains it
    (status() "idle", "loading" or "swapping"): Django logs every 5xx at ERROR, but such an
    answer (/health's poll, a request before the model is up) reports a state, not a fault; the
    access log still has the line, and a load that fails is logged once, here.
    Installed on the django.request logger (settings.LOGGING); its records carry `status_code`
    (Django's "django.request" logger documentation)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "status_code", None) != 503:
            return True
        return status()[0] not in ("idle", "loading", "swapping")


def start_loading() -> None:
    """Begin loading in a background thread (idempotent)."""
    global _thread
    with _lock:
        if _thread is None and _runtime is None:
            _thread = threading.Thread(target=_load_guarded, name="metrale-load", daemon=True)
            _thread.start()


def status() -> tuple[str, str | None]:
    """("ready" | "swapping" | "loading" | "failed" | "idle", error message or None)."""
    if _runtime is not None:
        return "ready", None
    if _unavailable is not None:
        return "swapping", _unavailable
    if _error is not None:
        return "failed", _error
    return ("loading", None) if _thread is not None else ("idle", None)


def current() -> Runtime | None:
    """The Runtime serving now, without starting a load (None while none is installed)."""
    return _runtime


def get_runtime(wait: bool = True, timeout_s: float | None = None) -> Runtime | None:
    """The runtime, loading it on first use. With wait=False, None while it is still loading."""
    start_loading()
    if wait and _thread is not None:
        _thread.join(timeout_s)
    return _runtime
