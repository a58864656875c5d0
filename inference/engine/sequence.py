"""Sequence: one request's token ids, status, block table and counters."""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from .outputs import Finished
from .sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Sequence:
    """One generation: prompt + output token ids and the engine's bookkeeping for it.

    num_computed_tokens: tokens whose K/V are in the cache (prefill progress).
    block_table: KV block ids in token order. finish_reason: None while running,
    then stop, length, cancelled, timeout or error. Times are time.monotonic() seconds.
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    deadline: float | None = None
    token_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    arrival_time: float = field(default_factory=time.monotonic)
    first_token_time: float | None = None
    num_preemptions: int = 0
    # Prompt tokens whose K/V came from the prefix cache at admission (usage's cached_tokens).
    num_cached_tokens: int = 0
    # Leading blocks of block_table already registered in the prefix cache.
    num_hashed_blocks: int = 0
    # (chained hash, token ids) of each full block of token_ids, in order: each hashed once, after the
    # block fills (block_manager.BlockManager.full_blocks); token ids only grow, so entries stay true.
    full_blocks: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)
    # The sliding-window layers' own block table and its hashed count, where those layers keep only
    # their window's blocks (hybrid_block_manager.py); released entries are BlockManager.NO_BLOCK.
    window_table: list[int] = field(default_factory=list)
    num_window_hashed_blocks: int = 0
    # Prefix-cache salt: blocks are shared only between sequences with the same salt (the tenant).
    cache_salt: str = ""
    # EngineRequest.priority: 0 interactive; above 0 (batch work) waits behind interactive work.
    priority: int = 0
    # grammar_state.GrammarState while params.structured is set and the sequence runs; None once it ends.
    grammar: object = None
    generator: object = None
    # sampling_state.SamplingState: built at admission.
    sampling: object = None
    # penalties.PenaltyCounts while a repetition, presence or frequency penalty is on.
    penalty_counts: object = None
    # Filled during prefill when params.prompt_logprobs is set: one entry per prompt token.
    prompt_logprobs: list | None = None
    # reasoning.ReasoningTracker while params.reasoning is set: the budget and the grammar read this one.
    reasoning: object = None
    # lora.LoraAdapter the sequence runs with (resident in a slot), or None for the base model.
    lora: object = None
    # speculative.SpecState while the engine may draft for it (None: it decodes one token a step).
    spec: object = None
    # The output ended in a repeated pattern (repetition.py): finish_reason "stop", metrics' "repetition".
    stopped_by_repetition: bool = False
    # beam_search.BeamGroup of a beam-search request: set on its root (the request's sequence) and on every
    # live beam's sequence. beam_top: this beam's next-token candidates [(token id, logprob)] once its
    # row ran, until the group selects the next beams (the sequence then computes nothing).
    beam: object = None
    beam_top: list | None = None

    def __post_init__(self):
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_token_ids):]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def finished_output(self) -> Finished:
        """The Finished event of this sequence as it ends now (finish_reason set by the scheduler)."""
        ttft = self.first_token_time - self.arrival_time if self.first_token_time is not None else None
        return Finished(self.finish_reason or "stop", self.num_prompt_tokens, self.num_output_tokens, ttft,
                        time.monotonic() - self.arrival_time, self.num_cached_tokens, self.prompt_logprobs,
                        repetition=self.stopped_by_repetition,
                        beams=self.beam.search.best() if self.beam is not None and self.beam.root is self else None)
