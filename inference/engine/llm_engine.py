"""LLMEngine: the step loop, schedule -> run -> postprocess. Single-threaded; async_engine drives it."""
from __future__ import annotations

import logging
import time
from collections import deque
from pathlib import Path

import torch

from .block_manager import BlockManager
from .config import ConfigError, EngineConfig
from .grammar_state import grammar_state_for
from .model_folder import ModelFolder
from .model_runner import ModelRunner
from .outputs import RequestRejected
from .models.loader import load_model
from .reasoning import ReasoningTracker
from .request import EngineRequest
from .scheduler import Scheduler, StepOutputs
from .sequence import Sequence

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


class LLMEngine:
    """Loads the model and runs steps. Not thread-safe: one thread owns it (async_engine's loop)."""

    def __init__(self, config: EngineConfig):
        self.config = config
        path = Path(config.model_path)
        folder = ModelFolder.read(path)
        self.model_config = folder.model_config
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        self.max_model_len = min(config.max_model_len or self.model_config.max_position_embeddings,
                                 self.model_config.max_position_embeddings)
        self.eos_token_ids = folder.eos_token_ids
        model = load_model(path, self.model_config, self.dtype, self.device,
                           int8_decode=config.decode_weights == "int8",
                           int8_prefill=config.prefill_weights == "int8")
        kv_dtype = self.dtype if config.kv_cache_dtype == "auto" else getattr(torch, config.kv_cache_dtype)
        block_bytes = ModelRunner.kv_bytes_per_block(self.model_config, config.block_size, kv_dtype)
        budget = config.kv_cache_bytes or min(
            int(available_memory_bytes(self.device) * config.kv_cache_fraction),
            block_bytes * config.max_num_seqs * -(-self.max_model_len // config.block_size))
        num_blocks = max(1, budget // block_bytes)
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, config.max_num_batched_tokens,
                                   self.eos_token_ids, self.max_model_len)
        self.runner = ModelRunner(model, self.model_config, num_blocks, config.block_size, self.device, kv_dtype,
                                  self.eos_token_ids)
        self.step_log: deque[tuple[int, int, int]] = deque(maxlen=10000)
        # Where step time goes, in seconds summed over all steps (see bench's per-step report).
        self.phase_s = dict.fromkeys(("schedule", "prepare", "forward", "sample", "postprocess"), 0.0)
        self.num_steps = 0
        log.info("engine ready: %s on %s in %s, %d KV blocks of %d tokens (%.0f MiB)", path.name, self.device,
                 str(self.dtype).removeprefix("torch."), num_blocks, config.block_size, num_blocks * block_bytes / 2**20)

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
                    request_id: str | None = None) -> Sequence:
        """Queue a request (its id: request_id, else request.request_id). Raises RequestRejected
        when it can never fit (check_fits).

        deadline: a time.monotonic() instant after which the request ends with "timeout".
        """
        params = request.params
        self.check_fits(len(request.prompt_token_ids), params.max_tokens)
        rid = request_id or request.request_id or "req"
        seq = Sequence(rid, list(request.prompt_token_ids), params, deadline=deadline,
                       cache_salt=request.cache_salt)
        if params.seed is not None:
            seq.generator = torch.Generator().manual_seed(params.seed)
        if params.reasoning is not None:
            seq.reasoning = ReasoningTracker(params.reasoning)
        seq.grammar = grammar_state_for(params, rid, seq.reasoning)
        self.scheduler.add(seq)
        return seq

    def abort(self, seq: Sequence, reason: str = "cancelled") -> None:
        """End a sequence now (cancel, timeout, error); its blocks return to the pool."""
        if not seq.is_finished:
            self.scheduler.finish(seq, reason)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> StepOutputs:
        """One step: schedule -> run -> postprocess. Returns each request's events of this step
        (the TokenEvent / Finished objects its handle receives), in batch order."""
        t0 = time.perf_counter()
        batch = self.scheduler.schedule()
        if not batch:
            return []
        t1 = time.perf_counter()
        self._log_step(batch)
        result = self.runner.execute(batch)
        t2 = time.perf_counter()
        outputs = self.scheduler.postprocess(batch, result)
        self._time_step(t1 - t0, time.perf_counter() - t2)
        return outputs

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
