"""EngineRequest: the one request type the engine takes (prompt, sampling params, deadline, cache salt). No torch."""
from __future__ import annotations

from dataclasses import dataclass

from .beam_search import BeamSpec
from .sampling_params import SamplingParams

# EngineRequest.priority of a batch line (the Batch API): after interactive requests.
BATCH_PRIORITY = 1


@dataclass(slots=True)
class EngineRequest:
    """One generation for the engine to run.

    prompt_token_ids: the prompt's token ids (non-empty). params: every sampling control.
    request_id: the id logs and the step log name it by (None: the engine picks one).
    timeout_s: seconds from submission after which it ends with finish reason "timeout"
    (None: no deadline). cache_salt: prefix-cache blocks are shared only between requests with
    the same salt (the tenant's), so one tenant's cached prompt never serves another.
    lora_name: the resident LoRA adapter to run with (None: the base model).
    prediction_token_ids: a Predicted Output's token ids (OpenAI's `prediction`): the engine
    drafts from them (speculative.py); the output is what it would be without them.
    priority: 0 for interactive work; higher values (batch lines: BATCH_PRIORITY) are admitted
    after every waiting interactive request, capped in number and in prefill chunk size
    (EngineConfig.batch_max_num_seqs, batch_prefill_chunk).
    beam: a beam search (beam_search.py) instead of one generation: params are then temperature 0,
    max_tokens the search's steps, logprobs at least 2 * width, stop_token_ids the tokens that end a
    beam; the Finished event carries the n best beams.
    """

    prompt_token_ids: list[int]
    params: SamplingParams
    request_id: str | None = None
    timeout_s: float | None = None
    cache_salt: str = ""
    lora_name: str | None = None
    prediction_token_ids: list[int] | None = None
    priority: int = 0
    beam: BeamSpec | None = None

    @property
    def num_tokens_needed(self) -> int:
        """The most KV slots it can ever hold: prompt tokens + max_tokens."""
        return len(self.prompt_token_ids) + self.params.max_tokens
