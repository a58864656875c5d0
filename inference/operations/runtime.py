"""What a loaded model is (Runtime: a chat model's engine and tokenizer; EmbeddingService) and how the registry loads one.

The process's models live in its registry (operations/registry.py); this module builds it from
settings.METRALE (`build_registry`: the configured models, pins, keep_alive, the memory budget)
with the real loader (`ModelLoader`: engine, tokenizer, fingerprint, the resident bytes it
took). Nothing loads at import time, in AppConfig.ready() or during migrate: `start_loading()`
(called by metrale_site/asgi.py) loads the pinned models, a request loads the model it names.
"""
from __future__ import annotations

import contextlib
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

    @property
    def block_size(self) -> int:
        """Tokens per KV block of its engine (the prefix cache's unit)."""
        return self.engine.block_size


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
    def normalizes(self) -> bool:
        """Whether its vectors come L2-normalized (the folder's sentence-transformers Normalize module)."""
        return self.model.pooling.normalize

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        return self.model.tokenize(texts)

    def truncate(self, ids: list[int], limit: int, from_text: bool) -> list[int]:
        return self.model.truncate(ids, limit, from_text)


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
    "LOGPROBS_MODE": "logprobs_mode",
}


def engine_config(metrale: dict | None = None) -> EngineConfig:
    """The EngineConfig the server runs with, built from METRALE settings (the one place).

    Raises ConfigError (inference.engine.config) for a value the engine cannot use."""
    m = settings.METRALE if metrale is None else metrale
    values = {field: m[key] for key, field in ENGINE_SETTINGS.items() if m.get(key) is not None}
    values["model_path"] = str(values["model_path"])
    return EngineConfig(**values)


# The engine settings that change what a model answers (so they are part of system_fingerprint).
FINGERPRINT_SETTINGS = ("dtype", "device", "kv_cache_dtype", "weights", "prefill_weights", "max_model_len")


def fingerprint_settings(config: EngineConfig) -> dict:
    """The settings of `config` that system_fingerprint covers (FINGERPRINT_SETTINGS)."""
    return {name: getattr(config, name) for name in FINGERPRINT_SETTINGS}


# The exit status when the engine thread dies: EX_SOFTWARE (sysexits.h), an internal software error.
ENGINE_DIED_EXIT_STATUS = 70


def _engine_died(exc: BaseException) -> None:
    """AsyncEngine's on_fatal of the only chat model: its loop died and every request has ended with
    Failed; log why and end the process with ENGINE_DIED_EXIT_STATUS so that a supervisor starts a
    fresh one (with several chat models, `ModelLoader.on_fatal` marks that one failed instead)."""
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




runtime_starting = Signal()
"""Sent once per process from the loading thread, with `registry=` the process's registry, before the
first model loads: apps do their restart work here (responses_api fails the responses a dead process
left unfinished) and the adapters app applies the operators' choices (adapters/operator_choices.py)."""

runtime_ready = Signal()
"""Sent from the loading thread with `runtime=` a loaded chat model's Runtime, before it is served
(requests for it wait until the receivers return): the adapters app loads the startup adapters of
the default chat model here. `swap=True` when it is the new model of a swap (operations.swap)."""


def served_model_name() -> str:
    """The default chat model's id (/v1/models, the dashboard): the registry's first chat model."""
    from .registry import process_registry

    entry = process_registry().default()
    return entry.name if entry is not None else ""


def rss_bytes() -> int:
    """This process's resident set size in bytes (/proc/self/statm's second field times the page size)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _safetensors_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.glob("*.safetensors")) if folder.is_dir() else 0


def memory_estimate(folder: Path, kv_cache_bytes: int | None) -> int:
    """Memory a model folder will take once served on CPU in float32 with int8 copies: its safetensors
    scaled to float32 (bytes per parameter from config.json's dtype) plus a quarter for the int8 copies,
    plus its KV pool (a swap's check against the machine's free memory)."""
    stored = _safetensors_bytes(folder)
    dtype = (ModelFolder.read(folder).model_config.torch_dtype or "float32").removeprefix("torch.")
    scale = 4 / {"float32": 4, "bfloat16": 2, "float16": 2}.get(dtype, 4)
    return int(stored * scale * 1.25) + (kv_cache_bytes or 0)


def release_embeddings(runner) -> None:
    """An unloading embedding model's runner: detached from the chat engine that ran its units (so that
    engine no longer holds it), or its own thread stopped."""
    host = runner.host
    if host is not None and host is not runner and hasattr(host, "detach_embeddings"):
        host.detach_embeddings(runner)
    runner.stop()


class ModelLoader:
    """The registry's real Loader (operations/registry.Loader): a chat model's AsyncEngine, Tokenizer and
    fingerprint as a Runtime; an embedding model's EmbeddingModel and EmbeddingRunner as an
    EmbeddingService; a GGUF imported first (once: its folder is reused). Its resident bytes are
    what RSS grew by while it loaded, plus its KV pool's size (reserved, committed as written).

    metrale: the settings (default settings.METRALE). kv_share: with a memory budget and no
    KV_CACHE_BYTES, each chat model's KV pool is this fraction of the budget (KV_BUDGET_SHARE).
    kv_events: the process's KV event publisher (operations/kv_events.py) or None; the engine of
    `kv_events_model` (the default chat model: the one /get_server_info names to routers) publishes
    its prefix cache's changes there while it is loaded."""

    def __init__(self, metrale: dict | None = None, *, kv_events=None, kv_events_model: str | None = None):
        self.metrale = settings.METRALE if metrale is None else metrale
        self.several_chat_models = False
        self.kv_events = kv_events
        self.kv_events_model = kv_events_model

    def kv_cache_bytes(self) -> int | None:
        """The KV pool of each chat model: KV_CACHE_BYTES, else KV_BUDGET_SHARE of MEMORY_BUDGET, else
        None (EngineConfig's kv_cache_fraction of the available memory)."""
        from .model_settings import parse_size

        m = self.metrale
        if m.get("KV_CACHE_BYTES"):
            return int(m["KV_CACHE_BYTES"])
        if m.get("MEMORY_BUDGET"):
            return int(parse_size(m["MEMORY_BUDGET"]) * float(m.get("KV_BUDGET_SHARE") or 0.1))
        return None

    def estimate(self, spec) -> int:
        """Bytes `spec` should take once loaded: its weight files (the GGUF's before it is imported),
        plus its KV pool for a chat model. A guess for the budget check; the measured size replaces it."""
        from .model_specs import CHAT

        files = _safetensors_bytes(spec.folder)
        if not files and spec.gguf is not None and spec.gguf.is_file():
            files = spec.gguf.stat().st_size
        return files + ((self.kv_cache_bytes() or 0) if spec.kind == CHAT else 0)

    def fits_beside(self, spec, old) -> bool:
        """Whether `spec` can load while `old` (a Loaded) keeps its memory: memory_estimate against the
        device's free memory (MemAvailable on CPU), a fifth kept free; the new KV pool taken as large as
        the old one's where no setting sizes it."""
        from inference.engine.llm_engine import available_memory_bytes, resolve_device

        if not (spec.folder / "config.json").is_file():
            return True  # a GGUF not imported yet, or no model there (its load says why)
        need = memory_estimate(spec.folder, self.kv_cache_bytes() or old.kv_bytes)
        return need < 0.8 * available_memory_bytes(resolve_device(self.metrale.get("DEVICE") or "auto"))

    def folder(self, spec) -> Path:
        """The model folder of `spec`, a GGUF imported into it first where it is not there yet.
        Raises FileNotFoundError (naming `manage.py pull_model` for a name in its catalogue only: another
        folder's name is not one it pulls) and
        GGUFImportError (a corrupt or truncated GGUF, an unsupported tensor type)."""
        if spec.gguf is not None and not (spec.folder / "config.json").is_file():
            from inference.engine.checkpoints import import_gguf

            if not spec.gguf.is_file():
                raise FileNotFoundError(f"the GGUF file {spec.gguf} does not exist")
            log.info("importing %s into %s (once; later loads read the folder)", spec.gguf, spec.folder)
            import_gguf(spec.gguf, spec.folder, dtype="blocks", overwrite=spec.folder.exists(), progress=False)
        if not spec.folder.is_dir():
            from inference.management.commands.pull_model import known_models

            hint = f" (run `manage.py pull_model {spec.name}`)" if spec.name in known_models() else ""
            raise FileNotFoundError(f"the model folder {spec.folder} does not exist{hint}")
        return spec.folder

    def load(self, spec, registry):
        """Load `spec` (the registry's loading thread). Raises what loading raises (ConfigError,
        OSError, GGUFImportError, ...)."""
        from .model_specs import CHAT

        return self.load_chat(spec, registry) if spec.kind == CHAT else self.load_embedding(spec, registry)

    def engine_config(self, folder: Path) -> EngineConfig:
        config = engine_config(self.metrale | {"MODEL": str(folder)})
        kv = self.kv_cache_bytes()
        if kv is not None:
            config.kv_cache_bytes = kv
        return config

    def load_chat(self, spec, registry, *, swap: bool = False):
        """Load the chat model `spec`: its engine, tokenizer and fingerprint as a Runtime (sent with
        runtime_ready, `swap` passed on), in a Loaded. Raises what folder() and the engine raise."""
        import time

        # The folder first: a model that is not there fails before the engine's modules (torch: seconds
        # of CPU) are imported.
        folder = self.folder(spec)

        from inference.engine.async_engine import AsyncEngine
        from inference.engine.tokenizer import Tokenizer

        from .registry import Loaded

        before = rss_bytes()
        config = self.engine_config(folder)
        tokenizer = Tokenizer.from_folder(folder)
        # The prompt-length bound reads every vocabulary entry once (SmolLM2's 49,152: ~0.3 s of CPU): done
        # while loading, not in the first request's time to first token.
        from inference.serving.prepare import chars_per_token_bound

        chars_per_token_bound(tokenizer)
        fp = model_fingerprint(folder, fingerprint_settings(config))
        sink = None
        if self.kv_events is not None and spec.name == self.kv_events_model:
            sink = self.kv_events.attach(tokenizer.vocab_size)
        try:
            engine = AsyncEngine(config=config, on_fatal=self.on_fatal(registry, spec.name), kv_events=sink)
        except BaseException:
            if sink is not None:
                self.kv_events.detach(sink)
            raise
        kv = engine.engine.runner.kv_pool.nbytes
        from .model_specs import EMBEDDING

        for _, service in registry.loaded_models(EMBEDDING):  # passes on a thread of their own come here,
            runner = getattr(service, "runner", None)  # between this engine's steps (chat is never starved)
            if runner is not None and runner.host is runner:
                runner.end_thread()
                engine.attach_embeddings(runner)
                log.info("embedding model %s: its passes run between %s's steps from now on", service.name, spec.name)
        rt = Runtime(engine, tokenizer, spec.name, folder, int(time.time()), fingerprint=fp)
        _send_from_this_thread(runtime_ready, runtime=rt, swap=swap)
        return Loaded(rt, max(0, rss_bytes() - before) + kv, kv, release=self._release(engine, sink))

    def _release(self, engine, sink) -> Callable[[], None]:
        """A loaded chat model's release: its engine stopped, then its KV events' subscribers told."""
        if sink is None:
            return engine.stop

        def release():
            engine.stop()
            self.kv_events.detach(sink)
        return release

    def load_embedding(self, spec, registry):
        import time

        from inference.engine.core_share import ThreadTeam
        from inference.engine.embedding_model import EmbeddingModel
        from inference.engine.embedding_runner import EmbeddingRunner

        from .registry import Loaded

        folder = self.folder(spec)
        before = rss_bytes()
        model = EmbeddingModel(folder, self.metrale.get("EMBEDDING_WEIGHTS") or "auto")
        threads, adaptive = self.metrale.get("NUM_THREADS"), self.metrale.get("ADAPTIVE_THREADS")
        runner = EmbeddingRunner(model, share=self.metrale.get("EMBEDDING_SHARE") or 0.35,
                                 team=lambda: ThreadTeam(threads, adaptive=adaptive is not False))
        service = EmbeddingService(spec.name, folder, int(time.time()), model, runner)
        host = registry.runtime()
        if host is not None and hasattr(host.engine, "attach_embeddings"):
            host.engine.attach_embeddings(runner)
        else:
            runner.start_thread()
        enc = model.encoder
        log.info("embedding model ready: %s (%d dimensions, up to %d tokens an input; linears %s%s; its passes "
                 "%s)", spec.name, model.dimensions, model.max_input_tokens, enc.weights,
                 ", compiled steps" if enc.compiled_steps() else "",
                 f"between {host.model_id}'s steps" if host is not None else "on a thread of their own")
        return Loaded(service, max(0, rss_bytes() - before), 0, release=lambda: release_embeddings(runner))

    def on_fatal(self, registry, name: str) -> Callable[[BaseException], None]:
        """The engine's on_fatal: with one chat model configured, exit the process (_engine_died);
        with several, that model is marked failed (its requests have ended Failed; the next
        request naming it loads it again) and the others keep serving."""

        def died(exc: BaseException) -> None:
            if not self.several_chat_models:
                _engine_died(exc)
                return
            log.critical("the engine thread of model %s died (%s: %s); the model is marked failed and reloads "
                         "on its next request; the other models keep serving", name, type(exc).__name__, exc)
            registry.mark_failed(name, f"the engine thread died ({type(exc).__name__}: {exc})")
        return died


def kv_event_publisher(metrale: dict):
    """The KV event publisher METRALE["KV_EVENTS"] asks for (operations/kv_events.py), or None: off, or its
    address cannot be bound (logged: the replica serves on, routed by load alone). Raises ValueError for a
    value KVEventsConfig refuses (system check E003 names it first)."""
    import zmq

    from .kv_events import publisher_from_settings

    try:
        return publisher_from_settings(metrale)
    except zmq.ZMQError as exc:
        log.error("METRALE_KV_EVENTS: cannot open the KV event sockets (%s); no KV events are published", exc)
        return None


def build_registry(metrale: dict | None = None):
    """The process's ModelRegistry from METRALE (MODELS or MODEL / EMBEDDING_MODEL, PIN, KEEP_ALIVE,
    MODEL_KEEP_ALIVE, MEMORY_BUDGET, MODEL_LOAD_WAIT_S) with ModelLoader. Raises SettingError (model_settings) for an unreadable keep_alive or budget."""
    from .model_settings import parse_keep_alive, parse_size
    from .model_specs import CHAT, configured_specs
    from .registry import ModelRegistry

    m = settings.METRALE if metrale is None else metrale
    specs = configured_specs(m)
    chats = [s.name for s in specs if s.kind == CHAT]
    loader = ModelLoader(m, kv_events=kv_event_publisher(m) if chats else None,
                         kv_events_model=chats[0] if chats else None)
    loader.several_chat_models = sum(s.kind == CHAT for s in specs) > 1
    per_model = {}
    for item in m.get("MODEL_KEEP_ALIVE") or []:
        name, _, value = item.partition("=")
        per_model[name.strip()] = parse_keep_alive(value.strip())
    pins = m.get("PIN")
    pins = [] if pins is not None and [p.lower() for p in pins] == ["none"] else pins
    return ModelRegistry(
        specs, loader, pinned=list(pins) if pins is not None else None,
        budget_bytes=parse_size(m["MEMORY_BUDGET"]) if m.get("MEMORY_BUDGET") else None,
        keep_alive_s=parse_keep_alive(m.get("KEEP_ALIVE") if m.get("KEEP_ALIVE") is not None else "5m"),
        keep_alive=per_model, load_wait_s=float(m.get("MODEL_LOAD_WAIT_S") or 30.0))


_started = threading.Event()


def start_loading() -> None:
    """Start the process's registry once: runtime_starting's receivers, then the pinned models' loads,
    on a loading thread; the start-up log line says which models are configured, pinned and loaded."""
    from .registry import process_registry

    if _started.is_set():
        return
    _started.set()
    registry = process_registry()

    def run():
        _send_from_this_thread(runtime_starting, registry=registry)
        for future in registry.start():
            with contextlib.suppress(Exception):  # a failed load is logged by the registry
                future.result()
        registry.log_configuration()

    threading.Thread(target=run, name="metrale-load", daemon=True).start()


def status() -> tuple[str, str | None]:
    """/health's state of the default model (the first chat model, else the first embedding model):
    ("ready" | "swapping" | "loading" | "failed" | "idle", error message or None)."""
    from .model_specs import EMBEDDING
    from .registry import FAILED, LOADED, LOADING, UNLOADED, process_registry

    registry = process_registry()
    entry = registry.default() or registry.default(EMBEDDING)
    if entry is None:
        return "failed", "no model is configured (METRALE_MODELS)"
    if entry.unavailable is not None:
        return "swapping", entry.unavailable
    # A model loaded on demand is ready to be asked for; so is a pinned one once its start-up load is behind it
    # (an operator unloaded it: the next request loads it again).
    on_demand = not entry.pinned or entry.loaded_at is not None
    if entry.state == LOADED or (entry.state == UNLOADED and on_demand and _started.is_set()):
        return "ready", None
    if entry.state == FAILED:
        return "failed", entry.error
    return ("loading", None) if entry.state == LOADING or _started.is_set() else ("idle", None)
