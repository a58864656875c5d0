"""EmbeddingRunner: embedding requests batched by a token budget and run in bounded units beside decode.

Requests (lists of token id lists) queue here from the event loop. The runner packs queued inputs
into a pass of at most `max_batch_tokens` tokens (TEI's rule: inputs of any lengths share a pass,
none padded) and runs the encoder's units (models/bert.BertEncoder.units) on its host's thread: the
chat engine's (AsyncEngine.attach_embeddings), which after each step of its own gives the runner
`share` of that step's time, units of at most `busy_chunk_rows` rows, so an interactive stream's
decode steps are never more than about (1 + share) apart however much embedding work waits; with no
chat work the runner's units are `idle_chunk_rows` rows and run back to back, on the host's thread
team (core_share.ThreadTeam), a pass of at most `solo_rows` rows on one thread. Without a chat engine,
`start_thread` gives the runner a thread of its own (`end_thread` ends it when a chat engine comes to
host it); that thread steps under the process's thread-team rule like an engine's (core_share.ThreadTeam:
a team of its own among the process's, sized with torch.set_num_threads before each unit). A pass that
raises fails the requests it held and no other.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .core_share import ThreadTeam, name_this_thread
from .embedding_model import EmbeddingModel
from .models.bert import PackedBatch
from .stats import REQUEST_LATENCY_BUCKETS_S, Histogram, build_1_2_5_buckets

log = logging.getLogger("metrale.engine")


@dataclass(slots=True)
class EmbeddingJob:
    """One request's inputs, its vectors as they come (float32 little-endian bytes, one per input), and
    where the result goes (an asyncio future of its loop)."""

    sequences: list[list[int]]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    vectors: list[bytes | None] = field(default_factory=list)
    next_input: int = 0  # the first input not yet in a pass
    remaining: int = 0
    submitted_s: float = 0.0
    failed: bool = False

    def settle(self, result=None, error: BaseException | None = None) -> None:
        def deliver():
            if self.future.done():
                return
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(result)
        try:
            self.loop.call_soon_threadsafe(deliver)
        except RuntimeError:  # the client's event loop is gone
            pass


class EmbeddingStats:
    """Plain counters and histograms of pooling requests, read by /metrics (metrics.py: vLLM's names,
    the embedding model's model_name): requests finished (vLLM's finished_reason "stop") and failed,
    prompt tokens, passes, e2e latency and prompt tokens per request."""

    def __init__(self, max_input_tokens: int):
        self.requests_finished = 0
        self.requests_failed = 0
        self.prompt_tokens = 0
        self.passes = 0
        self.e2e_s = Histogram(REQUEST_LATENCY_BUCKETS_S)
        self.request_prompt_tokens = Histogram(build_1_2_5_buckets(max_input_tokens * 2048))


class EmbeddingRunner:
    """The embedding model's queue and passes. `share`: the fraction of each chat step's time given to
    embedding units while chat work runs; busy_chunk_rows / idle_chunk_rows: the rows of one unit then
    and when chat is idle; max_batch_tokens: the most tokens of one pass; solo_rows: while chat is idle, a
    pass of at most this many rows (tokens) runs on one thread, too small for a second one to pay
    (core_share's rule; 0: never; all-MiniLM-L6-v2 on the 2-vCPU AVX2 EPYC: 12 rows 15.0 ms alone, 14.1 on
    two threads; 64 rows 59.9 alone, 35.2 on two); team: makes the ThreadTeam its own thread steps under
    (core_share; the loader passes the engine settings' num_threads and adaptive_threads)."""

    def __init__(self, model: EmbeddingModel, *, max_batch_tokens: int = 8192, share: float = 0.35,
                 busy_chunk_rows: int = 32, idle_chunk_rows: int = 1024, idle_slice_s: float = 0.02,
                 solo_rows: int = 32, team: Callable[[], ThreadTeam] = ThreadTeam):
        if not 0 < share <= 4 or busy_chunk_rows <= 0 or idle_chunk_rows <= 0 or solo_rows < 0:
            raise ValueError("share must be in (0, 4], the chunk rows positive and solo_rows >= 0")
        if max_batch_tokens < model.max_input_tokens:
            raise ValueError(f"max_batch_tokens {max_batch_tokens} is under one input's {model.max_input_tokens}")
        self.model = model
        self.max_batch_tokens = max_batch_tokens
        self.share = share
        self.busy_chunk_rows = busy_chunk_rows
        self.idle_chunk_rows = idle_chunk_rows
        self.idle_slice_s = idle_slice_s
        self.solo_rows = solo_rows
        self.stats = EmbeddingStats(model.max_input_tokens)
        self.host: object | None = None  # the AsyncEngine (or own thread) that runs the units
        self.wake: Callable[[], None] = lambda: None
        self._lock = threading.Lock()
        self._queue: deque[EmbeddingJob] = deque()
        self._pass = None  # (units generator, [(job, first input, count)], batch)
        self._busy = False
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._make_team = team
        self.team: ThreadTeam | None = None  # while the runner has a thread of its own

    # --- any thread ---

    def submit(self, sequences: list[list[int]]) -> asyncio.Future:
        """Queue one request's inputs (each a non-empty token id list, at most the model's
        max_input_tokens, ids under its vocab size); returns an asyncio future (of the running loop)
        of their vectors: float32 little-endian bytes each, in order. Raises ValueError for an input
        outside those bounds (the caller's checks should have refused it first)."""
        limit, vocab = self.model.max_input_tokens, self.model.vocab_size
        for s in sequences:
            if not s or len(s) > limit or min(s) < 0 or max(s) >= vocab:
                raise ValueError(f"an input must hold 1 to {limit} token ids in [0, {vocab})")
        loop = asyncio.get_running_loop()
        job = EmbeddingJob(sequences, loop, loop.create_future(), [None] * len(sequences),
                           remaining=len(sequences), submitted_s=time.monotonic())
        if not sequences:
            job.future.set_result([])
            return job.future
        with self._lock:
            self._queue.append(job)
        self.wake()
        return job.future

    def has_work(self) -> bool:
        return self._pass is not None or bool(self._queue)

    # --- the host's thread ---

    def run_for(self, budget_s: float, busy: bool, team: ThreadTeam | None = None) -> None:
        """Run units for about `budget_s` seconds (at least one unit) on the calling thread: the host's.
        busy: chat work is running (units of busy_chunk_rows rows, on the threads of the step before).
        team: the host thread's ThreadTeam, adjusted before each unit when not busy (a pass of at most
        solo_rows rows alone)."""
        self._busy = busy
        deadline = time.perf_counter() + budget_s
        while True:
            if self._pass is None and not self._start_pass():
                return
            units, parts, batch = self._pass
            if team is not None and not busy:
                team.adjust(alone=batch.input_ids.numel() <= self.solo_rows)
            try:
                next(units)
            except StopIteration as done:
                self._pass = None
                self._finish_pass(parts, batch, done.value)
            except Exception as exc:  # this pass's requests fail; the others run on
                self._pass = None
                log.exception("an embedding pass failed")
                for job, _, _ in parts:
                    self._fail(job, exc)
            if time.perf_counter() >= deadline:
                return

    def _chunk_rows(self) -> int:
        return self.busy_chunk_rows if self._busy else self.idle_chunk_rows

    def _start_pass(self) -> bool:
        """Pack queued inputs (oldest first, a request's inputs in order) into the next pass."""
        parts, seqs, tokens = [], [], 0
        with self._lock:
            while self._queue:
                job = self._queue[0]
                if job.future.cancelled() or job.failed:
                    self._queue.popleft()
                    continue
                first = job.next_input
                while job.next_input < len(job.sequences):
                    n = len(job.sequences[job.next_input])
                    if tokens + n > self.max_batch_tokens:
                        break
                    seqs.append(job.sequences[job.next_input])
                    tokens += n
                    job.next_input += 1
                if job.next_input > first:
                    parts.append((job, first, job.next_input - first))
                if job.next_input < len(job.sequences):
                    break  # the pass is full
                self._queue.popleft()
        if not seqs:
            return False
        batch = PackedBatch.pack(seqs)
        self._pass = (self.model.encoder.units(batch, self._chunk_rows), parts, batch)
        return True

    def _finish_pass(self, parts, batch: PackedBatch, hidden: torch.Tensor) -> None:
        vectors = batch.restore(self.model.pooling.pool(hidden, batch.seq_lens)).contiguous()
        raw = vectors.numpy().astype("<f4")
        self.stats.passes += 1
        row = 0
        now = time.monotonic()
        for job, first, count in parts:
            for i in range(count):
                job.vectors[first + i] = raw[row + i].tobytes()
            row += count
            job.remaining -= count
            if job.remaining == 0 and not job.failed:
                tokens = sum(map(len, job.sequences))
                self.stats.requests_finished += 1
                self.stats.prompt_tokens += tokens
                self.stats.request_prompt_tokens.observe(tokens)
                self.stats.e2e_s.observe(now - job.submitted_s)
                job.settle(job.vectors)

    def _fail(self, job: EmbeddingJob, exc: BaseException) -> None:
        if not job.failed:
            job.failed = True
            self.stats.requests_failed += 1
            job.settle(error=RuntimeError(f"embedding failed: {type(exc).__name__}: {exc}"))

    # --- a thread of its own (no chat engine hosts it) ---

    def start_thread(self) -> None:
        """Run the units on a thread of this runner's own (idempotent), its team among the process's
        engines' (core_share.ThreadTeam) from now until the thread ends."""
        if self._thread is not None:
            return
        event = threading.Event()
        self.wake = event.set
        self.host = self

        def loop():
            name_this_thread("metrale-embed")
            self.team = team = self._make_team()  # made here: torch's thread count is set on the thread that steps
            while not self._stopped:
                if self.has_work():
                    self.run_for(self.idle_slice_s, busy=False, team=team)
                else:
                    team.rest()
                    event.wait(0.5)
                    event.clear()

        self._thread = threading.Thread(target=loop, name="metrale-embeddings", daemon=True)
        self._thread.start()

    def end_thread(self) -> None:
        """End the runner's own thread (after its current unit), so that a chat engine can host its units
        (AsyncEngine.attach_embeddings); the queued work stays and runs there."""
        if self._thread is None:
            return
        self._stopped = True
        self.wake()
        self._thread.join(10)
        self._thread, self._stopped, self.host = None, False, None
        self._leave_team()

    def stop(self) -> None:
        """Stop the runner's own thread (if it has one) after its current unit."""
        self._stopped = True
        self.wake()
        if self._thread is not None:
            self._thread.join(10)
        self._leave_team()

    def _leave_team(self) -> None:
        if self.team is not None:
            self.team.leave()
            self.team = None
