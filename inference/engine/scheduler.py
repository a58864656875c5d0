"""Continuous batching: which sequences run this step, how many tokens each computes, and what the step did.

`schedule()` plans a step; `postprocess()` applies the model runner's result: it appends
the sampled tokens and finishes sequences (grammar acceptance, stop rules, max_tokens and
the context's end, in one place), and returns each request's events. Decodes go first (one token each), then prefill in chunks within the per-step token
budget, so a long prompt never stalls running streams for more than one chunk.
When KV blocks run out, the newest running sequence is preempted (its blocks are
freed and it is re-queued at the front, to be recomputed later), never an error.
Low-priority (batch) sequences wait behind every interactive one, at most
`batch_max_num_seqs` of them run at once, and each prefills at most `batch_prefill_chunk`
tokens a step, so batch work never starves interactive requests.
A beam search's live beams (beam_search.py) are sequences like any other; one whose
candidates are in while its siblings' are not computes nothing, and loses its blocks
(parked: not re-queued, its children are) when blocks run short or the queue needs them.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .block_manager import BlockManager
from .outputs import Failed, Finished, TokenEvent
from .repetition import repeats
from .sequence import Sequence, SequenceStatus

if TYPE_CHECKING:
    from .model_runner import RunResult

log = logging.getLogger("metrale.engine")

# What one step hands out: each request's events in order (TokenEvent..., then Finished or Failed).
StepOutputs = list[tuple[Sequence, list[TokenEvent | Finished | Failed]]]


@dataclass(slots=True)
class ScheduledBatch:
    """One step's work: (sequence, number of tokens to compute), decodes first.

    A sequence samples a token this step when its chunk reaches the end of its
    known tokens (`samples`, aligned with `items`).
    """

    items: list[tuple[Sequence, int]] = field(default_factory=list)
    num_decodes: int = 0
    samples: list[bool] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    # items[first_admitted:] were admitted from the waiting queue this step (the newest work).
    first_admitted: int = 0
    # Decode item index -> its draft tokens (speculative.py), verified after the step (verify.py).
    drafts: dict[int, list[int]] = field(default_factory=dict)
    # Copy-on-write K/V copies (source block, destination block) to make before the forward.
    block_copies: list[tuple[int, int]] = field(default_factory=list)
    # The same for the sliding-window layers' own pool (hybrid_block_manager.py), else empty.
    window_block_copies: list[tuple[int, int]] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.items)

    def __bool__(self) -> bool:
        return bool(self.items)

    def subset(self, indices: list[int]) -> ScheduledBatch:
        """The batch of items[i] for i in `indices` (ascending), decodes still first."""
        return ScheduledBatch(items=[self.items[i] for i in indices],
                              num_decodes=sum(1 for i in indices if i < self.num_decodes),
                              samples=[self.samples[i] for i in indices],
                              first_admitted=sum(1 for i in indices if i < self.first_admitted),
                              drafts={j: self.drafts[i] for j, i in enumerate(indices) if i in self.drafts})


class Scheduler:
    """Owns the waiting queue and the running list; `schedule()` plans one step."""

    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 eos_token_ids: list[int] | tuple[int, ...] = (), max_model_len: int | None = None,
                 batch_max_num_seqs: int | None = None, batch_prefill_chunk: int | None = None):
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_model_len = max_model_len
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        # speculative.Speculator: drafts for the decodes (None: no speculation).
        self.speculator = None
        self.batch_max_num_seqs = batch_max_num_seqs or max_num_seqs
        self.batch_prefill_chunk = batch_prefill_chunk or max_num_batched_tokens

    def add(self, seq: Sequence) -> None:
        """Queue `seq`: an interactive one ahead of every queued low-priority one."""
        if seq.priority == 0 and self.waiting and self.waiting[-1].priority > 0:
            self.waiting.insert(next(i for i, s in enumerate(self.waiting) if s.priority > 0), seq)
        else:
            self.waiting.append(seq)

    def _chunk(self, seq: Sequence, budget: int) -> int:
        """Prompt tokens `seq` may compute this step within `budget`."""
        chunk = min(seq.num_uncomputed_tokens, budget)
        return min(chunk, self.batch_prefill_chunk) if seq.priority and chunk > 1 else chunk

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def num_running_requests(self) -> int:
        """Requests with a sequence in the running list: a beam search's live beams are one request."""
        return len({id(seq.beam) if seq.beam is not None else id(seq) for seq in self.running})

    def finish(self, seq: Sequence, reason: str) -> None:
        """End `seq` with `reason`, wherever it is, and free its blocks."""
        seq.finish_reason = reason
        seq.status = SequenceStatus.FINISHED
        seq.grammar = None  # the grammar matcher's memory goes with the request
        seq.penalty_counts = None
        running = seq in self.running
        if running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        # A running sequence's computed tokens have their K/V written (a failed one's may not): its partial
        # last block stays reusable (BlockManager's tail cache).
        self.block_manager.free(seq, keep_tail=running and reason != "error")

    def fail(self, seq: Sequence, exc: BaseException) -> Failed:
        """End `seq` with "error" because of `exc` (logged; its blocks are freed); returns its Failed event."""
        log.error("request %s failed in the engine and ends alone: %s", seq.request_id, exc,
                  exc_info=(type(exc), exc, exc.__traceback__))
        self.finish(seq, "error")
        return Failed(f"engine error: {exc}")

    def postprocess(self, batch: ScheduledBatch, result: RunResult) -> StepOutputs:
        """Apply one step's result: advance prefill progress, register full blocks in the prefix
        cache, record prompt logprobs, append sampled tokens and finish the sequences that end.

        Items whose sequence already ended this step (failed) are skipped; one whose update raises
        ends alone with Failed. Returns the events of every request that got any, in batch order.
        """
        outputs: StepOutputs = []
        now = time.monotonic()
        for i, (seq, n) in enumerate(batch.items):
            if seq.is_finished:
                continue
            try:
                events = self._apply(seq, n, result, i, now)
            except Exception as exc:  # this request's state alone is broken
                events = [self.fail(seq, exc)]
            if events:
                outputs.append((seq, events))
        return outputs

    def _apply(self, seq: Sequence, n: int, result: RunResult, i: int, now: float) -> list | None:
        start = seq.num_computed_tokens
        seq.num_computed_tokens += n
        self.block_manager.cache_full_blocks(seq)
        chunk = result.prompt_logprobs[i]
        if chunk is not None:
            if seq.prompt_logprobs is None:
                seq.prompt_logprobs = [None]
            if len(seq.prompt_logprobs) == start + 1:  # not a recompute after preemption
                seq.prompt_logprobs.extend(chunk)
        token = result.token_ids[i]
        if token is not None and seq.beam is not None:  # a beam's candidates; its group picks the tokens
            seq.beam_top = result.logprobs[i][1]
            return None
        return None if token is None else self.append_token(seq, token, result.logprobs[i], now)

    def append_token(self, seq: Sequence, token: int, logprobs: tuple | None, now: float) -> list:
        """The one place a sampled token joins a sequence, and where the sequence's end is decided."""
        if seq.grammar is not None and not seq.grammar.accept(token, seq.output_token_ids):
            self.finish(seq, "stop")  # a dead end: end without the refused token
            return [seq.finished_output()]
        seq.token_ids.append(token)
        if seq.first_token_time is None:
            seq.first_token_time = now
        events: list = [TokenEvent(token, logprobs)]
        reason = self._stop_reason(seq, token)
        if reason is not None:
            self.finish(seq, reason)
            events.append(seq.finished_output())
        return events

    def _stop_reason(self, seq: Sequence, token: int) -> str | None:
        p = seq.params
        if seq.grammar is not None and seq.grammar.finished:
            return "stop"
        if seq.num_output_tokens >= p.min_tokens:
            if not p.ignore_eos and token in self.eos_token_ids:
                return "stop"
            if token in p.stop_token_ids:
                return "stop"
            if p.repetition_detection is not None and repeats(seq.token_ids, seq.num_output_tokens,
                                                              p.repetition_detection):
                seq.stopped_by_repetition = True
                return "stop"
        if seq.num_output_tokens >= p.max_tokens or (
                self.max_model_len is not None and len(seq.token_ids) >= self.max_model_len):
            return "length"
        return None

    def _preempt(self, seq: Sequence, batch: ScheduledBatch) -> None:
        if seq.beam_top is not None:  # a beam waiting for its siblings needs no recompute: parked
            self._park(seq)
            return
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
        batch.preempted.append(seq)

    def _park(self, seq: Sequence) -> None:
        """Take a beam whose candidates are in off the running list and free its blocks; its group forks
        its children (waiting, recomputed) from it later."""
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        self.num_preemptions += 1

    def fork(self, parent: Sequence, token: int) -> Sequence:
        """A beam's child: `parent`'s tokens + `token`, its block table shared (BlockManager.fork) when it
        holds blocks, else none (it is recomputed, its full blocks from the prefix cache). Not yet placed
        in running or waiting (replace_beams)."""
        child = Sequence(parent.request_id, parent.prompt_token_ids, parent.params, deadline=parent.deadline,
                         token_ids=parent.token_ids + [token], arrival_time=parent.arrival_time,
                         cache_salt=parent.cache_salt, priority=parent.priority, sampling=parent.sampling,
                         lora=parent.lora, beam=parent.beam, num_cached_tokens=parent.num_cached_tokens)
        if parent.block_table:
            self.block_manager.fork(parent, child)
            child.status = SequenceStatus.RUNNING
        return child

    def replace_beams(self, parents: list[Sequence], children: list[tuple[Sequence, Sequence]]) -> None:
        """One selection of a beam group: each (parent, child) child takes its parent's place in the
        running list (one holding no blocks goes to the front of the queue), then every parent's blocks
        are released. The group's root stays unfinished (it is the request's handle)."""
        by_parent: dict[int, list[Sequence]] = {}
        for parent, child in children:
            by_parent.setdefault(id(parent), []).append(child)
        gone = {id(p) for p in parents}
        running: list[Sequence] = []
        for seq in self.running:
            if id(seq) in gone:
                running.extend(c for c in by_parent.get(id(seq), ()) if c.status is SequenceStatus.RUNNING)
            else:
                running.append(seq)
        placed = {id(c) for c in running}
        running.extend(c for _, c in children if c.status is SequenceStatus.RUNNING and id(c) not in placed)
        self.running = running
        for _, child in reversed(children):
            if child.status is SequenceStatus.WAITING:
                self.waiting.appendleft(child)
        for parent in parents:
            if parent in self.waiting:
                self.waiting.remove(parent)
            self.block_manager.free(parent)
            parent.beam_top = None
            if parent is not parent.beam.root:
                parent.status = SequenceStatus.FINISHED
                parent.finish_reason = "stop"

    def schedule(self) -> ScheduledBatch:
        """Plan one step. Raises nothing; a sequence that cannot fit waits."""
        batch = self._schedule()
        if not batch and self.waiting:
            idle = [s for s in self.running if s.beam_top is not None]
            if idle:  # beams waiting for siblings hold every block the queue needs: park them, try again
                for seq in idle:
                    self._park(seq)
                batch = self._schedule()
        batch.block_copies = self.block_manager.take_copies()
        batch.window_block_copies = self.block_manager.take_window_copies()
        return batch

    def _schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.max_num_batched_tokens
        bm = self.block_manager

        # Decodes first, oldest first; preempt the newest when blocks run short.
        decodes = [s for s in self.running if s.num_uncomputed_tokens == 1]
        for seq in decodes:
            if seq.status is not SequenceStatus.RUNNING or budget <= 0:
                continue
            while not bm.can_allocate(seq, len(seq.token_ids)):
                victim = self.running[-1]
                self._preempt(victim, batch)
                if victim is seq:
                    break
            if seq.status is not SequenceStatus.RUNNING:
                continue
            bm.allocate(seq, len(seq.token_ids))
            batch.items.append((seq, 1))
            batch.samples.append(True)
            budget -= 1
        batch.num_decodes = len(batch.items)
        if self.speculator is not None and self.speculator.enabled:
            budget = self._schedule_drafts(batch, budget)

        # Running sequences part-way through a chunked prefill; batch ones after the admission of
        # waiting interactive requests, which must not wait behind them.
        interactive_waiting = bool(self.waiting) and self.waiting[0].priority == 0
        deferred = []
        for seq in list(self.running):
            if budget <= 0:
                break
            if seq.status is SequenceStatus.RUNNING and seq.num_uncomputed_tokens > 1:
                if seq.priority and interactive_waiting:
                    deferred.append(seq)
                    continue
                budget = self._schedule_prefill(seq, budget, batch, may_preempt=True)

        # Admit waiting sequences while there is room, reusing cached prefix blocks. A sequence
        # whose next uncached block another sequence computes this step waits one step for it.
        batch.first_admitted = len(batch.items)
        pending = self._pending_hashes(batch)
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if seq.priority and sum(1 for s in self.running if s.priority) >= self.batch_max_num_seqs:
                break  # only low-priority work waits (interactive work is queued ahead of it)
            if not seq.block_table:
                h = bm.next_uncached_hash(seq)
                if h is not None and h in pending:
                    break
                reused = bm.match_prefix(seq)
                if seq.num_preemptions == 0:
                    seq.num_cached_tokens = reused
            chunk = self._chunk(seq, budget)
            if not bm.can_allocate(seq, seq.num_computed_tokens + chunk):
                bm.free(seq)
                break
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            budget = self._schedule_prefill(seq, budget, batch)
            pending |= self._pending_hashes(ScheduledBatch(items=[batch.items[-1]], num_decodes=0))
        for seq in deferred:
            if budget <= 0:
                break
            budget = self._schedule_prefill(seq, budget, batch, may_preempt=True)
        return batch

    def _schedule_drafts(self, batch: ScheduledBatch, budget: int) -> int:
        """Draft tokens for the step's decodes (speculative.Speculator.plan), each within the token
        budget and the free blocks (a draft never preempts). Returns the budget left."""
        bm = self.block_manager
        self.speculator.begin_plan(batch.num_decodes)
        for i, (seq, _) in enumerate(batch.items):
            if seq.status is not SequenceStatus.RUNNING:
                continue
            draft = self.speculator.plan(seq, batch.num_decodes, budget, self.max_model_len)
            need = len(seq.token_ids) + len(draft)
            if draft and bm.can_allocate(seq, need):
                bm.allocate(seq, need)
                batch.drafts[i] = draft
                budget -= len(draft)
        return budget

    def _pending_hashes(self, batch: ScheduledBatch) -> set[int]:
        """Hashes of the first full block each prefill in `batch` completes (for deferral)."""
        bm = self.block_manager
        if not bm.enable_prefix_caching:
            return set()
        out = set()
        for seq, n in batch.items[batch.num_decodes:]:
            index = seq.num_computed_tokens // bm.block_size
            if (index + 1) * bm.block_size <= seq.num_computed_tokens + n:
                out.add(bm.block_hash_at(seq, index))
        return out

    def _schedule_prefill(self, seq: Sequence, budget: int, batch: ScheduledBatch,
                          may_preempt: bool = False) -> int:
        chunk = self._chunk(seq, budget)
        target = seq.num_computed_tokens + chunk
        bm = self.block_manager
        scheduled = {id(s) for s, _ in batch.items}
        while may_preempt and not bm.can_allocate(seq, target):
            newer = self.running[self.running.index(seq) + 1:] if seq in self.running else []
            victims = [s for s in newer if id(s) not in scheduled]
            if not victims:
                break
            self._preempt(victims[-1], batch)
        if chunk <= 0 or not bm.can_allocate(seq, target):
            return budget
        bm.allocate(seq, target)
        batch.items.append((seq, chunk))
        batch.samples.append(target == len(seq.token_ids))
        return budget - chunk
