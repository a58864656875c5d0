"""AsyncEngine: the process's engine thread, with submit / abort and per-request event streams.

One thread owns all engine state. New requests and aborts arrive on a queue that
the loop drains between steps; each request's events go to its own asyncio queue
through `loop.call_soon_threadsafe`, so the engine never waits on a slow client.

Faults: a request that fails (at admission or in a step) ends alone with Failed; that
isolation is the LLMEngine's. The waiting queue is bounded by
EngineConfig.max_waiting_requests: past it `submit` raises EngineOverloaded at once. If the
loop itself dies (an exception outside the per-request isolation), every live and queued
request ends with Failed, later submissions get Failed at once, and `on_fatal` is called
so the process can exit and be restarted.

Operators: `cancel(request_id)` ends a request by its id (blocks freed at the next step, its
consumer gets Finished("cancelled")); `snapshot()` gives the engine's live state as plain data
(engine/snapshot.py), built on this thread between steps; `reset_prefix_cache()` forgets the cached
blocks no running request holds, between steps too. They answer through a
concurrent.futures.Future, so no caller ever holds the engine's state while it steps.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from .config import EngineConfig
from .core_share import name_this_thread
from .llm_engine import LLMEngine
from .outputs import EngineOverloaded, Failed, Finished, RequestRejected
from .request import EngineRequest
from .scheduler import StepOutputs
from .sequence import Sequence
from .snapshot import engine_snapshot

log = logging.getLogger("metrale.engine")

# The Retry-After hint of EngineOverloaded, in seconds: the queue drains as running requests end,
# and a second is the shortest wait HTTP's Retry-After can say.
OVERLOAD_RETRY_AFTER_S = 1
# How often an idle engine thread wakes to sample the machine's load (core_share.SAMPLE_EVERY_S apart).
IDLE_WAKE_S = 0.05


@dataclass(eq=False)
class RequestHandle:
    """An async iterator over a request's TokenEvents, ending with Finished or Failed."""

    request_id: str
    engine: "AsyncEngine"
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    done: bool = False
    seq: Sequence | None = None

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.done:
            raise StopAsyncIteration
        event = await self.queue.get()
        if isinstance(event, (Finished, Failed)):
            self.done = True
        return event

    def abort(self, reason: str = "cancelled") -> None:
        """Ask the engine to drop this request at its next step (no-op once it has ended)."""
        if not self.done:
            self.engine._commands.append(("abort", self, reason))
            self.engine._wake.set()


# Seconds the dying loop leaves the consumers of failed requests to write their answers out.
FATAL_FLUSH_S = 0.5


class AsyncEngine:
    """Runs an LLMEngine in a daemon thread. `submit` is called from the event loop.

    Give either a built `engine` or a `config`: with a config, the engine thread builds
    the LLMEngine itself and the constructor returns once it is loaded (raising what
    LLMEngine(config) raises: ConfigError, OSError, ...). Serving should use a config:
    then one thread does all of the engine's torch and kernel work. OpenMP (libgomp)
    keeps a worker pool for every live thread that has run a parallel region, and with
    more pooled threads than CPUs it stops spinning between regions and wakes its
    workers through the OS. Measured on a 2-vCPU VM: 150 µs per parallel region
    instead of 7, a batch-1 decode step of 27 ms instead of 9.5, when the engine was
    built on the main thread and stepped on this one.

    on_fatal: called on the engine thread with the exception when its loop dies, after every
    request has been failed and their consumers have read that (up to `fatal_grace_s` seconds).
    kv_events: with a config, the LLMEngine's (each step's prefix-cache events, on the engine thread).
    """

    def __init__(self, engine: LLMEngine | None = None, *, config: EngineConfig | None = None,
                 on_fatal: Callable[[BaseException], None] | None = None, fatal_grace_s: float = 2.0,
                 kv_events: Callable[[list], None] | None = None):
        if (engine is None) == (config is None):
            raise TypeError("AsyncEngine takes an LLMEngine or an EngineConfig (config=...), not both")
        self.engine = engine
        self.on_fatal = on_fatal
        self.fatal_grace_s = fatal_grace_s
        self._commands: deque = deque()
        self._wake = threading.Event()
        self._handles: dict[int, RequestHandle] = {}
        self._ids = itertools.count()
        self._stopped = False
        # Guards _num_queued and _fatal against the engine thread: submit may run on several threads.
        self._lock = threading.Lock()
        self._num_queued = 0  # add commands not yet admitted
        self._fatal: str | None = None  # why the loop died (then every submission fails at once)
        self._embeddings = None  # an EmbeddingRunner whose units run between steps (attach_embeddings)
        self._built = threading.Event()
        self._build_error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(config, kv_events), name="metrale-engine",
                                        daemon=True)
        self._thread.start()
        if config is not None:
            self._built.wait()
            if self._build_error is not None:
                self._thread.join()
                raise self._build_error

    @property
    def max_model_len(self) -> int:
        """The model's context length in tokens (the setting, capped by the model's)."""
        return self.engine.max_model_len

    @property
    def max_request_tokens(self) -> int:
        """The most tokens (prompt + completion) one request may hold (LLMEngine.max_request_tokens)."""
        return self.engine.max_request_tokens

    @property
    def block_size(self) -> int:
        """Tokens per KV block (the prefix cache's unit)."""
        return self.engine.block_manager.block_size

    @property
    def num_running(self) -> int:
        """Requests in the running batch (vLLM's num_requests_running)."""
        return self.engine.scheduler.num_running_requests()

    @property
    def num_waiting(self) -> int:
        """Requests submitted and not running yet: queued for admission or in the scheduler's waiting queue."""
        return self._num_queued + len(self.engine.scheduler.waiting)

    def submit(self, request: EngineRequest) -> RequestHandle:
        """Queue a request; returns its handle at once.

        Raises RequestRejected when it can never fit (LLMEngine.check_fits), and EngineOverloaded
        when EngineConfig.max_waiting_requests requests are already waiting. Once the engine
        thread has died, the handle ends with Failed at once.
        """
        loop = asyncio.get_running_loop()
        self.engine.check_fits(len(request.prompt_token_ids), request.params.max_tokens)
        handle = RequestHandle(request.request_id or f"req-{next(self._ids)}", self, loop)
        deadline = time.monotonic() + request.timeout_s if request.timeout_s else None
        limit = self.engine.config.max_waiting_requests
        with self._lock:
            fatal = self._fatal
            if fatal is None:
                if limit and self.num_waiting >= limit:
                    raise EngineOverloaded(f"the server is at capacity: {limit} requests are already waiting",
                                           retry_after_s=OVERLOAD_RETRY_AFTER_S)
                self._num_queued += 1
                self._commands.append(("add", handle, (request, deadline, time.monotonic())))
        if fatal is not None:
            self._push(handle, [Failed(fatal)])
        else:
            self._wake.set()
        return handle

    def call(self, fn: Callable[[LLMEngine], object]) -> concurrent.futures.Future:
        """Run fn(engine) on the engine thread between two steps (engine/lora_control.py loads and
        unloads adapters this way); the future gets its result or exception."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            fatal = self._fatal
            if fatal is None:
                self._commands.append(("call", None, (fn, future)))
        if fatal is not None:
            future.set_exception(RuntimeError(fatal))
        self._wake.set()
        return future

    def reset_prefix_cache(self) -> concurrent.futures.Future:
        """Forget the prefix cache's blocks that no running request holds, on the engine thread between two
        steps (LLMEngine.reset_prefix_cache: never during a step). The future's result: how many cached blocks
        were forgotten; it fails with RuntimeError once the loop died."""
        return self.call(lambda engine: engine.reset_prefix_cache())

    def fail_all(self, message: str) -> None:
        """End every request in flight with Failed(message) at the next step boundary, freeing
        their KV blocks (a server shutting down past its grace period ends them in-band this
        way). Requests submitted afterwards run as usual."""
        self._commands.append(("fail_all", None, message))
        self._wake.set()

    def cancel(self, request_id: str) -> concurrent.futures.Future:
        """End the live request(s) named `request_id` (an engine request id, or the id of an API
        request whose choices are `<request_id>-<n>`) with reason "cancelled" at the next step
        boundary; their blocks return to the pool. The future's result: how many ended (0: none
        was live)."""
        future = concurrent.futures.Future()
        self._commands.append(("cancel", None, (request_id, future)))
        self._wake.set()
        return future

    def snapshot(self) -> concurrent.futures.Future:
        """The engine's state (engine/snapshot.engine_snapshot) as of the next step boundary, in a
        future (await it with asyncio.wrap_future). It fails with RuntimeError once the loop died."""
        future = concurrent.futures.Future()
        if self._fatal is not None:
            future.set_exception(RuntimeError(self._fatal))
            return future
        self._commands.append(("snapshot", None, future))
        self._wake.set()
        return future

    def idle(self) -> bool:
        """Whether no request is open, no command waits and the engine has nothing scheduled (a snapshot
        read from any thread: a request submitted right after may make it stale)."""
        return not self._handles and not self._commands and not self.engine.has_work() and not (
            self._embeddings is not None and self._embeddings.host is self and self._embeddings.has_work())

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the engine thread after its current step and wait for it (up to `timeout` seconds):
        a daemon thread still inside torch when the interpreter exits can abort the process."""
        self._stopped = True
        self._wake.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    # --- engine thread ---

    def _push(self, handle: RequestHandle, events: list) -> None:
        self._push_step(handle.loop, [(handle, events)])

    @staticmethod
    def _push_step(loop: asyncio.AbstractEventLoop, batch: list) -> None:
        """One step's events for every request of one event loop, in a single wake-up of that loop:
        each wake-up is a context switch that can preempt one of the step's compute threads."""
        def deliver():
            for handle, events in batch:
                for e in events:
                    handle.queue.put_nowait(e)
        try:
            loop.call_soon_threadsafe(deliver)
        except RuntimeError:  # the clients' event loop is gone
            pass

    def _drain_commands(self) -> None:
        # A command leaves the queue once applied: one whose handling raises is still there for _die.
        while self._commands:
            self._apply(*self._commands[0])
            self._commands.popleft()

    def _apply(self, kind: str, handle: RequestHandle, arg) -> None:
        if kind == "add":
            request, deadline, arrival = arg
            try:
                seq = self.engine.add_request(request, deadline, request_id=handle.request_id,
                                              arrival_time=arrival)
            except RequestRejected as exc:
                self._push(handle, [Failed(str(exc))])
                return
            finally:
                with self._lock:
                    self._num_queued -= 1
            handle.seq = seq
            self._handles[id(seq)] = handle
        elif kind == "abort":
            seq = handle.seq
            if seq is not None and not seq.is_finished:
                self.engine.abort(seq, arg)
                self._retire(seq)
        elif kind == "call":
            fn, future = arg
            try:
                future.set_result(fn(self.engine))
            except Exception as exc:  # the caller's to handle
                future.set_exception(exc)
        elif kind == "cancel":
            request_id, future = arg
            named = [h.seq for h in self._handles.values()
                     if h.request_id == request_id or h.request_id.rpartition("-")[0] == request_id]
            try:
                for seq in named:
                    self.engine.abort(seq, "cancelled")
                    self._retire(seq)
            finally:  # the operator hears back whatever happens (an abort that raises is a loop fault)
                if not future.done():
                    future.set_result(len(named))
        elif kind == "snapshot":
            try:
                snapshot = engine_snapshot(self.engine, self._num_queued)
            except Exception as exc:  # a dashboard's bug must not stop the engine
                log.exception("building the engine snapshot failed")
                arg.set_exception(exc)
            else:
                if not arg.done():
                    arg.set_result(snapshot)
        elif kind == "fail_all":
            for live in self._handles.values():
                self.engine.abort(live.seq, "error")
            self._push_all([(live, [Failed(arg)]) for live in self._handles.values()])
            self._handles.clear()

    def _retire(self, seq: Sequence) -> None:
        handle = self._handles.pop(id(seq), None)
        if handle is not None:
            self._push(handle, [seq.finished_output()])

    def _expire_deadlines(self) -> None:
        now = time.monotonic()
        for key, handle in list(self._handles.items()):
            seq = handle.seq
            if seq is not None and seq.deadline is not None and now >= seq.deadline and not seq.is_finished:
                self.engine.abort(seq, "timeout")
                self._retire(seq)

    def _run(self, config: EngineConfig | None, kv_events) -> None:
        name_this_thread(self._thread.name)
        if config is not None:
            try:
                self.engine = LLMEngine(config, kv_events)
            except BaseException as exc:  # handed to the constructor's caller
                self._build_error = exc
                return
            finally:
                self._built.set()
        try:
            self._loop()
        except BaseException as exc:  # the loop's one failure path: outside the per-request isolation
            self._die(exc)

    def _loop(self) -> None:
        while not self._stopped:
            self._drain_commands()
            self._expire_deadlines()
            side = self._embeddings if self._embeddings is not None and self._embeddings.host is self else None
            side_work = side is not None and side.has_work()
            if not self.engine.has_work():
                team = getattr(self.engine, "team", None)
                if side_work:  # chat idle: embedding units back to back, commands checked between slices
                    side.run_for(side.idle_slice_s, busy=False, team=team)
                    continue
                if team is not None:  # idle: the OpenMP workers ended, the others' load kept current (core_share.py)
                    team.rest()
                    team.observe()
                self._wake.wait(timeout=IDLE_WAKE_S if team is not None and team.adaptive else 0.5)
                self._wake.clear()
                continue
            started = time.perf_counter()
            self._deliver(self.engine.step())
            if side_work:  # a bounded share of this step's time, so decode steps stay about (1 + share) apart
                side.run_for(side.share * (time.perf_counter() - started), busy=True)

    def attach_embeddings(self, runner) -> None:
        """Run an embedding_runner.EmbeddingRunner's units on this engine's thread, between steps (the
        runner's `share` of each step's time while requests run; back to back while none do). The
        runner follows the engine it was attached to last (a swapped-in model's)."""
        self._embeddings = runner
        runner.host = self
        runner.wake = self._wake.set
        self._wake.set()

    def detach_embeddings(self, runner) -> None:
        """Stop running `runner`'s units here (its embedding model unloads, idle); nothing when another
        runner is attached. The engine then holds no reference to it (its memory can go)."""
        if self._embeddings is runner:
            self._embeddings = None
        if runner.host is self:
            runner.host = None

    def _die(self, exc: BaseException) -> None:
        """The loop died: log why, fail every live and queued request (no client waits forever),
        let their consumers read that, then call on_fatal."""
        log.critical("the engine thread's loop died; failing every request",
                     exc_info=(type(exc), exc, exc.__traceback__))
        message = f"engine stopped: {type(exc).__name__}: {exc}"
        with self._lock:
            self._fatal = message
            queued = [handle for kind, handle, _ in self._commands if kind == "add"]
            waiting = [arg if kind == "snapshot" else arg[1] for kind, _, arg in self._commands
                       if kind in ("snapshot", "cancel", "call")]
            self._commands.clear()
        for future in waiting:  # an operator's call waiting on the loop gets the reason, not silence
            if not future.done():
                future.set_exception(RuntimeError(message))
        doomed = [*self._handles.values(), *queued]
        self._handles.clear()
        self._push_all([(handle, [Failed(message)]) for handle in doomed])
        deadline = time.monotonic() + self.fatal_grace_s
        while any(not h.done for h in doomed) and time.monotonic() < deadline:
            time.sleep(0.01)
        if doomed:
            # A consumer that has read its Failed still has to write its answer to the socket
            # before on_fatal (which may end the process) runs.
            time.sleep(max(0.0, min(FATAL_FLUSH_S, deadline - time.monotonic())))
        if self.on_fatal is not None:
            self.on_fatal(exc)

    def _deliver(self, outputs: StepOutputs) -> None:
        """Hand one step's events to their handles; a request whose events end with Finished or
        Failed is done."""
        pairs = []
        for seq, events in outputs:
            handle = self._handles.get(id(seq))
            if handle is None:
                continue
            if isinstance(events[-1], (Finished, Failed)):
                del self._handles[id(seq)]
            pairs.append((handle, events))
        self._push_all(pairs)

    def _push_all(self, pairs: list[tuple[RequestHandle, list]]) -> None:
        """Events for several handles, one wake-up per event loop (see _push_step)."""
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for handle, events in pairs:
            by_loop.setdefault(handle.loop, []).append((handle, events))
        for loop, batch in by_loop.items():
            self._push_step(loop, batch)
