"""The process's models: one ModelRegistry holding every configured model, loaded on demand under a memory budget.

Every part of the server that needs a model (the views, the surfaces, the batch runner, the
adapters app, the swap, /metrics, the dashboard, the request log, the admin) takes it from the
registry by the request's `model` name; nothing else holds an engine, a tokenizer or a runtime.
`process_registry()` is the one registry of this process (built from the settings on first use,
loading nothing); tests hand their own (with fake loaders) to `serving(registry)`.

A model's life (ModelEntry.state): unloaded -> loading -> loaded -> unloaded, or -> failed.
- Loaded on demand: the first request that names a model starts its load on a loading thread;
  requests for a loading model wait for that one load (they are not refused), however many
  arrive at once. Loads run one at a time.
- Held: a request holds its model (`Hold`) from the moment it names it until its answer ends
  (http/api.openai_endpoint releases it with the rate-limit lease); a model held, or whose
  engine has requests running or queued, is never unloaded.
- keep_alive (Ollama's meaning, model_settings.parse_keep_alive): seconds a model stays loaded once
  no request holds it; a request's `keep_alive` sets it for its model from then on; 0 unloads
  the model as soon as it is idle; never (math.inf) keeps it. The reaper thread checks every
  REAP_INTERVAL_S seconds. Pinned models (METRALE_PIN; default: the first chat model) are loaded
  at start and never unloaded for idleness or the budget; only an operator's unload (`unload(force=True)`:
  the admin, `manage.py models unload`) unloads one, and the next request that names it loads it again
  (/health stays ready meanwhile: runtime.status).
- The budget (METRALE_MEMORY_BUDGET): the loaded models' resident bytes (each model's RSS growth
  while it loaded plus its KV pool, measured after load, not file sizes). A load that would pass
  it unloads idle models, least recently used first; it waits up to LOAD_WAIT_S for a busy
  model to become idle, then fails (ModelBudgetBusy). A model whose estimate exceeds the whole
  budget fails at once (ModelLoadFailed).
- A swap (operations/swap.py) is a load under the same rule: under the load lock (`exclusive()`), no other
  load meanwhile; the new model loads beside the old one when it fits (idle models unloaded, least
  recently used first), else the old one drains first (its bytes then count as freed), else the swap is
  refused (ModelLoadFailed, ModelBudgetBusy) before anything is drained. The replaced model's bytes count
  until its drain ends and it is stopped (`retire`).
- Failed: a load that raises fails every request waiting for it with ModelLoadFailed (the
  model's name and the cause; the views answer 503 model_load_failed, never a 500), the model
  is marked failed (its error kept for /v1/models and the admin), and the next request naming
  it tries again. Other models keep serving.
- Names added at run time (Ollama's routes): `alias(name, target)` makes `name` select `target`'s model
  (/api/copy; `find` and serving/model_names.served_names read it), `add(spec)` serves a catalogue model
  pulled while the process runs (/api/pull), `remove(name)` stops serving an added model or an alias
  (/api/delete). They live in this process only: the configuration (METRALE_MODELS) is what every
  process serves after a restart.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from django.conf import settings

from .model_specs import CHAT, EMBEDDING, ModelSpec

log = logging.getLogger("metrale")

UNLOADED, LOADING, LOADED, FAILED = "unloaded", "loading", "loaded", "failed"
REAP_INTERVAL_S = 0.5
DEFAULT_KEEP_ALIVE_S = 300.0  # Ollama's default: 5 minutes


class ModelLoadFailed(Exception):
    """A model could not be loaded: `model` (its served name) and `cause` (a sentence)."""

    def __init__(self, model: str, cause: str):
        super().__init__(f"The model '{model}' could not be loaded: {cause}")
        self.model = model
        self.cause = cause


class ModelBudgetBusy(ModelLoadFailed):
    """A load that would pass the memory budget while every other model is busy (retry later)."""


@dataclass(slots=True)
class Loaded:
    """A loaded model as the registry keeps it: `model` (operations.runtime.Runtime for a chat model,
    EmbeddingService for an embedding model), its resident bytes (weights as RSS grew while it
    loaded, plus `kv_bytes`, its KV pool), and `release` (stops its engine; called once, when idle)."""

    model: object
    resident_bytes: int
    kv_bytes: int = 0
    release: Callable[[], None] = lambda: None
    load_s: float = 0.0

    def idle(self) -> bool:
        """Whether no request runs or waits on it (its engine's own idle(), or its runner's work)."""
        engine = getattr(self.model, "engine", None)
        if engine is not None and hasattr(engine, "idle"):
            return engine.idle()
        runner = getattr(self.model, "runner", None)
        if runner is not None and hasattr(runner, "has_work"):
            return not runner.has_work()
        return True


class Loader:
    """How a registry loads a ModelSpec (the real one: operations.runtime.ModelLoader; tests pass fakes).

    `estimate(spec)`: bytes it will take (for the budget check before loading; 0 when unknown).
    `load(spec, registry)`: a Loaded, or raises (any exception: the load failed, its message the cause).
    `kv_events`: the KV event publisher its default chat model's engine publishes to (operations/kv_events.py),
    or None."""

    kv_events = None

    def estimate(self, spec: ModelSpec) -> int:
        return 0

    def load(self, spec: ModelSpec, registry: "ModelRegistry") -> Loaded:
        raise NotImplementedError

    def fits_beside(self, spec: ModelSpec, old: Loaded) -> bool:
        """Whether `spec` can load while `old` keeps its memory (a swap's choice beside the budget's: the
        machine's free memory). True when unknown."""
        return True


@dataclass(slots=True, eq=False)
class ModelEntry:
    """One configured model and its state (module doc). Times are time.monotonic() seconds,
    `loaded_at` Unix seconds."""

    spec: ModelSpec
    keep_alive_s: float = DEFAULT_KEEP_ALIVE_S
    pinned: bool = False
    state: str = UNLOADED
    error: str | None = None
    loaded: Loaded | None = None
    future: concurrent.futures.Future | None = None
    last_used: float = 0.0
    holds: int = 0
    requests: int = 0
    loaded_at: int | None = None
    # While a swap that drains first has no model installed: why (requests wait, /health says "swapping").
    unavailable: str | None = None
    # Served because a request added it while the process runs (ModelRegistry.add), not configured.
    added: bool = False

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def kind(self) -> str:
        return self.spec.kind

    def busy(self) -> bool:
        """Held by a request, or its engine has requests running or queued."""
        return self.holds > 0 or (self.loaded is not None and not self.loaded.idle())


class Hold:
    """A request's hold on a loaded model: `model` (Runtime or EmbeddingService); `release()` ends it
    (idempotent), marking the model used now."""

    def __init__(self, registry: "ModelRegistry", entry: ModelEntry, model: object):
        self.registry = registry
        self.entry = entry
        self.model = model
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.registry._release(self.entry)


class ModelRegistry:
    """The process's models (module doc).

    specs: the configured models in order (model_specs.configured_specs); loader: a Loader;
    pinned: names loaded at start and never unloaded (default: the first chat model);
    budget_bytes: METRALE_MEMORY_BUDGET in bytes (None: no budget); keep_alive_s: the default
    keep_alive (per model: `keep_alive`, name -> seconds); load_wait_s: how long a load waits for a
    busy model to make room; clock: monotonic seconds (injectable)."""

    def __init__(self, specs: list[ModelSpec], loader: Loader, *, pinned: list[str] | None = None,
                 budget_bytes: int | None = None, keep_alive_s: float = DEFAULT_KEEP_ALIVE_S,
                 keep_alive: dict[str, float] | None = None, load_wait_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic):
        self.loader = loader
        self.keep_alive_s = keep_alive_s
        self.budget_bytes = budget_bytes
        self.load_wait_s = load_wait_s
        self.clock = clock
        self._lock = threading.RLock()
        self._load_lock = threading.Lock()
        self._retiring: list[Loaded] = []  # replaced by a swap, draining: still resident
        # The last swap (operations/swap.py): state (idle, loading, draining, serving, failed), the model name
        # and folder asked for, the error of a failed one, since when (Unix seconds); /health reports it.
        self.swap_status: dict = {"state": "idle", "model": None, "path": None, "error": None, "since": None}
        self._reaper: threading.Thread | None = None
        self._stopped = threading.Event()
        self.entries: dict[str, ModelEntry] = {}
        # name -> the served name it selects (alias)
        self.aliases: dict[str, str] = {}
        chats = [s.name for s in specs if s.kind == CHAT]
        pins = set(pinned if pinned is not None else chats[:1])
        for spec in specs:
            self.entries[spec.name] = ModelEntry(spec, keep_alive_s=(keep_alive or {}).get(spec.name, keep_alive_s),
                                                 pinned=spec.name in pins)

    # --- which model a name selects ---

    def default(self, kind: str = CHAT) -> ModelEntry | None:
        """The first configured model of `kind` (a request naming none gets it), or None."""
        return next((e for e in self.entries.values() if e.kind == kind), None)

    def names(self, kind: str | None = None) -> list[str]:
        return [e.name for e in self.entries.values() if kind is None or e.kind == kind]

    def find(self, name: str, kind: str = CHAT) -> ModelEntry | None:
        """The entry a request's `model` selects on a route serving `kind`, None when none does:
        "" the default; a configured (or added) name; an alias made at run time (`alias`) of a model of
        either kind; an alias (METRALE_MODEL_ALIASES) or `base:adapter` of a chat model; an adapter of a
        loaded chat model; any name when METRALE_ACCEPT_ANY_MODEL_NAME is on (both settings read at each
        call, as serving/model_names reads them)."""
        aliases = settings.METRALE.get("MODEL_ALIASES") or []
        with self._lock:
            if not name:
                return self.default(kind)
            entry = self.entries.get(name) or self.entries.get(self.aliases.get(name, ""))
            if entry is not None:
                return entry
            if kind != CHAT:
                return None
            default = self.default(CHAT)
            if default is not None and name in aliases:
                return default
            base, sep, _ = name.partition(":")
            if sep and base in self.entries and self.entries[base].kind == CHAT:
                return self.entries[base]
            if default is not None and sep and base in aliases:
                return default
            for entry in self.entries.values():
                loaded = entry.loaded
                if entry.kind == CHAT and loaded is not None and name in getattr(loaded.model, "adapters", {}):
                    return entry
            return default if settings.METRALE.get("ACCEPT_ANY_MODEL_NAME") else None

    # --- loading and holding ---

    async def acquire(self, entry: ModelEntry, keep_alive_s: float | None = None) -> Hold:
        """Hold `entry`, loading it first if needed (waiting for a load under way). keep_alive_s: the
        request's keep_alive (None: the model's own). Raises ModelLoadFailed (the hold released)."""
        future = self._hold(entry, keep_alive_s)
        try:
            model = await asyncio.wrap_future(future) if not future.done() else future.result()
        except BaseException:
            self._release(entry)
            raise
        return Hold(self, entry, model)

    def acquire_blocking(self, entry: ModelEntry, keep_alive_s: float | None = None,
                         timeout_s: float | None = None) -> Hold:
        """acquire() for a thread (the batch runner, the admin, a management command). Raises
        ModelLoadFailed, concurrent.futures.TimeoutError."""
        future = self._hold(entry, keep_alive_s)
        try:
            model = future.result(timeout_s)
        except BaseException:
            self._release(entry)
            raise
        return Hold(self, entry, model)

    def _hold(self, entry: ModelEntry, keep_alive_s: float | None) -> concurrent.futures.Future:
        with self._lock:
            entry.holds += 1
            entry.requests += 1
            entry.last_used = self.clock()
            if keep_alive_s is not None:
                entry.keep_alive_s = keep_alive_s
            return self._start_load(entry)

    def _start_load(self, entry: ModelEntry) -> concurrent.futures.Future:
        """The future of `entry`'s model: done when loaded, the load under way, or a new load."""
        if entry.state == LOADED and entry.loaded is not None:
            done = concurrent.futures.Future()
            done.set_result(entry.loaded.model)
            return done
        if entry.state == LOADING and entry.future is not None:
            return entry.future
        entry.state, entry.error = LOADING, None
        entry.future = concurrent.futures.Future()
        threading.Thread(target=self._load, args=(entry, entry.future), name=f"metrale-load-{entry.name}",
                         daemon=True).start()
        return entry.future

    def load(self, name: str) -> concurrent.futures.Future:
        """Start loading `name` without holding it (an operator's load, a pinned model at start)."""
        with self._lock:
            entry = self.entries[name]
            entry.last_used = self.clock()
            return self._start_load(entry)

    def _load(self, entry: ModelEntry, future: concurrent.futures.Future) -> None:
        with self._load_lock:
            try:
                self._make_room(entry.name, self.loader.estimate(entry.spec), exclude=entry)
                started = time.perf_counter()
                loaded = self.loader.load(entry.spec, self)
                loaded.load_s = loaded.load_s or time.perf_counter() - started
            except Exception as exc:
                failure = exc if isinstance(exc, ModelLoadFailed) else ModelLoadFailed(
                    entry.name, f"{type(exc).__name__}: {exc}")
                with self._lock:
                    entry.state = UNLOADED if isinstance(exc, ModelBudgetBusy) else FAILED
                    entry.error = failure.cause
                    entry.future = None
                log.error("%s", failure, exc_info=not isinstance(exc, ModelLoadFailed))
                future.set_exception(failure)
                return
            with self._lock:
                entry.loaded, entry.state, entry.error = loaded, LOADED, None
                entry.loaded_at = int(time.time())
                entry.future = None
            log.info("model %s loaded in %.2f s (%s, resident %.1f MB of which KV pool %.1f MB)", entry.name,
                     loaded.load_s, entry.kind, loaded.resident_bytes / 1e6, loaded.kv_bytes / 1e6)
            future.set_result(loaded.model)
        self._after_load(entry)

    def _after_load(self, entry: ModelEntry) -> None:
        """Hook for the process registry (embedding runners' host, the runtime_ready signal)."""

    def resident_bytes(self) -> int:
        """The loaded models' resident bytes (weights as measured after load, plus KV pools), and those of
        models a swap replaced that are still draining."""
        with self._lock:
            return (sum(e.loaded.resident_bytes for e in self.entries.values() if e.loaded is not None)
                    + sum(r.resident_bytes for r in self._retiring))

    def _evictable_bytes(self, exclude: ModelEntry | None) -> int:
        with self._lock:
            return sum(e.loaded.resident_bytes for e in self.entries.values() if e is not exclude
                       and e.state == LOADED and e.loaded is not None and not e.pinned and not e.busy())

    def _make_room(self, name: str, need: int, exclude: ModelEntry | None = None, freed: int = 0) -> None:
        """Unload idle models (never `exclude`), least recently used first, until `need` more bytes fit
        the budget, `freed` of the resident bytes being freed by the caller before it loads (a swap that
        drains first). Raises ModelLoadFailed naming `name` when `need` exceeds the whole budget,
        ModelBudgetBusy when the models in the way stay busy (or pinned) for load_wait_s."""
        budget = self.budget_bytes
        if budget is None:
            return
        if need > budget:
            raise ModelLoadFailed(name, f"it needs about {need / 1e6:.0f} MB and the memory budget "
                                        f"(METRALE_MEMORY_BUDGET) is {budget / 1e6:.0f} MB")
        deadline = time.monotonic() + self.load_wait_s
        while self.resident_bytes() - freed + need > budget:
            victim = self._lru_idle(exclude=exclude)
            if victim is not None:
                self._unload(victim, why="to make room under the memory budget for " + name)
                continue
            if time.monotonic() >= deadline:
                in_way = ", ".join(e.name for e in self.entries.values() if e.loaded is not None and e is not exclude)
                if self._retiring:
                    in_way += (", " if in_way else "") + f"{len(self._retiring)} replaced model(s) still draining"
                raise ModelBudgetBusy(name, f"the memory budget ({budget / 1e6:.0f} MB) is taken by models "
                                            f"that are busy or pinned ({in_way}); retry shortly")
            time.sleep(0.05)

    def _lru_idle(self, exclude: ModelEntry | None = None) -> ModelEntry | None:
        with self._lock:
            idle = [e for e in self.entries.values() if e is not exclude and e.state == LOADED
                    and not e.pinned and not e.busy()]
            return min(idle, key=lambda e: e.last_used) if idle else None

    # --- swapping (operations/swap.py drives it) ---

    @contextlib.contextmanager
    def exclusive(self) -> Iterator["ModelRegistry"]:
        """Hold the registry's load lock for the block: no load (on demand, an operator's, another swap)
        runs meanwhile; they wait and then see what the block left."""
        with self._load_lock:
            yield self

    def room_for_swap(self, entry: ModelEntry, spec: ModelSpec) -> bool:
        """Make room for `spec` to replace `entry` (inside `exclusive()`): True when it loads beside the
        running model (idle models unloaded first, least recently used first), False when `entry`'s model
        must drain and stop first (its bytes then count as freed; the loader's fits_beside says no, or the
        budget holds the two only without it). Raises what _make_room raises (ModelLoadFailed: bigger than
        the whole budget; ModelBudgetBusy: busy or pinned models in the way for load_wait_s) before
        anything is drained."""
        need = self.loader.estimate(spec)
        old = entry.loaded
        budget = self.budget_bytes
        beside = old is None or (
            (budget is None or self.resident_bytes() - self._evictable_bytes(entry) + need <= budget)
            and self.loader.fits_beside(spec, old))
        self._make_room(spec.name, need, exclude=entry, freed=0 if beside else old.resident_bytes)
        return beside

    def drain(self, entry: ModelEntry, why: str, timeout_s: float) -> Loaded | None:
        """Stop serving `entry` (requests naming it wait: `unavailable` = why), wait up to timeout_s for
        its running requests, then stop its model (inside `exclusive()`, a swap that drains first).
        Returns the stopped Loaded (None when nothing was loaded)."""
        with self._lock:
            entry.unavailable = why
            loaded = entry.loaded
        if loaded is None:
            return None
        deadline = time.monotonic() + timeout_s
        while not loaded.idle() and time.monotonic() < deadline:
            time.sleep(0.05)
        with self._lock:
            entry.loaded, entry.state = None, UNLOADED
        self._stop(entry, loaded, why="to be swapped")
        return loaded

    def retire(self, loaded: Loaded, name: str, timeout_s: float) -> threading.Thread:
        """Stop `loaded` (a model a swap replaced, no longer in the registry) once no request runs on it,
        up to timeout_s, on a thread of its own; its bytes count against the budget until then."""
        with self._lock:
            self._retiring.append(loaded)

        def run():
            deadline = time.monotonic() + timeout_s
            while not loaded.idle() and time.monotonic() < deadline:
                time.sleep(0.05)
            try:
                loaded.release()
            except Exception:
                log.exception("stopping the replaced model %s failed", name)
            with self._lock:
                self._retiring.remove(loaded)
            log.info("the replaced model %r stopped after draining (%.1f MB freed)", name, loaded.resident_bytes / 1e6)

        thread = threading.Thread(target=run, name="metrale-drain-old", daemon=True)
        thread.start()
        return thread

    def set_swap_status(self, **fields) -> None:
        """Record a swap's step in `swap_status` (since: now)."""
        with self._lock:
            self.swap_status = {**self.swap_status, **fields, "since": time.time()}

    def _release(self, entry: ModelEntry) -> None:
        with self._lock:
            entry.holds = max(0, entry.holds - 1)
            entry.last_used = self.clock()

    # --- unloading ---

    def unload(self, name: str, *, force: bool = False) -> bool:
        """Unload `name` now if it is loaded and idle (an operator's unload; `force`: also when pinned).
        Returns whether it was unloaded."""
        entry = self.entries[name]
        with self._lock:
            if entry.state != LOADED or entry.busy() or (entry.pinned and not force):
                return False
        return self._unload(entry, why="on request")

    def _unload(self, entry: ModelEntry, why: str) -> bool:
        with self._lock:
            if entry.state != LOADED or entry.busy():
                return False
            loaded, entry.loaded, entry.state = entry.loaded, None, UNLOADED
        self._stop(entry, loaded, why)
        return True

    def _stop(self, entry: ModelEntry, loaded: Loaded, why: str) -> None:
        try:
            loaded.release()
        except Exception:
            log.exception("stopping model %s failed", entry.name)
        self._after_unload(entry, loaded)
        log.info("model %s unloaded %s (%.1f MB freed)", entry.name, why, loaded.resident_bytes / 1e6)

    def _after_unload(self, entry: ModelEntry, loaded: Loaded) -> None:
        """An embedding runner whose units ran on the unloaded chat engine's thread moves to a thread
        of its own (EmbeddingRunner.start_thread), so embeddings keep being served."""
        engine = getattr(loaded.model, "engine", None)
        for _, service in self.loaded_models(EMBEDDING):
            runner = getattr(service, "runner", None)
            if runner is not None and engine is not None and getattr(runner, "host", None) is engine:
                runner.start_thread()
                log.info("embedding model %s: its passes run on a thread of their own (%s unloaded)",
                         getattr(service, "name", "?"), entry.name)

    def mark_failed(self, name: str, error: str) -> None:
        """`name`'s engine died (its requests have ended Failed): drop it as failed; the next request
        naming it loads it again."""
        entry = self.entries.get(name)
        if entry is None:
            return
        with self._lock:
            loaded, entry.loaded, entry.state, entry.error = entry.loaded, None, FAILED, error
        if loaded is not None:
            self._after_unload(entry, loaded)

    def log_configuration(self) -> None:
        """The start-up line: which models are configured (kind, source), which are pinned, which are
        loaded, the budget, and why (module doc of model_specs: METRALE_MODELS, else METRALE_MODEL and
        METRALE_EMBEDDING_MODEL; pins: METRALE_PIN, else the first chat model)."""
        with self._lock:
            configured = "; ".join(f"{e.name} ({e.kind}, {e.spec.source})" for e in self.entries.values())
            pinned = ", ".join(e.name for e in self.entries.values() if e.pinned) or "none"
            loaded = ", ".join(e.name for e in self.entries.values() if e.state == LOADED) or "none"
            failed = ", ".join(f"{e.name}: {e.error}" for e in self.entries.values() if e.state == FAILED)
        budget = f"{self.budget_bytes / 1e6:.0f} MB" if self.budget_bytes else "none"
        log.info("models configured: %s; pinned (loaded at start, never unloaded): %s; loaded: %s%s; memory budget: "
                 "%s; the others load on their first request", configured, pinned, loaded,
                 f"; failed: {failed}" if failed else "", budget)

    def reap(self) -> list[str]:
        """Unload every idle, unpinned model whose keep_alive has passed since its last use (the
        reaper thread's tick). Returns the names unloaded."""
        now = self.clock()
        with self._lock:
            due = [e for e in self.entries.values() if e.state == LOADED and not e.pinned and not e.busy()
                   and not math.isinf(e.keep_alive_s) and now - e.last_used >= e.keep_alive_s]
        return [e.name for e in due if self._unload(e, why=f"after keep_alive {e.keep_alive_s:g} s idle")]

    def start(self) -> list[concurrent.futures.Future]:
        """Start the reaper thread and load the pinned models (idempotent); the pinned loads' futures."""
        with self._lock:
            if self._reaper is not None:
                return []
            self._reaper = threading.Thread(target=self._reap_loop, name="metrale-reaper", daemon=True)
            self._reaper.start()
            pinned = [e.name for e in self.entries.values() if e.pinned]
        return [self.load(name) for name in pinned]

    def _reap_loop(self) -> None:
        while not self._stopped.wait(REAP_INTERVAL_S):
            try:
                self.reap()
            except Exception:
                log.exception("unloading idle models failed")

    def stop(self) -> None:
        """Stop the reaper and every loaded model's engine (shutdown, tests)."""
        self._stopped.set()
        for entry in list(self.entries.values()):
            with self._lock:
                loaded, entry.loaded, entry.state = entry.loaded, None, UNLOADED
            if loaded is not None:
                with contextlib.suppress(Exception):
                    loaded.release()

    # --- settings an operator changes ---

    def pin(self, name: str, pinned: bool = True) -> None:
        """Pin (load now, never unload) or unpin `name`."""
        entry = self.entries[name]
        with self._lock:
            entry.pinned = pinned
        if pinned:
            self.load(name)

    def set_keep_alive(self, name: str, seconds: float) -> None:
        with self._lock:
            self.entries[name].keep_alive_s = seconds

    # --- names added while the process runs (module doc) ---

    def alias(self, name: str, target: str) -> None:
        """`name` selects the served model `target` from now on (an alias of an alias selects its model).
        Raises KeyError when `target` selects no model, ValueError when `name` is a served model's own."""
        with self._lock:
            served = self.aliases.get(target, target)
            if served not in self.entries:
                raise KeyError(target)
            if name in self.entries:
                raise ValueError(f"{name!r} is a served model's own name")
            self.aliases[name] = served

    def aliases_of(self, name: str) -> list[str]:
        """The aliases made at run time that select the served model `name`, in the order they were made."""
        with self._lock:
            return [alias for alias, served in self.aliases.items() if served == name]

    def add(self, spec: ModelSpec) -> ModelEntry:
        """Serve `spec` from now on (a catalogue model pulled while the process runs), unloaded until a request
        names it, with the default keep_alive. Returns its entry (the existing one when that name is served)."""
        with self._lock:
            entry = self.entries.get(spec.name)
            if entry is None:
                entry = self.entries[spec.name] = ModelEntry(spec, keep_alive_s=self.keep_alive_s, added=True)
            self.aliases.pop(spec.name, None)
            return entry

    def remove(self, name: str) -> None:
        """Stop serving `name`: an alias (`alias`), or a model `add` served (unloaded first, and the aliases that
        select it dropped). Raises KeyError when nothing of that name is served, ValueError (the reason, a
        sentence) for a configured model or one a request holds."""
        with self._lock:
            if name in self.aliases:
                del self.aliases[name]
                return
            entry = self.entries[name]
            if not entry.added:
                raise ValueError(f"{name} is configured (METRALE_MODELS); take it out of the configuration to stop "
                                 "serving it")
            if entry.busy() or entry.state == LOADING:
                raise ValueError(f"{name} is loading or answering requests; retry once they end")
        if entry.state == LOADED and not self._unload(entry, why="removed on request"):
            raise ValueError(f"{name} is answering requests; retry once they end")
        with self._lock:
            self.entries.pop(name, None)
            self.aliases = {a: served for a, served in self.aliases.items() if served != name}

    def expires_in_s(self, name: str) -> float | None:
        """Seconds until the reaper may unload the loaded model `name`: its keep_alive less the time it has
        been idle (its whole keep_alive while a request holds it), math.inf for a pinned model or one kept
        for good; None when it is not loaded."""
        with self._lock:
            entry = self.entries.get(name)
            if entry is None or entry.state != LOADED:
                return None
            if entry.pinned or math.isinf(entry.keep_alive_s):
                return math.inf
            if entry.busy():
                return entry.keep_alive_s
            return max(0.0, entry.keep_alive_s - (self.clock() - entry.last_used))

    def install(self, entry: ModelEntry, spec: ModelSpec, loaded: Loaded | None) -> ModelEntry:
        """Serve `loaded` (already loaded from `spec`) in `entry`'s place (the swap's switch): the entry
        keeps its position, pin and keep_alive under the new spec's name; None: nothing loaded (a
        drain-first swap before its load). Returns the new entry; requests that took the old model
        keep it."""
        with self._lock:
            new = ModelEntry(spec, keep_alive_s=entry.keep_alive_s, pinned=entry.pinned,
                             state=LOADED if loaded is not None else UNLOADED, loaded=loaded,
                             last_used=self.clock(), loaded_at=int(time.time()) if loaded is not None else None)
            self.entries = {(spec.name if k == entry.name else k): (new if e is entry else e)
                            for k, e in self.entries.items()}
            return new

    # --- what operators see ---

    def state_of(self, entry: ModelEntry) -> dict:
        """One model's state as /v1/models (extra fields), the admin and `manage.py models` show it."""
        from .model_settings import format_keep_alive

        with self._lock:
            loaded = entry.loaded
            return {"id": entry.name, "kind": entry.kind, "state": entry.state, "error": entry.error,
                    "pinned": entry.pinned, "keep_alive": format_keep_alive(entry.keep_alive_s),
                    "resident_bytes": loaded.resident_bytes if loaded else None,
                    "kv_cache_bytes": loaded.kv_bytes if loaded else None,
                    "requests_running": entry.holds, "requests_total": entry.requests,
                    "idle_s": round(self.clock() - entry.last_used, 3) if entry.last_used else None,
                    "loaded_at": entry.loaded_at, "load_s": round(loaded.load_s, 3) if loaded else None,
                    "source": entry.spec.source}

    def states(self) -> list[dict]:
        with self._lock:
            return [self.state_of(e) for e in self.entries.values()]

    def loaded_models(self, kind: str | None = None) -> list[tuple[ModelEntry, object]]:
        """(entry, model) of every loaded model (of `kind`), in configured order."""
        with self._lock:
            return [(e, e.loaded.model) for e in self.entries.values()
                    if e.loaded is not None and (kind is None or e.kind == kind)]

    def runtime(self, name: str | None = None):
        """The loaded model `name` (default: the default chat model) without loading it, or None."""
        with self._lock:
            entry = self.entries.get(name) if name else self.default(CHAT)
            return entry.loaded.model if entry is not None and entry.loaded is not None else None


# --- the process's registry ---

_process: ModelRegistry | None = None
_process_lock = threading.Lock()


def process_registry() -> ModelRegistry:
    """This process's registry, built from the settings on first use (nothing loads until `start()`
    or a request)."""
    global _process
    with _process_lock:
        if _process is None:
            from .runtime import build_registry

            _process = build_registry()
        return _process


@contextlib.contextmanager
def serving(registry: ModelRegistry) -> Iterator[ModelRegistry]:
    """Serve `registry` as the process's for the block (tests), then the previous one again."""
    global _process
    with _process_lock:
        previous, _process = _process, registry
    try:
        yield registry
    finally:
        with _process_lock:
            _process = previous


def reset_process_registry() -> None:
    """Forget the process's registry (the next process_registry() builds it from the settings)."""
    global _process
    with _process_lock:
        _process = None


__all__ = ["CHAT", "EMBEDDING", "FAILED", "Hold", "LOADED", "LOADING", "Loaded", "Loader", "ModelBudgetBusy",
           "ModelEntry", "ModelLoadFailed", "ModelRegistry", "UNLOADED", "process_registry", "serving"]
