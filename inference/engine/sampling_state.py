"""SamplingState: what the sampler needs of one request beyond its params, built once when the engine admits it."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(slots=True)
class SamplingState:
    """One sequence's sampling controls as tensors and id lists (Sequence.sampling).

    banned_ids: EOS (unless ignore_eos) and stop_token_ids inside the vocabulary, masked until
    min_tokens tokens exist. bias_ids int64 [n] / bias_values float32 [n]: logit_bias inside the
    vocabulary (None when there is none).
    """

    banned_ids: list[int]
    bias_ids: torch.Tensor | None = None
    bias_values: torch.Tensor | None = None

    @classmethod
    def build(cls, params, vocab_size: int, eos_token_ids, device: torch.device) -> SamplingState:
        """The state of a request with `params` (SamplingParams) on a vocabulary of vocab_size tokens.

        Raises ValueError for a DRY base the penalty cannot use (it takes its logarithm).
        """
        if params.dry_multiplier > 0:
            math.log(params.dry_base)
        banned = [t for t in (*(() if params.ignore_eos else eos_token_ids), *params.stop_token_ids)
                  if 0 <= t < vocab_size]
        state = cls(banned)
        bias = {t: v for t, v in (params.logit_bias or {}).items() if 0 <= t < vocab_size}
        if bias:
            state.bias_ids = torch.tensor(list(bias), dtype=torch.long, device=device)
            state.bias_values = torch.tensor(list(bias.values()), dtype=torch.float32, device=device)
        return state


def sampling_state(seq, vocab_size: int, eos_token_ids, device: torch.device) -> SamplingState:
    """The sequence's SamplingState (built here when the engine did not admit it: direct sampler use)."""
    if seq.sampling is None:
        seq.sampling = SamplingState.build(seq.params, vocab_size, eos_token_ids, device)
    return seq.sampling
