"""LLMEngine: the step loop, schedule -> run -> postprocess. Single-threaded; async_engine drives it."""
from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import torch

from .beam_search import BeamGroup, check_beam_request
from .block_manager import BlockManager
from .hybrid_block_manager import HybridBlockManager
from .kv_events import KVCacheEvent, KVEventRecorder, sequence_salt
from .config import ConfigError, EngineConfig
from .grammar_state import grammar_state_for
from .layers.lora import LoraSlots
from .lora import LoraAdapter
from .model_folder import ModelFolder
from .model_runner import ModelRunner, RunResult
from .models.loader import load_model
from .outputs import Failed, RequestRejected
from .penalties import PenaltyCounts, penalties_on
from .reasoning import ReasoningTracker
from .request import EngineRequest
from .sampling_state import SamplingState
from .scheduler import ScheduledBatch, Scheduler, StepOutputs
from .sequence import Sequence
from .core_share import ThreadTeam
from .speculative import Speculator
from .verify import verify_drafts
from .stats import EngineStats

log = logging.getLogger("metrale.engine")


def resolve_device(name: str) -> torch.device:
    """'auto' -> cuda when available, else cpu."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """'auto' -> float32 on CPU (no bf16 arithmetic on these CPUs), bfloat16 on CUDA."""
    if name == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    return getattr(torch, name)


def available_memory_bytes(device: torch.device) -> int:
    """Free memory for the KV pool: CUDA's free device memory, else /proc/meminfo's MemAvailable."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 4 << 30


def solo_step(batch: ScheduledBatch, max_tokens: int) -> bool:
    """Whether `batch` runs on one thread (core_share.ThreadTeam.adjust's `alone`): a step that only
    prefills, at most `max_tokens` prompt tokens (EngineConfig.solo_step_tokens: a prompt's uncached tail
    of a token or two), where a second thread would add more CPU than the wall time it saves. A step
    with a decode in it keeps the team: it belongs to a running batch, whose TPOT the team sets."""
    return batch.num_decodes == 0 and batch.num_tokens <= max_tokens


class LLMEngine:
    """Loads the model and runs steps. Not thread-safe: one thread owns it (async_engine's loop).

    kv_events: called on the stepping thread with each step's prefix-cache events (kv_events.py), once
    per step that has any (None: none are recorded)."""

    def __init__(self, config: EngineConfig, kv_events: Callable[[list[KVCacheEvent]], None] | None = None):
        self.config = config
        self.kv_events = kv_events
        # The full-attention pool's changes (a window pool's blocks are not announced: vLLM's routers score
        # full attention only).
        self.kv_recorder = KVEventRecorder() if kv_events is not None else None
        path = Path(config.model_path)
        folder = ModelFolder.read(path)
        self.model_config = folder.model_config
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        # The threads of every parallel region the stepping thread starts (core_share.py): sized here
        # and before every step, on whichever thread steps.
        self.team = ThreadTeam(config.num_threads, adaptive=config.adaptive_threads)
        log.info("engine threads: %s%s", self.team.cap.describe(),
                 ", fewer while other processes keep cores busy" if config.adaptive_threads else "")
        self.max_model_len = min(config.max_model_len or self.model_config.max_position_embeddings,
                                 self.model_config.max_position_embeddings)
        self.eos_token_ids = folder.eos_token_ids
        model = load_model(path, self.model_config, self.dtype, self.device, weights=config.weights,
                           prefill=config.prefill_weights)
        kv_dtype = self.dtype if config.kv_cache_dtype == "auto" else getattr(torch, config.kv_cache_dtype)
        self.kv_dtype = kv_dtype
        cfg, bs = self.model_config, config.block_size
        n_window = sum(cfg.is_sliding(i) for i in range(cfg.num_hidden_layers))
        hybrid = config.window_pool and 0 < n_window < cfg.num_hidden_layers
        block_bytes = ModelRunner.kv_bytes_per_block(cfg, bs, kv_dtype, cfg.num_hidden_layers - n_window * hybrid)
        window_block_bytes = ModelRunner.kv_bytes_per_block(cfg, bs, kv_dtype, n_window) if hybrid else 0
        # What one token of context costs in the KV cache, every layer's K and V; with a window pool, the
        # full layers' (window_kv_bytes_per_token more while the token is inside the window). Logged.
        self.kv_bytes_per_token = block_bytes // bs
        self.window_kv_bytes_per_token = window_block_bytes // bs
        # The window layers never hold more than each running sequence's window and a step's chunk.
        window_cap = (config.max_num_seqs * (-(-(cfg.sliding_window or 0) // bs) + 1)
                      + -(-config.max_num_batched_tokens // bs))
        budget = config.kv_cache_bytes or min(
            int(available_memory_bytes(self.device) * config.kv_cache_fraction),
            block_bytes * config.max_num_seqs * -(-self.max_model_len // bs) + window_block_bytes * window_cap)
        num_blocks = max(1, budget // (block_bytes + window_block_bytes))
        window_blocks = None
        if hybrid:
            if num_blocks > window_cap:
                num_blocks = max(1, (budget - window_cap * window_block_bytes) // block_bytes)
            window_blocks = min(num_blocks, window_cap)
            self.block_manager = HybridBlockManager(
                BlockManager(num_blocks, bs, config.enable_prefix_caching, kv_events=self.kv_recorder),
                BlockManager(window_blocks, bs, config.enable_prefix_caching, table="window_table",
                             hashed="num_window_hashed_blocks"), cfg.sliding_window)
        else:
            self.block_manager = BlockManager(num_blocks, bs, config.enable_prefix_caching,
                                              kv_events=self.kv_recorder)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, config.max_num_batched_tokens,
                                   self.eos_token_ids, self.max_model_len,
                                   batch_max_num_seqs=config.batch_max_num_seqs,
                                   batch_prefill_chunk=config.batch_prefill_chunk)
        self.runner = ModelRunner(model, self.model_config, num_blocks, config.block_size, self.device, kv_dtype,
                                  self.eos_token_ids, window_blocks=window_blocks,
                                  logprobs_mode=config.logprobs_mode)
        # Drafts are verified bitwise only where decode rows are batch-invariant (the compiled layers).
        self.speculator = Speculator(config.speculative_config(), exact=self.runner.fused is not None)
        self.scheduler.speculator = self.speculator
        self.loras = LoraSlots(model, config.max_loras, self.runner.fused) if config.max_loras else None
        self.runner.lora = self.loras
        self.step_log: deque[tuple[int, int, int]] = deque(maxlen=10000)
        # Where step time goes, in seconds summed over all steps (see bench's per-step report).
        self.phase_s = dict.fromkeys(("schedule", "prepare", "forward", "sample", "postprocess"), 0.0)
        self.num_steps = 0
        # What the engine did, for /metrics and the dashboard (written here only, read anywhere).
        self.stats = EngineStats(self.max_model_len, config.enable_prefix_caching)
        self.stats.spec_decode_enabled = self.speculator.enabled
        self.speculator.observe = self.stats.record_spec_decode
        self.weight_bytes = model.weight_bytes()
        log.info("engine ready: %s on %s in %s, weights %s (%s; %.1f MB resident), %d KV blocks of %d tokens in %s "
                 "(%.0f MiB; %d B of KV a token%s)", path.name, self.device, str(self.dtype).removeprefix("torch."),
                 config.weights, ", ".join(f"{n} {fmt}" for fmt, n in model.weight_formats.items()),
                 self.weight_bytes / 1e6, num_blocks, config.block_size, str(kv_dtype).removeprefix("torch."),
                 self.runner.kv_pool.nbytes / 2**20, self.kv_bytes_per_token,
                 f", {self.window_kv_bytes_per_token} B more inside the {cfg.sliding_window}-token window of "
                 f"{n_window} layers, which keep {window_blocks} blocks of their own" if hybrid else "")

    @property
    def max_request_tokens(self) -> int:
        """The most tokens (prompt + completion) one request may hold: the context length, or the
        KV pool's size when that is smaller (a request needing more than the pool never runs)."""
        return min(self.max_model_len, self.block_manager.num_blocks * self.block_manager.block_size)

    def check_fits(self, num_prompt_tokens: int, max_tokens: int) -> None:
        """The engine's one fit rule. Raises RequestRejected for an empty prompt, or when prompt +
        max_tokens exceed the context length or the KV pool."""
        if num_prompt_tokens == 0:
            raise RequestRejected("the prompt is empty")
        need = num_prompt_tokens + max_tokens
        if need > self.max_model_len:
            raise RequestRejected(
                f"this model's maximum context length is {self.max_model_len} tokens; the request has "
                f"{num_prompt_tokens} prompt tokens and asks for up to {max_tokens} more")
        pool_tokens = self.block_manager.num_blocks * self.block_manager.block_size
        if need > pool_tokens:
            raise RequestRejected(f"the request needs {need} tokens of KV cache; the pool holds {pool_tokens}")

    def add_request(self, request: EngineRequest, deadline: float | None = None,
                    request_id: str | None = None, arrival_time: float | None = None) -> Sequence:
        """Queue a request (its id: request_id, else request.request_id), with its parameters
        converted to what every step uses (SamplingParams.for_engine, SamplingState, its
        generator, penalty counts, reasoning tracker and grammar state), so that a value no step
        could use fails here, for this request alone.

        deadline: a time.monotonic() instant after which the request ends with "timeout".
        arrival_time: the time.monotonic() instant it was submitted (default: now); TTFT, queue
        and e2e times count from it.
        Raises RequestRejected when it can never fit (check_fits), a token id is outside the vocabulary, or a
        parameter cannot be used.
        """
        self.check_fits(len(request.prompt_token_ids), request.params.max_tokens)
        # The serving layer refuses such ids with a 400; here they would index past the embedding rows and
        # the compiled kernels' tables (a crash of the process, not of the request).
        vocab = self.model_config.vocab_size
        for name, ids in (("prompt", request.prompt_token_ids), ("prediction", request.prediction_token_ids or ())):
            if ids and (min(ids) < 0 or max(ids) >= vocab):
                raise RequestRejected(f"a {name} token id is outside the vocabulary [0, {vocab})")
        if request.beam is not None and request.beam.width > self.config.max_num_seqs:
            raise RequestRejected(f"a beam width of {request.beam.width} exceeds the engine's "
                                  f"{self.config.max_num_seqs} sequences (max_num_seqs)")
        rid = request_id or request.request_id or "req"
        try:
            seq = self._admit(request, rid, deadline)
        except RequestRejected:
            raise
        except Exception as exc:
            raise RequestRejected(f"the request's parameters cannot be used: {exc}") from exc
        if arrival_time is not None:
            seq.arrival_time = arrival_time
        self.stats.record_arrival(seq, seq.arrival_time)
        self.scheduler.add(seq)
        return seq

    def add_lora(self, adapter: LoraAdapter, replace: bool = False) -> None:
        """Make a LoRA adapter (lora.load_adapter) resident for new requests naming it; with `replace`,
        the adapter loaded under its name keeps serving its requests in flight and then goes.
        Raises ValueError when adapters are off (max_loras 0), the name is loaded and not
        `replace`, or every slot is taken."""
        if self.loras is None:
            raise ValueError("LoRA adapters are off (METRALE_MAX_LORAS is 0)")
        self.collect_loras()
        self.loras.add(adapter, replace)

    def remove_lora(self, name: str) -> None:
        """New requests can no longer name `name`; its slot is freed once its requests in flight end.
        Raises KeyError for a name that is not loaded."""
        if self.loras is None or name not in self.loras.by_name:
            raise KeyError(name)
        self.loras.remove(name)
        self.collect_loras()

    def collect_loras(self) -> None:
        """Free the slots of removed adapters that no waiting or running sequence uses."""
        if self.loras is not None and self.loras.retired:
            live = self.scheduler.running + list(self.scheduler.waiting)
            live += [beam for seq in live if seq.beam is not None for beam in seq.beam.seqs]  # parked beams too
            self.loras.collect({seq.lora.slot for seq in live if seq.lora is not None})

    def _lora_for(self, name: str | None) -> LoraAdapter | None:
        if name is None:
            return None
        adapter = self.loras.by_name.get(name) if self.loras is not None else None
        if adapter is None:
            raise RequestRejected(f"the LoRA adapter {name!r} is not loaded")
        return adapter

    def _admit(self, request: EngineRequest, rid: str, deadline: float | None) -> Sequence:
        vocab_size = self.model_config.vocab_size
        params = request.params.for_engine(vocab_size)
        lora = self._lora_for(request.lora_name)
        # The adapter (this load of it) is part of the prefix-cache key: its KV is its own.
        salt = sequence_salt(request.cache_salt, None if lora is None else lora.uid)
        seq = Sequence(rid, list(request.prompt_token_ids), params, deadline=deadline, cache_salt=salt,
                       priority=request.priority, lora=lora)
        if params.seed is not None:
            seq.generator = torch.Generator().manual_seed(params.seed)
        device = self.runner.device
        seq.sampling = SamplingState.build(params, vocab_size, self.eos_token_ids, device)
        if penalties_on(params):
            seq.penalty_counts = PenaltyCounts(seq, vocab_size, device)
        if params.reasoning is not None:
            seq.reasoning = ReasoningTracker(params.reasoning)
        seq.grammar = grammar_state_for(params, rid, seq.reasoning)
        seq.spec = self.speculator.state_for(request.prediction_token_ids)
        if request.beam is not None:  # its beams are forks of this sequence, one decode row each
            check_beam_request(request.beam, params)
            seq.spec = None
            seq.beam = BeamGroup(seq, request.beam)
        return seq

    def abort(self, seq: Sequence, reason: str = "cancelled") -> None:
        """End a sequence now (cancel, timeout, error); its blocks return to the pool (a beam search's:
        every live beam's too)."""
        if not seq.is_finished:
            if seq.beam is not None:
                seq.beam.end(self.scheduler, reason)
            else:
                self.scheduler.finish(seq, reason)
            try:
                self.stats.record_finished(seq)
            except Exception:  # metrics never fail an abort
                log.exception("recording the end of %s failed", seq.request_id)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def reset_prefix_cache(self) -> int:
        """Forget the prefix cache's blocks that no running request holds (BlockManager.reset_prefix_cache)
        and hand the change to `kv_events` at once (no step may follow soon). Returns how many cached blocks
        were forgotten. Between steps only: AsyncEngine.reset_prefix_cache runs it on the engine's thread."""
        dropped = self.block_manager.reset_prefix_cache()
        if self.kv_recorder is not None and self.kv_recorder.events:
            self._publish_kv_events()
        return dropped

    def step(self) -> StepOutputs:
        """One step: schedule -> run -> postprocess. Returns each request's events of this step
        (the TokenEvent / Finished objects its handle receives), in batch order. The step's prefix-cache
        changes go to `kv_events` once it ends, however it ends."""
        try:
            return self._step()
        finally:
            if self.kv_recorder is not None and self.kv_recorder.events:
                self._publish_kv_events()

    def _publish_kv_events(self) -> None:
        try:
            self.kv_events(self.kv_recorder.take())
        except Exception:  # a listener never ends a step
            log.exception("publishing engine step %d's KV cache events failed", self.num_steps)

    def _step(self) -> StepOutputs:
        t0 = time.perf_counter()
        self.speculator.start_step()
        batch = self.scheduler.schedule()
        if not batch:
            return []
        self.team.adjust(alone=solo_step(batch, self.config.solo_step_tokens))
        t1 = time.perf_counter()
        self._log_step(batch)
        if batch.block_copies or batch.window_block_copies:
            self.runner.copy_blocks(batch.block_copies, batch.window_block_copies)
        result, failed = self._run(batch)
        t2 = time.perf_counter()
        outputs = [(seq, [self.scheduler.fail(seq, exc)]) for seq, exc in failed]
        outputs += self.scheduler.postprocess(batch, result)
        verify_drafts(self.scheduler, self.runner.sampler, self.speculator, batch, result, outputs)
        outputs = self._advance_beams(batch, outputs)
        if not failed and batch.num_decodes == len(batch.items):  # the gate's cost fit: decode steps only
            self.speculator.end_step(batch.num_tokens + sum(map(len, batch.drafts.values())), batch.num_decodes)
        self.collect_loras()
        self._time_step(t1 - t0, time.perf_counter() - t2)
        self._record_stats(batch, outputs)
        return outputs

    def _advance_beams(self, batch: ScheduledBatch, outputs: StepOutputs) -> StepOutputs:
        """The beam searches this step touched: a group whose live beams all have their candidates
        selects its next beams (BeamGroup.advance); one whose beam failed, or whose selection raises,
        ends Failed alone. Beams' own events are replaced by their root's (its Finished or Failed)."""
        groups = {id(seq.beam): seq.beam for seq, _ in batch.items if seq.beam is not None}
        if not groups:
            return outputs
        failures = {id(seq.beam): ev for seq, events in outputs if seq.beam is not None
                    for ev in events if isinstance(ev, Failed)}
        kept = [(seq, events) for seq, events in outputs if seq.beam is None]
        now = time.monotonic()
        for key, group in groups.items():
            if key in failures:
                kept.append(group.fail(self.scheduler, failures[key].message))
                continue
            if group.root.is_finished or not group.ready():
                continue
            try:
                decoded = len(group.seqs)  # beams that decoded a row this step: a token each
                out = group.advance(self.scheduler, now)
                self._record_beam_step(group.root, decoded, now)
            except Exception as exc:  # this search's state alone is broken
                log.exception("beam search %s failed in the engine and ends alone", group.root.request_id)
                out = group.fail(self.scheduler, f"engine error: {exc}")
            if out is not None:
                kept.append(out)
        return kept

    def _record_beam_step(self, root: Sequence, decoded: int, now: float) -> None:
        """A beam search's step: `decoded` beams each generated a token (never sent: its group picks)."""
        try:
            self.stats.record_beam_step(root, decoded, now)
        except Exception:  # metrics never end a step
            log.exception("recording beam search %s's step failed", root.request_id)

    def _record_stats(self, batch: ScheduledBatch, outputs: StepOutputs) -> None:
        # Metrics never end a step: a bug in them is logged, the requests go on.
        try:
            self.stats.record_step(batch, outputs)
        except Exception:
            log.exception("recording engine step %d's stats failed", self.num_steps)

    def _run(self, batch: ScheduledBatch) -> tuple[RunResult, list[tuple[Sequence, Exception]]]:
        """Run the batch; if that raises, find the items that make it raise and run the others.

        A failed attempt is retried without the step's newest admissions, then by halves, down to
        the single items that fail alone (those are returned with their exception). The seeded
        generators are put back before each retry, so a retried request draws exactly what it
        would have drawn; the KV slots a failed attempt wrote are written again by the retry.
        Returns the merged result (aligned with batch.items) and the failed items' sequences.
        """
        saved = {id(seq): seq.generator.get_state() for (seq, _), samples in zip(batch.items, batch.samples)
                 if samples and seq.generator is not None and not seq.params.greedy}
        try:
            return self.runner.execute(batch), []
        except Exception as exc:
            log.warning("engine step %d failed (%s); retrying it to find the request(s) that cause it",
                        self.num_steps, exc)
        n = len(batch.items)
        merged = RunResult([None] * n, [None] * n, [None] * n)
        failed: list[tuple[Sequence, Exception]] = []
        cut = batch.first_admitted if 0 < batch.first_admitted < n else n // 2
        todo = [part for part in (list(range(cut, n)), list(range(cut))) if part]
        while todo:
            indices = todo.pop()
            self._restore_generators(batch, indices, saved)
            try:
                part = self.runner.execute(batch.subset(indices))
            except Exception as exc:
                if len(indices) == 1:
                    failed.append((batch.items[indices[0]][0], exc))
                else:
                    half = len(indices) // 2
                    todo += [indices[half:], indices[:half]]
                continue
            for j, i in enumerate(indices):
                merged.token_ids[i] = part.token_ids[j]
                merged.logprobs[i] = part.logprobs[j]
                merged.prompt_logprobs[i] = part.prompt_logprobs[j]
                for mine, theirs in ((merged.draft_logits, part.draft_logits),
                                     (merged.draft_samples, part.draft_samples)):
                    if j in theirs:
                        mine[i] = theirs[j]
        return merged, failed

    @staticmethod
    def _restore_generators(batch: ScheduledBatch, indices: list[int], saved: dict) -> None:
        for i in indices:
            seq = batch.items[i][0]
            if id(seq) in saved:
                seq.generator.set_state(saved[id(seq)])

    def _log_step(self, batch) -> None:
        self.num_steps += 1
        self.step_log.append((batch.num_decodes, len(batch.items) - batch.num_decodes, batch.num_tokens))
        if self.config.step_log:
            log.info("step %d: seqs=%d decodes=%d prefill_tokens=%d", self.num_steps, len(batch.items),
                     batch.num_decodes, batch.num_tokens - batch.num_decodes)

    def _time_step(self, schedule_s: float, postprocess_s: float) -> None:
        """Add one step's seconds to phase_s: schedule, the runner's prepare / forward / sample, postprocess."""
        phases = self.phase_s
        phases["schedule"] += schedule_s
        for name, seconds in self.runner.last_phase_s.items():
            phases[name] += seconds
        phases["postprocess"] += postprocess_s


__all__ = ["LLMEngine", "RequestRejected", "ConfigError"]
